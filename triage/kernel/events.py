"""Kernel records -> kernel fault events: a pure, streaming state machine.

Three steps, in the order a record goes through them:

1. classify the record's message with the kernel rules (unmatched records are
   dropped, except `N callbacks suppressed`, whose N goes to the next event);
2. group the lines of one multi-line fault: rules with a `group` open a fault
   per (device, group) with their `start` line, `detail` lines of the same key
   join it (journald may print details before their header); a fault closes when
   its key starts a new one, when time moves on, or on flush;
3. fold repeats: an event identical to an earlier one (same rule, device,
   process, detail rules) within FOLD_WINDOW becomes one event with a count.

Events come out in the order of their first record; memory stays bounded
however long a storm lasts.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..classify import best_rule
from ..model import KernelEvent, KernelRecord
from ..patterns import Rule

#: A fault closes when the clock moves this far past its last line (seconds).
GROUP_WINDOW = 2.0
#: With no clock, a fault closes after this many further records.
GROUP_RECORDS = 200
#: Detail lines printed before their header (journal reordering) are taken as the
#: header's when they began at most this long before it (seconds) ...
REORDER_WINDOW = 1.0
#: ... or, with no clock, at most this many records before it.
REORDER_RECORDS = 20
#: Identical events starting within this long of the first of them fold into it (seconds).
FOLD_WINDOW = 10.0
#: With no clock, identical events within this many records fold.
FOLD_RECORDS = 1000
#: Records of at most this many folded events are kept in the folded event.
FOLD_KEPT_EVENTS = 5
#: Raw lines kept per event.
MAX_EVENT_LINES = 60
#: Distinct fault addresses listed in `fields["addresses"]` of a folded event.
MAX_ADDRESSES = 10
#: Faults open at once (devices x groups); the oldest closes beyond it.
MAX_OPEN_FAULTS = 64
#: Distinct events waiting to fold at once; the oldest is released beyond it.
MAX_HELD = 16

_SUPPRESSED = re.compile(r"(?:^|\s|:)(?P<count>\d{1,9}) callbacks suppressed\s*$")
_DEV_PRINTK = re.compile(r"^[\w.\-]+ (?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): ")
_NVRM_PCI = re.compile(r"PCI:(?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_NVIDIA_GPU = re.compile(r"NVIDIA GPU (?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
_ANY_BDF = re.compile(
    r"(?<![0-9a-fA-F:])(?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?![0-9a-fA-F])"
)
_BDF_NO_FUNCTION = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}")
_BDF_NO_DOMAIN = re.compile(r"[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_EVENT_ATTRIBUTES = ("device", "pid", "process", "address")

Clock = tuple[str, float]


@dataclass(slots=True)
class KernelEventStats:
    """What the builder did with the records it was fed."""

    records: int = 0
    #: Records some rule named.
    matched: int = 0
    #: Records no rule named (dropped).
    unmatched: int = 0
    #: `N callbacks suppressed` lines taken (their N goes to the next event).
    suppressed_lines: int = 0
    #: Events folded into an earlier identical one.
    folded: int = 0
    #: Events emitted.
    events: int = 0


def normalise_device(text: str) -> str:
    """A PCI address as `dddd:bb:dd.f` in lower case (NVRM prints `PCI:0000:0a:00`)."""
    device = text.strip().lower()
    if _BDF_NO_FUNCTION.fullmatch(device):
        return device + ".0"
    if _BDF_NO_DOMAIN.fullmatch(device):
        return "0000:" + device
    return device


def device_of(message: str, captured: str | None = None) -> str | None:
    """The PCI device a message is about: the rule's `device` group, else the dev_printk
    prefix, else NVRM's `PCI:...` or `NVIDIA GPU ...`, else the first full PCI address."""
    if captured:
        return normalise_device(captured)
    for pattern in (_DEV_PRINTK, _NVRM_PCI, _NVIDIA_GPU, _ANY_BDF):
        match = pattern.search(message)
        if match:
            return normalise_device(match.group("device"))
    return None


def clock_of(record: KernelRecord) -> Clock | None:
    """The record's time on the best clock it has; clocks of different kinds never compare."""
    if record.monotonic is not None:
        return ("monotonic", record.monotonic)
    if record.wall is not None:
        return ("wall", record.wall)
    if record.relative is not None:
        return ("relative", record.relative)
    return None


def _seconds_between(earlier: Clock | None, later: Clock | None) -> float | None:
    if earlier is None or later is None or earlier[0] != later[0]:
        return None
    return later[1] - earlier[1]


def _within(
    earlier: Clock | None, later: Clock | None, seconds: float, earlier_count: int, later_count: int, records: int
) -> bool:
    """Whether two records are close: by clock when both have one of a kind, else by record distance."""
    gap = _seconds_between(earlier, later)
    if gap is not None:
        return abs(gap) <= seconds
    return later_count - earlier_count <= records


@dataclass(slots=True)
class _Tracked:
    """An event being built or waiting to fold, with what the limits need."""

    event: KernelEvent
    #: Creation order = order of first record.
    seq: int
    first_clock: Clock | None
    first_count: int
    last_clock: Clock | None
    last_count: int
    has_start: bool = True
    lines: int = 0
    kept_events: int = 1
    addresses: list[str] = field(default_factory=list)


class KernelEventBuilder:
    """Feeds records in order, gets completed events back; `flush` at the end of input."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = [rule for rule in rules if rule.source == "kernel"]
        self.stats = KernelEventStats()
        self._count = 0
        self._next_seq = 0
        self._pending_suppressed = 0
        self._open: dict[tuple[str, str], _Tracked] = {}
        self._done: list[tuple[int, int, _Tracked]] = []  # heap by seq
        self._held: dict[tuple[object, ...], _Tracked] = {}

    # -- public ---------------------------------------------------------------

    def feed(self, record: KernelRecord) -> list[KernelEvent]:
        """The events that this record completed (often none)."""
        self._count += 1
        self.stats.records += 1
        now = clock_of(record)
        self._close_stale(now)
        suppressed = _SUPPRESSED.search(record.message)
        if suppressed:
            self._pending_suppressed += int(suppressed.group("count"))
            self.stats.suppressed_lines += 1
        else:
            self._take(record, now)
        out = self._release_done()
        out.extend(self._expire_held(now))
        return out

    def flush(self) -> list[KernelEvent]:
        """Every event still open or waiting, in order."""
        for key in sorted(self._open, key=lambda key: self._open[key].seq):
            self._complete(self._open.pop(key))
        out = self._release_done()
        out.extend(self._release_held(len(self._held)))
        return out

    # -- step 1 and 2: classify and group ---------------------------------------

    def _take(self, record: KernelRecord, now: Clock | None) -> None:
        classification = best_rule(self.rules, record.message)
        if classification is None:
            self.stats.unmatched += 1
            return
        self.stats.matched += 1
        rule = classification.rule
        captured = classification.fields
        device = device_of(record.message, captured.get("device"))
        if rule.group is None:
            self._complete(self._new(record, rule, device, captured, now))
            return
        key = (device or "", rule.group)
        current = self._open.get(key)
        if rule.role == "detail":
            if current is None:
                self._open_fault(key, self._new(record, rule, device, captured, now, has_start=False))
            else:
                self._join(current, record, rule, captured, now)
            return
        if current is not None and not current.has_start and self._reordered(current, now):
            self._adopt_start(current, record, rule, captured, now)
            return
        if current is not None:
            self._complete(self._open.pop(key))
        self._open_fault(key, self._new(record, rule, device, captured, now))

    def _new(
        self,
        record: KernelRecord,
        rule: Rule,
        device: str | None,
        captured: dict[str, str],
        now: Clock | None,
        *,
        has_start: bool = True,
    ) -> _Tracked:
        event = KernelEvent(
            rule_id=rule.id,
            category=rule.category,
            title=rule.title,
            records=[record],
            device=device,
            suppressed=self._pending_suppressed,
        )
        self._pending_suppressed = 0
        _merge_captured(event, captured)
        tracked = _Tracked(
            event=event,
            seq=self._next_seq,
            first_clock=now,
            first_count=self._count,
            last_clock=now,
            last_count=self._count,
            has_start=has_start,
            lines=len(record.raw),
        )
        self._next_seq += 1
        return tracked

    def _open_fault(self, key: tuple[str, str], tracked: _Tracked) -> None:
        if len(self._open) >= MAX_OPEN_FAULTS:
            oldest = min(self._open, key=lambda other: self._open[other].seq)
            self._complete(self._open.pop(oldest))
        self._open[key] = tracked

    def _join(
        self, tracked: _Tracked, record: KernelRecord, rule: Rule, captured: dict[str, str], now: Clock | None
    ) -> None:
        event = tracked.event
        if tracked.lines + len(record.raw) <= MAX_EVENT_LINES:
            event.records.append(record)
            tracked.lines += len(record.raw)
        if rule.id != event.rule_id and rule.id not in event.detail_rules:
            event.detail_rules.append(rule.id)
        _merge_captured(event, captured)
        tracked.last_clock = now
        tracked.last_count = self._count

    def _reordered(self, tracked: _Tracked, now: Clock | None) -> bool:
        """Whether a header belongs to detail lines printed just before it."""
        return _within(tracked.first_clock, now, REORDER_WINDOW, tracked.first_count, self._count, REORDER_RECORDS)

    def _adopt_start(
        self, tracked: _Tracked, record: KernelRecord, rule: Rule, captured: dict[str, str], now: Clock | None
    ) -> None:
        """The header of a fault whose details came first names the fault."""
        event = tracked.event
        if event.rule_id not in event.detail_rules:
            event.detail_rules.insert(0, event.rule_id)
        event.rule_id, event.category, event.title = rule.id, rule.category, rule.title
        tracked.has_start = True
        self._join(tracked, record, rule, captured, now)

    def _close_stale(self, now: Clock | None) -> None:
        """Close the faults that time (or, with no clock, record count) has left behind."""
        stale = [
            key
            for key, tracked in self._open.items()
            if not _within(tracked.last_clock, now, GROUP_WINDOW, tracked.last_count, self._count, GROUP_RECORDS)
        ]
        for key in stale:
            self._complete(self._open.pop(key))

    # -- ordering ---------------------------------------------------------------

    def _complete(self, tracked: _Tracked) -> None:
        heapq.heappush(self._done, (tracked.seq, id(tracked), tracked))

    def _release_done(self) -> list[KernelEvent]:
        """Completed events whose turn has come (no open fault began before them), through folding."""
        oldest_open = min((tracked.seq for tracked in self._open.values()), default=None)
        out: list[KernelEvent] = []
        while self._done and (oldest_open is None or self._done[0][0] < oldest_open):
            _, _, tracked = heapq.heappop(self._done)
            out.extend(self._fold_or_hold(tracked))
        return out

    # -- step 3: fold -----------------------------------------------------------

    def _fold_or_hold(self, tracked: _Tracked) -> list[KernelEvent]:
        key = _fold_key(tracked.event)
        held = self._held.get(key)
        if held is not None and _within(
            held.first_clock, tracked.first_clock, FOLD_WINDOW, held.first_count, tracked.first_count, FOLD_RECORDS
        ):
            _fold(held, tracked)
            self.stats.folded += 1
            return []
        out: list[KernelEvent] = []
        if held is not None:
            out.extend(self._release_held(self._held_position(held) + 1))
        if tracked.event.address:
            tracked.addresses.append(tracked.event.address)
        self._held[key] = tracked
        if len(self._held) > MAX_HELD:
            out.extend(self._release_held(1))
        return out

    def _held_position(self, held: _Tracked) -> int:
        return sorted(tracked.seq for tracked in self._held.values()).index(held.seq)

    def _release_held(self, how_many: int) -> list[KernelEvent]:
        """The `how_many` oldest waiting events, final now."""
        ordered = sorted(self._held.items(), key=lambda item: item[1].seq)
        out: list[KernelEvent] = []
        for key, tracked in ordered[:how_many]:
            del self._held[key]
            if len(tracked.addresses) > 1:
                tracked.event.fields["addresses"] = ",".join(tracked.addresses)
            out.append(tracked.event)
        self.stats.events += len(out)
        return out

    def _expire_held(self, now: Clock | None) -> list[KernelEvent]:
        """Release waiting events that nothing can fold into any more (oldest first, in order)."""
        ordered = sorted(self._held.values(), key=lambda tracked: tracked.seq)
        expired = 0
        for position, tracked in enumerate(ordered):
            if not _within(tracked.first_clock, now, FOLD_WINDOW, tracked.first_count, self._count, FOLD_RECORDS):
                expired = position + 1
        return self._release_held(expired) if expired else []


def _merge_captured(event: KernelEvent, captured: dict[str, str]) -> None:
    """Named groups of a match into the event, never overwriting what an earlier line gave."""
    if event.pid is None and captured.get("pid", "").isdigit() and len(captured["pid"]) < 10:
        event.pid = int(captured["pid"])
    if event.process is None and captured.get("process"):
        event.process = captured["process"]
    if event.address is None and captured.get("address"):
        event.address = captured["address"].lower()
    if event.device is None and captured.get("device"):
        event.device = normalise_device(captured["device"])
    for name, value in captured.items():
        if name not in _EVENT_ATTRIBUTES:
            event.fields.setdefault(name, value)


def _fold_key(event: KernelEvent) -> tuple[object, ...]:
    return (event.rule_id, event.device, event.pid, event.process, frozenset(event.detail_rules))


def _fold(into: _Tracked, other: _Tracked) -> None:
    """Count `other` in `into`, keeping a few of its lines and its address."""
    event = into.event
    event.count += other.event.count
    event.suppressed += other.event.suppressed
    if into.kept_events < FOLD_KEPT_EVENTS and into.lines + other.lines <= MAX_EVENT_LINES:
        event.records.extend(other.event.records)
        into.lines += other.lines
        into.kept_events += 1
    address = other.event.address
    if address and address not in into.addresses and len(into.addresses) < MAX_ADDRESSES:
        into.addresses.append(address)
    into.last_clock = other.last_clock
    into.last_count = other.last_count


def build_events(records: Iterable[KernelRecord], rules: Sequence[Rule]) -> list[KernelEvent]:
    """All events of a finite input, in order of their first record."""
    builder = KernelEventBuilder(rules)
    events: list[KernelEvent] = []
    for record in records:
        events.extend(builder.feed(record))
    events.extend(builder.flush())
    return events
