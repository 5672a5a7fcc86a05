"""What the kernel-log sources share: records -> events -> batches, de-duplication, and the choice of source.

`kernel.source = auto|kmsg|journal|both|none` picks the inputs. `both` reads
/dev/kmsg and the journal at once, sharing one `KernelDedupe` so that a record
both of them see is yielded by whichever reads it first, and only once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..clock import apply_kernel_clock
from ..kernel.events import KernelEventBuilder
from ..model import KernelEvent, KernelRecord
from . import Batch, Sink, Source, SourceHealth

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger(__name__)

MODES = ("auto", "kmsg", "journal", "both", "none")
#: A batch is handed over at least this often while records keep coming (a flood).
MAX_BATCH_SECONDS = 1.0
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def normalise_boot_id(boot_id: str) -> str:
    """32 lower-case hex digits: /proc writes dashes, the journal does not."""
    return boot_id.strip().replace("-", "").lower()


def current_boot_id(path: str = BOOT_ID_PATH) -> str:
    with open(path, encoding="ascii") as handle:
        return normalise_boot_id(handle.read())


def usec_of(record: KernelRecord) -> int | None:
    """The kernel's own stamp in microseconds: the same number in /dev/kmsg and the journal."""
    return None if record.monotonic is None else round(record.monotonic * 1e6)


class KernelDedupe:
    """Records already yielded by one source, so that the other skips them (`kernel.source = both`).

    A record is known by (boot id, the kernel's microsecond stamp, its message
    without white space: journald splits an `ident:` off a user-facility record
    and the journal parser puts it back with one space). Only a 64-bit hash of
    that is kept, in a bounded LRU, so memory stays flat on a busy node.

    After a restart the set is empty; `seed` takes each source's saved position
    so that a source does not repeat what the *other* one yielded before the
    restart (records up to the other's last stamp in that boot). The cost: a
    record /dev/kmsg lost to a ring overrun and the journal had not yet read
    when the daemon died is skipped; that loss was counted by kmsg.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.duplicates = 0
        self._keys: dict[int, None] = {}
        self._watermarks: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def seed(self, source: str, boot_id: str | None, usec: int | None) -> None:
        """What `source` had yielded of `boot_id` when its position was saved."""
        if boot_id and usec is not None:
            with self._lock:
                self._watermarks.setdefault(normalise_boot_id(boot_id), {})[source] = usec

    def first_time(self, record: KernelRecord, source: str = "") -> bool:
        """True the first time a record is offered (feed it), False for a duplicate (skip it)."""
        usec = usec_of(record)
        if usec is None:
            return True  # no stamp to tell two identical messages apart
        boot = normalise_boot_id(record.boot_id or "")
        key = hash((boot, usec, "".join(record.message.split())))
        with self._lock:
            if key in self._keys or self._before_other_watermark(boot, usec, source):
                self.duplicates += 1
                self._keys.pop(key, None)
                self._keys[key] = None  # most recently seen last
                return False
            self._keys[key] = None
            if len(self._keys) > self.capacity:
                del self._keys[next(iter(self._keys))]
            return True

    def _before_other_watermark(self, boot: str, usec: int, source: str) -> bool:
        marks = self._watermarks.get(boot, {})
        return any(usec <= mark for name, mark in marks.items() if name != source)

    def __len__(self) -> int:
        return len(self._keys)


class KernelFeed:
    """One input's records -> KernelEvents -> Batches, with the health the daemon reports.

    Events are built per boot (a new boot id flushes the builder) and handed over
    when the input went quiet for `idle_flush` seconds, or at least every second
    during a flood: the builder is flushed then, so a batch holds every event of
    the records up to its position and the position is safe to store with it.
    """

    def __init__(
        self,
        engine: Engine,
        sink: Sink,
        *,
        name: str,
        key: str,
        idle_flush: float,
        dedupe: KernelDedupe | None,
        boot_time: Callable[[], float | None] | None = None,
    ) -> None:
        self.engine = engine
        self.sink = sink
        self.name = name
        self.key = key
        self.idle_flush = idle_flush
        self.dedupe = dedupe
        self.boot_time = boot_time
        self.health = SourceHealth(name=name)
        self.lock = threading.Lock()
        self._builder = KernelEventBuilder(engine.kernel_rules)
        self._boot: str | None = None
        self._events: list[KernelEvent] = []
        self._position: dict[str, Any] | None = None
        self._first_pending: float | None = None
        self._last_record_at = 0.0

    # -- records ----------------------------------------------------------------

    def take(self, record: KernelRecord, position: dict[str, Any], wall: float | None, read_at: float) -> None:
        """A record read at `read_at`, dated `wall` (None when unknown), and the position just after it."""
        if record.boot_id != self._boot:
            self.flush()
            self._builder = KernelEventBuilder(self.engine.kernel_rules)
            self._boot = record.boot_id
        with self.lock:
            self.health.records += 1
            self.health.last_progress = read_at
            if wall is not None:
                self.health.last_record = wall
                self.health.lag = max(0.0, read_at - wall)
        if self.dedupe is None or self.dedupe.first_time(record, self.name):
            self._events.extend(self._builder.feed(record))
        else:
            self.count("duplicates")
        self._position = position
        self._last_record_at = read_at
        if self._first_pending is None:
            self._first_pending = read_at

    def count(self, what: str, how_many: int = 1) -> None:
        """Add to a counter: `skipped`, `lost`, or a name kept in health.detail."""
        with self.lock:
            if what in ("skipped", "lost"):
                setattr(self.health, what, getattr(self.health, what) + how_many)
            else:
                self.health.detail[what] = self.health.detail.get(what, 0) + how_many

    def progress(self, now: float) -> None:
        with self.lock:
            self.health.last_progress = now

    # -- batches ----------------------------------------------------------------

    def due_in(self, now: float) -> float | None:
        """Seconds until the pending records must be handed over; None when nothing is pending."""
        if self._first_pending is None:
            return None
        idle = self._last_record_at + self.idle_flush - now
        flood = self._first_pending + MAX_BATCH_SECONDS - now
        return max(0.0, min(idle, flood))

    def flush_if_due(self, now: float) -> None:
        due = self.due_in(now)
        if due is not None and due <= 0:
            self.flush()

    def flush(self) -> None:
        """Hand the sink every event of the records taken so far, with the position after the last."""
        if self._position is None:
            return
        events = self._events + self._builder.flush()
        apply_kernel_clock(events, self.boot_time() if self.boot_time else None)
        self.engine.fill_hints(events)
        batch = Batch(source=self.name, events=events, positions={self.key: self._position})
        self._events, self._position, self._first_pending = [], None, None
        self.sink(batch)

    def snapshot(self) -> SourceHealth:
        with self.lock:
            return replace(self.health, detail=dict(self.health.detail))

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self.health.alive = False
            self.health.error = f"{type(error).__name__}: {error}"
        log.error("%s: stopped: %s", self.name, self.health.error)


# ---------------------------------------------------------------------------
# Which source.


def journal_readable(directory: str | None = None) -> tuple[bool, str]:
    """Whether the journal holds kernel records of this boot (then journald is collecting them)."""
    try:
        from systemd import journal
    except ImportError as error:
        return False, f"systemd.journal cannot be imported ({error})"
    try:
        reader = journal.Reader(path=directory) if directory else journal.Reader()
    except OSError as error:
        return False, f"the journal cannot be opened ({error})"
    try:
        reader.add_match(_TRANSPORT="kernel", _BOOT_ID=current_boot_id())
        reader.seek_tail()
        if not reader.get_previous():
            return False, "the journal holds no kernel record of this boot (no journald reading /dev/kmsg?)"
    except OSError as error:
        return False, f"the journal cannot be read ({error})"
    finally:
        reader.close()
    return True, "the journal holds kernel records of this boot"


def kmsg_readable(path: str = "/dev/kmsg") -> tuple[bool, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        return False, f"{path} cannot be opened ({error.strerror}; CAP_SYSLOG or root is needed)"
    os.close(fd)
    return True, f"{path} is readable"


def select_kernel_source(
    mode: str, *, kmsg_path: str = "/dev/kmsg", journal_directory: str | None = None
) -> tuple[str, str]:
    """The mode `auto` stands for here (journal, kmsg or none), and why."""
    if mode not in MODES:
        raise ValueError(f"kernel.source: {mode!r} is not one of {', '.join(MODES)}")
    if mode != "auto":
        return mode, "configured"
    journal_ok, journal_why = journal_readable(journal_directory)
    if journal_ok:
        return "journal", journal_why
    kmsg_ok, kmsg_why = kmsg_readable(kmsg_path)
    if kmsg_ok:
        return "kmsg", f"{journal_why}; {kmsg_why}"
    return "none", f"{journal_why}; {kmsg_why}: no kernel log is read"


def kernel_sources(
    mode: str,
    engine: Engine,
    positions: Mapping[str, Any],
    *,
    kmsg_path: str = "/dev/kmsg",
    journal_directory: str | None = None,
    idle_flush: float = 0.3,
) -> list[Source]:
    """The kernel-log sources of `kernel.source`, resuming from the saved `positions` ("kmsg", "journal")."""
    # Imported here: kmsg.py and journal.py import this module.
    from .journal import JournalSource
    from .kmsg import KmsgSource

    chosen, why = select_kernel_source(mode, kmsg_path=kmsg_path, journal_directory=journal_directory)
    log.info("kernel.source=%s: reading %s (%s)", mode, chosen, why)
    dedupe = KernelDedupe() if chosen == "both" else None
    kmsg_position, journal_position = positions.get("kmsg"), positions.get("journal")
    if dedupe is not None:
        for source, position in (("kmsg", kmsg_position), ("journal", journal_position)):
            if isinstance(position, Mapping):
                usec = position.get("usec")
                dedupe.seed(source, position.get("boot_id"), usec if isinstance(usec, int) else None)
    sources: list[Source] = []
    if chosen in ("kmsg", "both"):
        sources.append(KmsgSource(engine, position=kmsg_position, path=kmsg_path, idle_flush=idle_flush, dedupe=dedupe))
    if chosen in ("journal", "both"):
        sources.append(
            JournalSource(
                engine,
                position=journal_position,
                directory=journal_directory,
                idle_flush=idle_flush,
                dedupe=dedupe,
            )
        )
    return sources
