"""Find the few interesting lines of a large log fast: a multi-literal search.

A training log is mostly progress bars, loss dicts and INFO lines. The detailed
rules only need to see lines that contain one of a few literals (derived from the
rules, see literals.py). Hyperscan finds those at several GB/s; where it is not
installed, a compiled alternation in Python's `re` does the same job, slower.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from typing import Any

from .literals import Literal

hyperscan: Any
try:
    import hyperscan

    HAVE_HYPERSCAN = True
except ImportError:  # pragma: no cover - depends on the platform's wheels
    hyperscan = None
    HAVE_HYPERSCAN = False

Buffer = bytes | bytearray | memoryview


class _Stop(Exception):
    pass


class Prefilter:
    """Offsets in a buffer where a line worth a detailed look may be.

    `search(buffer, start)` returns the end offset of the first literal found at
    or after `start`, or None. With `everything=True` (a rule whose literals are
    unknown) every line is a candidate.
    """

    def __init__(
        self,
        literals: Iterable[Literal] = (),
        *,
        regexes: Iterable[bytes] = (),
        everything: bool = False,
        engine: str = "auto",
    ) -> None:
        unique = sorted({(lit.text, lit.caseless) for lit in literals if lit.text})
        self.literals = [Literal(text, caseless) for text, caseless in unique]
        #: Plain regexes (bytes, no flags) searched beside the literals.
        self.regexes = list(regexes)
        self.everything = everything or not (self.literals or self.regexes)
        use_hyperscan = engine == "hyperscan" or (engine == "auto" and HAVE_HYPERSCAN)
        if engine == "hyperscan" and not HAVE_HYPERSCAN:
            raise RuntimeError("hyperscan is not installed")
        self.engine = "all-lines" if self.everything else ("hyperscan" if use_hyperscan else "re")
        self._database: Any = None
        self._scratch: Any = None
        self._regexes: list[re.Pattern[bytes]] = []
        if self.engine == "hyperscan":
            self._compile_hyperscan()
        elif self.engine == "re":
            self._compile_re()

    def _compile_hyperscan(self) -> None:
        assert hyperscan is not None
        expressions = [re.escape(lit.text.encode("utf-8")) for lit in self.literals] + self.regexes
        flags = [hyperscan.HS_FLAG_CASELESS if lit.caseless else 0 for lit in self.literals]
        flags += [0] * len(self.regexes)
        database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        database.compile(
            expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
        )
        self._database = database
        self._scratch = hyperscan.Scratch(database)

    def _compile_re(self) -> None:
        for caseless in (False, True):
            texts = [lit.text for lit in self.literals if lit.caseless is caseless]
            if texts:
                alternation = b"|".join(re.escape(t.encode("utf-8")) for t in sorted(texts, key=len, reverse=True))
                self._regexes.append(re.compile(alternation, re.IGNORECASE if caseless else 0))
        if self.regexes:
            self._regexes.append(re.compile(b"|".join(self.regexes)))

    def search(self, buffer: Buffer, start: int = 0, end: int | None = None) -> int | None:
        """End offset of the first literal in buffer[start:end], or None."""
        stop = len(buffer) if end is None else end
        if start >= stop:
            return None
        if self.everything:
            return start
        if self._database is not None:
            return self._search_hyperscan(buffer, start, stop)
        best: int | None = None
        view = buffer if isinstance(buffer, bytes | bytearray) else bytes(buffer)
        for pattern in self._regexes:
            found = pattern.search(view, start, best if best is not None else stop)
            if found and (best is None or found.end() < best):
                best = found.end()
        return best

    def _search_hyperscan(self, buffer: Buffer, start: int, stop: int) -> int | None:
        found: list[int] = []

        def on_match(_id: int, _from: int, to: int, _flags: int, _context: object) -> bool:
            found.append(to)
            return True  # stop at the first match: the caller resumes after that line

        window = memoryview(buffer)[start:stop]
        with contextlib.suppress(hyperscan.ScanTerminated):
            self._database.scan(window, match_event_handler=on_match, scratch=self._scratch)
        return start + found[0] if found else None

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
            first = self.search(buffer, low, stop)
            if first is not None:
                last = first
                while True:
                    following = self.search(buffer, last, stop)
                    if following is None or following <= last:
                        return last
                    last = following
            window *= 8
        return None
