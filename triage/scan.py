"""`triage scan`: saved kernel and training logs in, incidents out.

The imperative shell around the pure engine: open inputs (files, `-`, gzip),
run the kernel parser and the program-log scanner over them, put kernel events
on the wall clock, decide whether the two logs share a clock, and correlate.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import os
import queue
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, cast

from .clock import alignment, apply_kernel_clock
from .correlate import correlate
from .engine import Engine
from .kernel.events import KernelEventBuilder
from .kernel.formats import KernelParseStats, boot_time_from, read_kernel_stream
from .logscan import ProgramLogScanner
from .model import Incident, KernelEvent, KernelRecord, ProgramFailure

READ_SIZE = 4 * 1024 * 1024
MAX_DATED_RECORDS = 10000


class InputError(Exception):
    """An input that cannot be read; the message names it."""


@dataclass(slots=True)
class InputReport:
    path: str
    kind: str
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ScanResult:
    incidents: list[Incident]
    inputs: list[InputReport]
    clock: str
    clock_note: str


@contextmanager
def open_input(path: str) -> Iterator[tuple[BinaryIO, float | None]]:
    """A binary stream for a path or `-`, gunzipped when it is gzip; and its mtime."""
    try:
        if path == "-":
            raw: BinaryIO = sys.stdin.buffer
            mtime = None
        else:
            raw = open(path, "rb")  # noqa: SIM115 - closed below
            mtime = os.fstat(raw.fileno()).st_mtime
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
        stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
        yield cast(BinaryIO, stream), mtime
    except (OSError, EOFError) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    finally:
        if path != "-":
            raw.close()


def _chunks(stream: io.BufferedIOBase | BinaryIO, path: str, *, ahead: int = 2) -> Iterator[bytearray]:
    """Large reads into a few reused buffers, by a thread that reads ahead.

    The read system calls run while the scanner works on the chunk before (they
    release the GIL), and reusing buffers spares an allocation and its page faults
    per chunk. A chunk is valid until the next one is asked for: the scanner copies
    what it keeps.
    """
    free: queue.Queue[bytearray | None] = queue.Queue()
    for _ in range(ahead + 2):
        free.put(bytearray(READ_SIZE))
    filled: queue.Queue[tuple[bytearray, int] | BaseException | None] = queue.Queue()

    def read() -> None:
        try:
            while (buffer := free.get()) is not None:
                size = cast(io.BufferedIOBase, stream).readinto(buffer)
                if not size:
                    break
                filled.put((buffer, size))
            filled.put(None)
        except BaseException as error:  # handed to the consumer, raised there
            filled.put(error)

    reader = threading.Thread(target=read, name=f"read {path}", daemon=True)
    reader.start()
    try:
        while (item := filled.get()) is not None:
            if isinstance(item, BaseException):
                if isinstance(item, OSError | EOFError):
                    raise InputError(f"cannot read {path}: {item}") from None
                raise item
            buffer, size = item
            yield buffer if size == len(buffer) else buffer[:size]
            free.put(buffer)
    finally:
        free.put(None)
        reader.join(timeout=5)


def scan_program_log(engine: Engine, path: str) -> tuple[list[ProgramFailure], InputReport]:
    """Every failure in one training log, with times (the file's mtime when it has no stamps)."""
    origin = "<stdin>" if path == "-" else path
    failures: list[ProgramFailure] = []
    with open_input(path) as (stream, mtime):
        reference_year = dt.datetime.fromtimestamp(mtime).year if mtime else None
        scanner = ProgramLogScanner(
            engine.program_rules,
            origin=origin,
            prefilter=engine.prefilter,
            stamp_finder=engine.stamp_finder,
            reference_year=reference_year,
        )
        for chunk in _chunks(stream, path):
            failures.extend(scanner.feed(chunk))
        failures.extend(scanner.finish())
    if scanner.stats.stamps == 0 and mtime is not None:
        # No stamp anywhere: the crash wrote the last line, at the file's mtime.
        for failure in failures:
            failure.time, failure.time_source = mtime, "mtime"
    else:
        known = [f.time for f in failures if f.time is not None]
        for failure in failures:
            if failure.time is None and known:
                failure.time, failure.time_source = min(known), "last_stamp"
    stats = asdict(scanner.stats)
    stats["failures"] = len(failures)
    stats["prefilter"] = engine.prefilter.engine
    return failures, InputReport(origin, "log", stats)


def scan_kernel_log(engine: Engine, path: str, boot_time: float | None) -> tuple[list[KernelEvent], InputReport]:
    """Kernel events of one kernel log, on the wall clock where it can be known."""
    origin = "<stdin>" if path == "-" else path
    parse_stats = KernelParseStats()
    builder = KernelEventBuilder(engine.kernel_rules)
    events: list[KernelEvent] = []
    #: Records that carry a wall clock, kept (a few thousand at most) to work out the boot time.
    dated: list[KernelRecord] = []
    with open_input(path) as (stream, mtime):
        reference_year = dt.datetime.fromtimestamp(mtime).year if mtime else dt.datetime.now().year
        for record in read_kernel_stream(stream, origin, reference_year=reference_year, stats=parse_stats):
            if record.wall is not None and len(dated) < MAX_DATED_RECORDS:
                dated.append(record)
            events.extend(builder.feed(record))
        events.extend(builder.flush())
    own_boot_time = boot_time_from(dated)
    apply_kernel_clock(events, boot_time if boot_time is not None else own_boot_time)
    engine.fill_hints(events)
    stats = asdict(parse_stats)
    stats["events"] = len(events)
    stats["boot_time"] = own_boot_time if boot_time is None else boot_time
    return events, InputReport(origin, "kernel", stats)


def scan(
    engine: Engine,
    kernel_paths: Sequence[str],
    log_paths: Sequence[str],
    *,
    boot_time: float | None = None,
    one_window: bool = False,
) -> ScanResult:
    events: list[KernelEvent] = []
    failures: list[ProgramFailure] = []
    reports: list[InputReport] = []
    for path in kernel_paths:
        found, report = scan_kernel_log(engine, path, boot_time)
        events.extend(found)
        reports.append(report)
    for path in log_paths:
        found_failures, report = scan_program_log(engine, path)
        failures.extend(found_failures)
        reports.append(report)
    note = ""
    if one_window:
        note = "asked for one window (--one-window)"
    else:
        aligned = alignment(events, failures)
        if not aligned.aligned:
            one_window, note = True, aligned.reason
    incidents = correlate(events, failures, one_window=one_window, clock_note=note)
    return ScanResult(incidents, reports, "one_window" if one_window else "aligned", note)
