"""journald: kernel records (`_TRANSPORT=kernel`) through `systemd.journal.Reader`, previous boots included.

The journal keeps what /dev/kmsg cannot: the records of earlier boots. A node
that rebooted after a GPU hang is the case that matters most, so the first
start reads the end of the previous boot before the current boot, and a start
after a reboot finishes the boot the saved cursor points into (and the end of
any boot between) before the new one. Each boot's events are built apart:
faults never group across a reboot.

The position is {"cursor", "boot_id", "usec"}: the journal cursor of the last
record handed over, its boot, and its kernel stamp (for `kernel.source = both`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..kernel.formats import KernelParseStats, journal_entry_record
from ..model import KernelRecord
from . import Sink, SourceHealth, StoppableThread
from .kernel import KernelDedupe, KernelFeed, current_boot_id, normalise_boot_id, usec_of

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger(__name__)

#: Kernel records read from the end of a previous boot.
PREVIOUS_RECORDS = 2000
#: Longest sd_journal_wait, so health progress and stop stay responsive.
MAX_WAIT = 1.0

Entry = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Step:
    """One boot to read: from its head, its last records, or after a cursor; `follow` waits for more."""

    boot_id: str
    start: Literal["head", "tail", "cursor"]
    cursor: str | None = None
    follow: bool = False


def plan(
    boots: Sequence[str],
    current: str,
    position: dict[str, Any] | None,
    *,
    previous_boot: bool = True,
) -> list[Step]:
    """What to read, boot by boot; `boots` are the journal's boots, oldest first.

    Same boot: on from the cursor. Another boot (a reboot while the daemon was
    down): that boot from its cursor to its end, the end of any boot after it,
    then the current boot from its start. No position (the very first start): the
    end of the previous boot, then the current boot from its start.
    """
    saved_boot, cursor = _saved(position)
    if saved_boot == current and cursor:
        return [Step(current, "cursor", cursor, follow=True)]
    end = boots.index(current) if current in boots else len(boots)
    steps: list[Step] = []
    if saved_boot is not None and cursor and saved_boot in boots[:end]:
        first = boots.index(saved_boot)
        steps.append(Step(saved_boot, "cursor", cursor))
        steps.extend(Step(boot, "tail") for boot in boots[first + 1 : end])
    elif previous_boot and end > 0:
        steps.append(Step(boots[end - 1], "tail"))
    steps.append(Step(current, "head", follow=True))
    return steps


def _saved(position: dict[str, Any] | None) -> tuple[str | None, str | None]:
    if not isinstance(position, dict):
        return None, None
    boot, cursor = position.get("boot_id"), position.get("cursor")
    if not isinstance(boot, str) or not isinstance(cursor, str):
        return None, None
    return normalise_boot_id(boot), cursor


def kernel_wall(record: KernelRecord) -> None:
    """Date the record when the kernel logged it: journald's receive time less how late journald read it.

    journald stamps a kmsg record when it reads it; after a late start that is
    minutes after the kernel wrote it. Both receive clocks are taken together,
    so wall - (received monotonic - kernel monotonic) is the kernel's time.
    """
    received = record.fields.get("__MONOTONIC_TIMESTAMP")
    if record.wall is None or record.monotonic is None or received is None or not received.isdigit():
        return
    delay = int(received) / 1e6 - record.monotonic
    if delay > 0:
        record.wall -= delay


def _text(value: object) -> object:
    """Journal fields as the journal parser wants them: text (bytes when not UTF-8), stamps as usec."""
    if isinstance(value, bytes):
        return value.decode()  # ValueError: the Reader keeps the bytes
    if isinstance(value, tuple):  # journal.Monotonic(timestamp, bootid)
        return str(value[0])
    return str(value)


class JournalSource:
    """Reads the journal's kernel records in a thread and hands the sink batches of KernelEvents."""

    def __init__(
        self,
        engine: Engine,
        *,
        position: dict[str, Any] | None = None,
        files: Sequence[str] | None = None,
        directory: str | None = None,
        previous_boot: bool = True,
        idle_flush: float = 0.3,
        dedupe: KernelDedupe | None = None,
        name: str = "journal",
        boot_id: str | None = None,
        previous_records: int = PREVIOUS_RECORDS,
    ) -> None:
        self.engine = engine
        self.name = name
        self.position = position
        self.files = list(files) if files else None
        self.directory = directory
        self.previous_boot = previous_boot
        self.idle_flush = idle_flush
        self.dedupe = dedupe
        self.boot_id = normalise_boot_id(boot_id) if boot_id else current_boot_id()
        self.previous_records = previous_records
        self.stats = KernelParseStats()
        self._reader: Any = None
        self._thread: StoppableThread | None = None
        self._feed: KernelFeed | None = None
        self._index = 0

    # -- Source -------------------------------------------------------------------

    def start(self, sink: Sink) -> None:
        """Open the journal (OSError when it cannot be) and start reading."""
        self._reader = self._open()
        self._feed = KernelFeed(
            self.engine, sink, name=self.name, key="journal", idle_flush=self.idle_flush, dedupe=self.dedupe
        )
        self._feed.health.detail.update(boot_id=self.boot_id, cursor_missing=0)
        self._thread = StoppableThread(f"triage-{self.name}", self._run)
        self._thread.start()

    def stop(self) -> None:
        """Let the thread hand over what it holds (it wakes within MAX_WAIT) and close the journal."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def health(self) -> SourceHealth:
        if self._feed is None:
            return SourceHealth(name=self.name, alive=False, error="not started")
        health = self._feed.snapshot()
        health.alive = health.alive and self._thread is not None and self._thread.is_alive()
        health.detail["parse"] = {"bad_encoding": self.stats.bad_encoding, "unparsed": self.stats.unparsed}
        return health

    def _open(self) -> Any:
        try:
            from systemd import journal
        except ImportError as error:
            raise OSError(f"systemd.journal cannot be imported: {error}") from error
        converters = {key: _text for key in journal.DEFAULT_CONVERTERS}
        if self.files:
            return journal.Reader(files=self.files, converters=converters)
        if self.directory:
            return journal.Reader(path=self.directory, converters=converters)
        return journal.Reader(converters=converters)

    # -- the thread -----------------------------------------------------------------

    def _run(self, stopping: threading.Event) -> None:
        feed, reader = self._feed, self._reader
        assert feed is not None
        try:
            steps = plan(self._boots(reader), self.boot_id, self.position, previous_boot=self.previous_boot)
            log.info("%s: reading %s", self.name, ", ".join(f"{s.boot_id[:8]}:{s.start}" for s in steps))
            for step in steps:
                if stopping.is_set():
                    break
                self._read(reader, step, stopping, feed)
                feed.flush()
        except Exception as error:  # the daemon reports it in /healthz
            feed.fail(error)
        finally:
            reader.close()

    def _boots(self, reader: Any) -> list[str]:
        """The journal's boots that have kernel records, oldest first."""
        firsts: list[tuple[int, str]] = []
        for value in reader.query_unique("_BOOT_ID"):
            if not isinstance(value, str):
                continue
            boot = normalise_boot_id(value)
            self._match(reader, boot)
            reader.seek_head()
            entry = reader.get_next()
            if entry:
                firsts.append((int(entry["__REALTIME_TIMESTAMP"]), boot))
        return [boot for _, boot in sorted(firsts)]

    def _match(self, reader: Any, boot: str) -> None:
        reader.flush_matches()
        reader.add_match(_TRANSPORT="kernel", _BOOT_ID=boot)

    def _read(self, reader: Any, step: Step, stopping: threading.Event, feed: KernelFeed) -> None:
        """One boot to its end; the current one (`follow`) until stopped."""
        self._match(reader, step.boot_id)
        entry = self._seek(reader, step, feed)
        while not stopping.is_set():
            now = time.time()
            feed.progress(now)
            if entry:
                self._handle(entry, now, feed)
                feed.flush_if_due(now)
            elif not step.follow:
                return
            else:
                feed.flush_if_due(now)
                due = feed.due_in(now)
                reader.wait(MAX_WAIT if due is None else max(0.01, min(due, MAX_WAIT)))
            entry = reader.get_next()

    def _seek(self, reader: Any, step: Step, feed: KernelFeed) -> Entry:
        """The first entry of a step ({} when there is none yet)."""
        if step.start == "tail":
            reader.seek_tail()
            entry: Entry = reader.get_previous(self.previous_records)
            return entry
        if step.start == "cursor" and step.cursor:
            try:
                reader.seek_cursor(step.cursor)
            except (OSError, ValueError) as error:
                log.warning("%s: saved cursor unusable (%s): reading boot %s from its start", self.name, error, step)
                feed.count("cursor_missing")
                reader.seek_head()
                return reader.get_next()  # type: ignore[no-any-return]
            entry = reader.get_next()
            if not entry:
                return entry
            if reader.test_cursor(step.cursor):
                return reader.get_next()  # type: ignore[no-any-return]
            feed.count("cursor_missing")  # rotated away: on from the next record that is left
            return entry
        reader.seek_head()
        return reader.get_next()  # type: ignore[no-any-return]

    def _handle(self, entry: Entry, now: float, feed: KernelFeed) -> None:
        record = journal_entry_record(entry, self.name, self.stats)
        cursor = entry.get("__CURSOR")
        if record is None or not isinstance(cursor, str) or not record.boot_id:
            feed.count("skipped")
            return
        record.boot_id = normalise_boot_id(record.boot_id)
        record.index = self._index
        self._index += 1
        kernel_wall(record)
        position = {"cursor": cursor, "boot_id": record.boot_id, "usec": usec_of(record)}
        feed.take(record, position, record.wall, now)
