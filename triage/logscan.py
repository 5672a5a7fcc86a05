"""Reads a training log as bytes, incrementally, and yields the failures in it.

Most of a training log never needs a detailed look. The scanner jumps from one
candidate line to the next with the prefilter; only there (and for as long as a
traceback stays open) does it split lines, strip torchrun prefixes, read stamps
and feed the failure assembler. The same object serves `triage scan` (a whole
file) and the daemon (bytes as they are appended), so both see the same failures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .literals import Literal
from .model import ProgramFailure, ProgramLine, TimeSource
from .patterns import Rule
from .prefilter import Prefilter
from .program.assembler import FailureAssembler
from .program.prefix import split_prefix
from .program.timestamps import parse_stamp

Buffer = bytes | bytearray

#: Longest line kept whole; the rest of a longer line is dropped and counted.
MAX_LINE = 64 * 1024
#: Live: a stamp read longer ago than this no longer dates the lines after it (seconds).
STAMP_FRESH = 30.0
#: Lines before a candidate handed to the assembler as context.
CONTEXT_LINES = 30

#: Literals of what the assembler itself looks for, beside the rules' own.
STRUCTURAL_LITERALS: tuple[Literal, ...] = tuple(
    Literal(text, caseless=False)
    for text in (
        "Traceback",
        'File "',
        "Error",
        "Exception",
        "terminate called",
        "what():",
        "Interrupt",
        "core dumped",
        "Segmentation fault",
        "Aborted",
        "Illegal instruction",
        "ChildFailedError",
        "Root Cause",
        "exitcode",
    )
)

#: Anything that looks like a stamp; parse_stamp decides whether it is one.
STAMP_REGEXES: tuple[bytes, ...] = (
    rb"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d",
    rb"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d",
    rb"[IWEF]\d{3,4} \d\d:\d\d:\d\d",  # glog; c10 drops the leading zero
)
_NEWLINES = b"\n\r"


@dataclass(slots=True)
class ScanStats:
    bytes: int = 0
    lines: int = 0
    detailed_lines: int = 0
    candidates: int = 0
    long_lines: int = 0
    stamps: int = 0


def build_prefilter(rules: Sequence[Rule], engine: str | None = None) -> Prefilter:
    """The prefilter for a set of program rules plus the assembler's own literals.

    TRIAGE_PREFILTER=hyperscan|python picks the engine (for benchmarks); default auto.
    """
    engine = engine or os.environ.get("TRIAGE_PREFILTER", "auto")
    literals: list[Literal] = list(STRUCTURAL_LITERALS)
    everything = False
    for rule in rules:
        if rule.literals is None:
            everything = True
        else:
            literals.extend(rule.literals)
    return Prefilter(literals, everything=everything, engine=engine)


def build_stamp_finder(engine: str | None = None) -> Prefilter:
    return Prefilter(regexes=STAMP_REGEXES, engine=engine or os.environ.get("TRIAGE_PREFILTER", "auto"))


def _line_start(buffer: Buffer, pos: int, floor: int) -> int:
    """Offset of the start of the line holding `pos` (not before `floor`)."""
    newline = buffer.rfind(b"\n", floor, pos)
    low = floor if newline < 0 else newline + 1
    carriage = buffer.rfind(b"\r", low, pos)  # only back to the \n: never a scan to the floor
    return (carriage if carriage >= 0 else newline if newline >= 0 else floor - 1) + 1


def _line_end(buffer: Buffer, pos: int, stop: int) -> int:
    """Offset of the newline ending the line that starts at `pos` (or `stop`)."""
    newline = buffer.find(b"\n", pos, stop)
    bound = stop if newline < 0 else newline
    carriage = buffer.find(b"\r", pos, bound)  # only up to the \n: never a scan to the end
    if carriage >= 0:
        return carriage
    return bound


class ProgramLogScanner:
    """Incremental scanner of one training log: feed bytes, get failures."""

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        origin: str = "",
        prefilter: Prefilter | None = None,
        stamp_finder: Prefilter | None = None,
        reference_year: int | None = None,
        read_time: Callable[[], float] | None = None,
        start_offset: int = 0,
        start_line: int = 0,
    ) -> None:
        self.origin = origin
        self.prefilter = prefilter or build_prefilter(rules)
        self.stamp_finder = stamp_finder or build_stamp_finder()
        self.assembler = FailureAssembler(rules, origin=origin, context_lines=CONTEXT_LINES)
        self.reference_year = reference_year
        #: Live use: lines with no stamp before them take the time they were read.
        self.read_time = read_time
        self.stats = ScanStats()
        self.last_stamp: float | None = None
        self._stamp_read_at: float | None = None  # live: when the last stamp was read
        self._carry = b""
        self._discarding = False  # inside the dropped tail of an over-long line
        self._after_cr = False  # the last call ended on \r: a \n first thing is its pair
        self._line_number = start_line  # lines (\n) before the current buffer position
        #: Absolute offset (in the file) of the next byte fed, and of the carried partial line.
        self._offset = start_offset
        self._carry_offset = start_offset
        #: (offset, line number) where the open failure blocks began, while any is open.
        self._busy_since: tuple[int, int] | None = None

    # -- feeding -------------------------------------------------------------

    def feed(self, data: Buffer) -> list[ProgramFailure]:
        """Scan appended bytes; a partial last line waits for the next call.

        The big buffer is scanned where it lies (no copy): only the line that
        straddles two calls is put together from its pieces.
        """
        self.stats.bytes += len(data)
        base = self._offset
        self._offset += len(data)
        failures: list[ProgramFailure] = []
        start = 0
        if self._after_cr and data[:1] == b"\n":
            start = 1  # the \n of a \r\n split across two reads: one terminator
            self._line_number += 1
        self._after_cr = False
        if self._discarding:
            cut = _first_newline(data, start)
            if cut < 0:
                return failures
            self._discarding = False
            start = cut
        if self._carry:
            cut = _first_newline(data, start)
            if cut < 0:
                self._hold(bytes(self._carry) + bytes(data[start:]), failures)
                return failures
            head = self._carry + bytes(data[start : cut + 1])
            self._carry = b""
            failures.extend(self._scan(head, start=0, end=len(head), offset=self._carry_offset))
            start = cut + 1
            if head.endswith(b"\r") and data[start : start + 1] == b"\n":
                start += 1
                self._line_number += 1
            self._after_cr = head.endswith(b"\r") and start == len(data)
        last_newline = max(data.rfind(b"\n", start), data.rfind(b"\r", start))
        end = last_newline + 1 if last_newline >= start else start
        if end > start:
            failures.extend(self._scan(data, start=start, end=end, offset=base))
            self._after_cr = end == len(data) and data[end - 1 : end] == b"\r"
        if not self._carry:
            self._carry_offset = base + end
        self._hold(bytes(data[end:]), failures)
        self.stats.lines = self._line_number
        return failures

    def _hold(self, rest: bytes, failures: list[ProgramFailure]) -> None:
        """Keep a partial line for the next call; an over-long one is cut and counted."""
        if len(rest) > MAX_LINE:
            self.stats.long_lines += 1
            self._discarding = True
            self._carry = b""
            failures.extend(self._detail(rest[:MAX_LINE]))
        else:
            self._carry = rest

    def finish(self) -> list[ProgramFailure]:
        """End of input: the last line even without a newline, then what is open."""
        failures: list[ProgramFailure] = []
        if self._carry:
            tail = self._carry + b"\n"
            self._carry = b""
            failures.extend(self._scan(tail, start=0, end=len(tail), offset=self._carry_offset))
        failures.extend(self.flush_open())
        self.stats.lines = self._line_number
        return failures

    def flush_open(self) -> list[ProgramFailure]:
        """Complete the failures still open (live: the log went quiet); a partial
        last line keeps waiting for its newline."""
        failures = self.assembler.flush()
        self._busy_since = None
        return failures

    def safe_position(self) -> tuple[int, int]:
        """(offset, line number) to resume from after a restart without losing or
        repeating a failure: the start of the oldest open failure or partial line,
        else everything fed."""
        if self._busy_since is not None:
            return self._busy_since
        if self._carry and not self._discarding:
            return (self._carry_offset, self._line_number)
        return (self._offset, self._line_number)

    # -- scanning ------------------------------------------------------------

    def _scan(self, buffer: Buffer, *, start: int, end: int, offset: int) -> list[ProgramFailure]:
        """Scan buffer[start:end] (whole lines); `offset` is buffer[0]'s offset in the file."""
        failures: list[ProgramFailure] = []
        search = self.prefilter.over(buffer)
        pos = start
        while pos < end:
            if self.assembler.idle:
                hit = search.next(pos, end)
                if hit is None:
                    self._skip(buffer, pos, end)
                    break
                line_start = _line_start(buffer, max(hit - 1, pos), pos)
                self._skip(buffer, pos, line_start)
                pos = line_start
                self.stats.candidates += 1
            line_end = _line_end(buffer, pos, end)
            was_idle = self.assembler.idle
            line_number = self._line_number
            failures.extend(self._detail(bytes(buffer[pos:line_end])))
            if self.assembler.idle:
                self._busy_since = None
            elif was_idle:
                self._busy_since = (offset + pos, line_number)
            if buffer[line_end : line_end + 2] == b"\r\n":
                line_end += 1  # one terminator, not an empty line after it
            if buffer[line_end : line_end + 1] == b"\n":
                self._line_number += 1
            pos = line_end + 1
        return failures

    def _skip(self, buffer: Buffer, start: int, stop: int) -> None:
        """Pass over lines no rule needs: count them, remember the last stamp and
        hand the last few to the assembler as context."""
        if stop <= start:
            return
        self._line_number += buffer.count(b"\n", start, stop)
        self._remember_last_stamp(buffer, start, stop)
        context_start = stop
        for _ in range(CONTEXT_LINES):
            if context_start <= start:
                break
            context_start = _line_start(buffer, context_start - 1, start)
        pos = context_start
        while pos < stop:
            line_end = _line_end(buffer, pos, stop)
            text = buffer[pos:line_end]
            if text:
                prefix, body = split_prefix(text.decode("utf-8", "replace"))
                self.assembler.feed_context(
                    ProgramLine(
                        text=body,
                        raw=text.decode("utf-8", "replace"),
                        number=self._line_number,
                        origin=self.origin,
                        rank=prefix.rank,
                        local_rank=prefix.local_rank,
                    )
                )
            if buffer.startswith(b"\r\n", line_end):
                line_end += 1
            pos = line_end + 1

    def _remember_last_stamp(self, buffer: Buffer, start: int, stop: int) -> None:
        limit = stop
        while limit > start:
            hit = self.stamp_finder.search_last(buffer, start, limit)
            if hit is None:
                return
            line_start = _line_start(buffer, hit - 1, start)
            line = buffer[line_start : _line_end(buffer, line_start, stop)].decode("utf-8", "replace")
            stamp = parse_stamp(line, reference_year=self.reference_year)
            if stamp is not None:
                self._saw_stamp(stamp)
                return
            limit = line_start

    def _saw_stamp(self, stamp: float) -> None:
        self.last_stamp = stamp
        self.stats.stamps += 1
        self._stamp_read_at = self.read_time() if self.read_time is not None else None

    def _unstamped_time(self) -> tuple[float | None, TimeSource]:
        """The time of a line without a stamp of its own.

        Offline, the last stamp seen. Live, the same while that stamp was read in the
        same burst (a backlog read at once keeps its own clock); once the log has
        been quiet for longer, the time the line was read, which is when it was
        written to within the daemon's polling.
        """
        if self.read_time is None:
            return (self.last_stamp, "last_stamp") if self.last_stamp is not None else (None, "none")
        now = self.read_time()
        fresh = self._stamp_read_at is not None and now - self._stamp_read_at <= STAMP_FRESH
        if self.last_stamp is not None and fresh:
            return self.last_stamp, "last_stamp"
        return now, "read"

    def _detail(self, raw_bytes: bytes) -> list[ProgramFailure]:
        self.stats.detailed_lines += 1
        raw = raw_bytes.decode("utf-8", "replace")
        prefix, text = split_prefix(raw)
        # parse_stamp skips launcher prefixes itself, and some stamps are one (kubectl --timestamps).
        stamp = parse_stamp(raw, reference_year=self.reference_year)
        time: float | None
        source: TimeSource
        if stamp is not None:
            self._saw_stamp(stamp)
            time, source = stamp, "stamp"
        else:
            time, source = self._unstamped_time()
        line = ProgramLine(
            text=text,
            raw=raw,
            number=self._line_number + 1,
            origin=self.origin,
            rank=prefix.rank,
            local_rank=prefix.local_rank,
            host=prefix.host,
            time=time,
            time_source=source,
        )
        return self.assembler.feed(line)


def _first_newline(buffer: Buffer, start: int) -> int:
    """Offset of the first \n or \r at or after `start`, or -1."""
    end = _line_end(buffer, start, len(buffer))
    return end if end < len(buffer) else -1
