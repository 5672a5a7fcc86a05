"""Find the few interesting lines of a large log fast: a multi-literal search.

A training log is mostly progress bars, loss dicts and INFO lines. The detailed
rules only need to see lines that contain one of a few literals (derived from the
rules, see literals.py). Hyperscan finds those at several GB/s. Where it is not
installed, each literal is looked for with `bytes.find` and its next occurrence
remembered, which is some 50 times slower but still linear (an alternation of
hundreds of literals in Python's `re` is slower again by twenty).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from typing import Any, Protocol

from .literals import Literal

hyperscan: Any
try:
    import hyperscan

    HAVE_HYPERSCAN = True
except ImportError:  # pragma: no cover - depends on the platform's wheels
    hyperscan = None
    HAVE_HYPERSCAN = False

Buffer = bytes | bytearray

ENGINES = ("auto", "hyperscan", "python")


class Search(Protocol):
    """Successive searches over one buffer, with increasing start offsets."""

    def next(self, start: int, stop: int) -> int | None: ...


def reduce_literals(literals: Iterable[Literal]) -> list[Literal]:
    """Drop literals that contain another one: wherever they occur, so does the other."""
    unique = sorted({(lit.text, lit.caseless) for lit in literals if lit.text})
    candidates = [Literal(text, caseless) for text, caseless in unique]

    def covers(short: Literal, long: Literal) -> bool:
        if short is long:
            return False
        if short.caseless:
            return short.text.lower() in long.text.lower()
        return not long.caseless and short.text in long.text

    return [lit for lit in candidates if not any(covers(other, lit) for other in candidates)]


class Prefilter:
    """Offsets in a buffer where a line worth a detailed look may be.

    `over(buffer).next(start, stop)` (or `search(buffer, start, stop)`) gives the
    end offset of the first literal or regex match in buffer[start:stop], or None.
    With `everything=True` (a rule whose literals are unknown) every line is a
    candidate.
    """

    def __init__(
        self,
        literals: Iterable[Literal] = (),
        *,
        regexes: Iterable[bytes] = (),
        everything: bool = False,
        engine: str = "auto",
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"prefilter engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if engine == "hyperscan" and not HAVE_HYPERSCAN:
            raise RuntimeError("hyperscan is not installed")
        self.literals = reduce_literals(literals)
        #: Plain regexes (bytes, no flags) searched beside the literals.
        self.regexes = list(regexes)
        self.everything = everything or not (self.literals or self.regexes)
        use_hyperscan = engine == "hyperscan" or (engine == "auto" and HAVE_HYPERSCAN)
        self.engine = "all-lines" if self.everything else ("hyperscan" if use_hyperscan else "python")
        self._database: Any = None
        self._scratch: Any = None
        self._regex: re.Pattern[bytes] | None = None
        if self.engine == "hyperscan":
            self._compile_hyperscan()
        elif self.regexes:
            self._regex = re.compile(b"|".join(self.regexes))

    def _compile_hyperscan(self) -> None:
        expressions = [re.escape(lit.text.encode("utf-8")) for lit in self.literals] + self.regexes
        flags = [hyperscan.HS_FLAG_CASELESS if lit.caseless else 0 for lit in self.literals]
        flags += [0] * len(self.regexes)
        database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        database.compile(
            expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
        )
        self._database = database
        self._scratch = hyperscan.Scratch(database)

    def over(self, buffer: Buffer) -> Search:
        """A search over `buffer`; make one per buffer and call `next` with growing starts."""
        if self.everything:
            return _EveryLine()
        if self._database is not None:
            return _HyperscanSearch(self._database, self._scratch, buffer)
        return _FindSearch(self.literals, self._regex, buffer)

    def search(self, buffer: Buffer, start: int = 0, end: int | None = None) -> int | None:
        """End offset of the first match in buffer[start:end], or None."""
        return self.over(buffer).next(start, len(buffer) if end is None else end)

    def search_last(self, buffer: Buffer, start: int = 0, end: int | None = None) -> int | None:
        """End offset of the last match in buffer[start:end], or None.

        Looks at growing windows from the end, so a region with a match near its
        end costs little and one with no match costs one forward search.
        """
        stop = len(buffer) if end is None else end
        window = 4096
        low = stop
        while low > start:
            low = max(start, stop - window)
            search = self.over(buffer)
            last = search.next(low, stop)
            if last is not None:
                while (following := search.next(last, stop)) is not None and following > last:
                    last = following
                return last
            window *= 8
        return None


class _EveryLine:
    def next(self, start: int, stop: int) -> int | None:
        return start if start < stop else None


class _HyperscanSearch:
    def __init__(self, database: Any, scratch: Any, buffer: Buffer) -> None:
        self._database = database
        self._scratch = scratch
        self._view = memoryview(buffer)

    def next(self, start: int, stop: int) -> int | None:
        if start >= stop:
            return None
        found: list[int] = []

        def on_match(_id: int, _from: int, to: int, _flags: int, _context: object) -> bool:
            found.append(to)
            return True  # stop at the first match: the caller resumes after that line

        with contextlib.suppress(hyperscan.ScanTerminated):
            self._database.scan(self._view[start:stop], match_event_handler=on_match, scratch=self._scratch)
        return start + found[0] if found else None


class _FindSearch:
    """`bytes.find` per literal, each literal's next occurrence remembered.

    Every literal walks the buffer at most once however many candidates there are.
    """

    _NEVER = 1 << 62

    def __init__(self, literals: list[Literal], regex: re.Pattern[bytes] | None, buffer: Buffer) -> None:
        self._buffer = buffer
        self._lowered: bytes | None = None
        self._needles = [(lit.text.lower() if lit.caseless else lit.text).encode("utf-8") for lit in literals]
        self._caseless = [lit.caseless for lit in literals]
        self._next = [-1] * len(literals)  # start of the next occurrence; -1: not looked yet
        self._regex = regex

    def _haystack(self, caseless: bool) -> Buffer:
        if not caseless:
            return self._buffer
        if self._lowered is None:
            self._lowered = bytes(self._buffer).lower()
        return self._lowered

    def next(self, start: int, stop: int) -> int | None:
        if start >= stop:
            return None
        best = self._NEVER
        for index, needle in enumerate(self._needles):
            position = self._next[index]
            if position < start and position != self._NEVER:
                found = self._haystack(self._caseless[index]).find(needle, start)
                position = self._NEVER if found < 0 else found
                self._next[index] = position
            if position != self._NEVER and position + len(needle) <= stop:
                best = min(best, position + len(needle))
        if self._regex is not None:
            match = self._regex.search(self._buffer, start, stop if best == self._NEVER else best)
            if match:
                best = min(best, match.end())
        return None if best == self._NEVER else best
