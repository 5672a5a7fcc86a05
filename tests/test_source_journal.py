"""JournalSource against real journals, the de-duplication of `kernel.source = both`, and the choice of source.

Journal files of boots that are over are written by the real
`systemd-journal-remote` from export-format input (that is how a test gets the
journal of a node that rebooted). Live kernel records come from a private
`systemd-journald` that reads the real /dev/kmsg (tests/support/journald.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.batches import Collector
from tests.support.journald import (
    JournalWriter,
    PrivateJournald,
    journal_remote_unusable,
    journald_unusable,
    kernel_entry,
    private_journald,
    write_journal,
)
from tests.support.kmsg import kmsg_unusable, new_marker, write_kmsg
from triage.engine import Engine
from triage.kernel.formats import KernelParseStats, journal_entry_record, parse_kernel_lines
from triage.model import KernelRecord
from triage.sources import Source
from triage.sources.journal import JournalSource, Step, plan
from triage.sources.kernel import KernelDedupe, current_boot_id, kernel_sources, select_kernel_source
from triage.sources.kmsg import KmsgSource

DATA = Path(__file__).parent / "data" / "kernel"
needs_journal_remote = pytest.mark.skipif(journal_remote_unusable() is not None, reason=str(journal_remote_unusable()))
needs_journald = pytest.mark.skipif(
    journald_unusable() is not None or kmsg_unusable() is not None,
    reason=str(journald_unusable() or kmsg_unusable()),
)

BOOT_A, BOOT_B, BOOT_C = "a1" * 16, "b2" * 16, "c3" * 16
#: Wall clock (usec) at monotonic 0 of each boot: A, then C an hour later, then B.
WALL = {BOOT_A: 1_790_000_000 * 10**6, BOOT_C: 1_790_003_600 * 10**6, BOOT_B: 1_790_007_200 * 10**6}
#: How late journald read each record (it stamps what it reads when it reads it).
DELAY = 2.5


def entry(
    boot: str, seconds: float, message: str, *, transport: str = "kernel", boot_wall: int | None = None
) -> dict[str, str]:
    """A kernel record at `seconds` after boot, as journald stores it when it read it DELAY seconds late."""
    usec = round(seconds * 1e6)
    wall = (WALL[boot] if boot_wall is None else boot_wall) + usec
    return kernel_entry(boot, usec, message, wall_usec=wall, delay_usec=round(DELAY * 1e6), transport=transport)


def reset(dev: str, tag: str = "") -> str:
    return f"amdgpu {dev}: amdgpu: GPU reset begin! {tag}".rstrip()


def device() -> str:
    return f"{uuid.uuid4().hex[:4]}:c1:00.0"


@pytest.fixture
def started() -> Iterator[list[Source]]:
    sources: list[Source] = []
    yield sources
    for source in sources:
        source.stop()


def start(started: list[Source], collector: Collector, source: Source) -> Any:
    source.start(collector)
    started.append(source)
    return source


def journal(engine: Engine, **options: Any) -> JournalSource:
    return JournalSource(engine, idle_flush=0.05, **options)


def read_to(collector: Collector, boot: str, seconds: float, timeout: float = 4.0) -> bool:
    """Wait until the source handed over the position of the record of `boot` at `seconds`."""

    def there() -> bool:
        position = collector.position("journal")
        return bool(position) and position["boot_id"] == boot and position["usec"] == round(seconds * 1e6)

    return collector.wait_for(there, timeout)


def messages(collector: Collector) -> list[str]:
    return [record.message for event in collector.events() for record in event.records]


# ---------------------------------------------------------------------------
# Journal files written by systemd-journal-remote.


@needs_journal_remote
def test_kernel_records_only_on_the_kernel_clock(engine: Engine, tmp_path: Path, started: list[Source]) -> None:
    dev = device()
    path = tmp_path / "b.journal"
    write_journal(
        path,
        [
            entry(BOOT_B, 100, reset(dev)),
            entry(BOOT_B, 101, reset(dev, "from syslog"), transport="syslog"),
            entry(BOOT_B, 101.5, reset(dev, "from stdout"), transport="stdout"),
            entry(BOOT_B, 102, "usb 1-1: new high-speed USB device number 2 using xhci_hcd"),
            entry(BOOT_B, 103, "NVRM: Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
        ],
    )
    collector = Collector()
    source = start(started, collector, journal(engine, files=[str(path)], boot_id=BOOT_B))
    assert read_to(collector, BOOT_B, 103)
    events = collector.events()
    assert [(event.category, event.device) for event in events] == [("gpu_reset", dev), ("gpu_lost", "0000:0a:00.0")]
    assert all(record.fields["_TRANSPORT"] == "kernel" for event in events for record in event.records)
    # When the kernel logged it, not when journald read it DELAY seconds later.
    assert events[0].time == pytest.approx(WALL[BOOT_B] / 1e6 + 100, abs=1e-3)
    assert all(event.hint for event in events)
    health = source.health()
    assert (health.records, health.skipped, health.lost) == (3, 0, 0)
    assert health.last_record == pytest.approx(WALL[BOOT_B] / 1e6 + 103, abs=1e-3)
    position = collector.position("journal")
    assert position["cursor"].startswith("s=") and f"b={BOOT_B}" in position["cursor"]


@needs_journal_remote
def test_cursor_saved_and_resumed_without_repeats(engine: Engine, tmp_path: Path, started: list[Source]) -> None:
    devices = [device() for _ in range(5)]
    path = tmp_path / "b.journal"
    write_journal(path, [entry(BOOT_B, 10 + n, reset(dev, f"#{n}")) for n, dev in enumerate(devices[:3])])
    first = Collector()
    source = start(started, first, journal(engine, files=[str(path)], boot_id=BOOT_B))
    assert read_to(first, BOOT_B, 12)
    source.stop()
    position = first.position("journal")
    write_journal(path, [entry(BOOT_B, 20 + n, reset(dev, f"#{n + 3}")) for n, dev in enumerate(devices[3:])])
    second = Collector()
    start(started, second, journal(engine, files=[str(path)], boot_id=BOOT_B, position=position))
    assert read_to(second, BOOT_B, 21)
    time.sleep(0.2)
    assert [m.rsplit("#", 1)[1] for m in messages(first)] == ["0", "1", "2"]
    assert [m.rsplit("#", 1)[1] for m in messages(second)] == ["3", "4"]
    # Nothing new: nothing handed over.
    third = Collector()
    start(started, third, journal(engine, files=[str(path)], boot_id=BOOT_B, position=second.position("journal")))
    time.sleep(0.4)
    assert third.events() == []


def boot_a_ending_in_a_hang(early: str, dev: str) -> list[dict[str, str]]:
    """Boot A: a fault early on, then 30 quiet records, then a ring timeout and the reset it caused."""
    entries = [entry(BOOT_A, 10, reset(early, "early"))]
    entries += [entry(BOOT_A, 20 + n, f"usb 1-1: port {n} status change") for n in range(30)]
    entries += [
        entry(BOOT_A, 3000, f"amdgpu {dev}: amdgpu: ring gfx_0.0.0 timeout, signaled seq=159760, emitted seq=159762"),
        entry(BOOT_A, 3000.5, reset(dev)),
        entry(BOOT_A, 3001, f"amdgpu {dev}: amdgpu: GPU reset(1) succeeded!"),
    ]
    return entries


@needs_journal_remote
def test_first_start_reads_the_end_of_the_previous_boot_then_the_current_one(
    engine: Engine, tmp_path: Path, started: list[Source]
) -> None:
    early, dev, later = device(), device(), device()
    a, b = tmp_path / "a.journal", tmp_path / "b.journal"
    write_journal(a, boot_a_ending_in_a_hang(early, dev))
    write_journal(b, [entry(BOOT_B, 5, reset(later, "after reboot"))])
    collector = Collector()
    start(started, collector, journal(engine, files=[str(a), str(b)], boot_id=BOOT_B, previous_records=10))
    assert read_to(collector, BOOT_B, 5)
    events = collector.events()
    assert [(event.first.boot_id, event.rule_id, event.device) for event in events] == [
        (BOOT_A, "amdgpu.ring_timeout", dev),
        (BOOT_A, "amdgpu.gpu_reset.begin", dev),
        (BOOT_A, "amdgpu.gpu_reset.result", dev),
        (BOOT_B, "amdgpu.gpu_reset.begin", later),
    ]
    assert early not in {event.device for event in events}, "only the end of the previous boot is read"
    assert events[0].time == pytest.approx(WALL[BOOT_A] / 1e6 + 3000, abs=1e-3)
    # The previous boot is handed over on its own, with a position in that boot.
    for batch in collector.snapshot():
        boots = {record.boot_id for event in batch.events for record in event.records}
        assert boots <= {batch.positions["journal"]["boot_id"]}
    assert any(batch.positions["journal"]["boot_id"] == BOOT_A for batch in collector.snapshot())


@needs_journal_remote
def test_a_position_in_an_earlier_boot_resumes_it_then_the_boots_after_it(
    engine: Engine, tmp_path: Path, started: list[Source]
) -> None:
    """The daemon ran in boot A; the node hung, rebooted (C), hung again, rebooted (B)."""
    devices = [device() for _ in range(6)]
    a, b, c = tmp_path / "a.journal", tmp_path / "b.journal", tmp_path / "c.journal"
    write_journal(a, [entry(BOOT_A, 10 + n, reset(devices[n], f"A#{n}")) for n in range(3)])
    before = Collector()
    source = start(started, before, journal(engine, files=[str(a)], boot_id=BOOT_A))
    assert read_to(before, BOOT_A, 12)
    source.stop()
    position = before.position("journal")
    assert position["boot_id"] == BOOT_A
    # Written after the daemon stopped: the rest of boot A, all of C, and B.
    write_journal(a, [entry(BOOT_A, 50, reset(devices[3], "A#3"))])
    write_journal(c, [entry(BOOT_C, 5, reset(devices[4], "C#0"))])
    write_journal(b, [entry(BOOT_B, 5, reset(devices[5], "B#0"))])
    after = Collector()
    files = [str(b), str(a), str(c)]  # the order of the files does not matter: boots are ordered by time
    start(started, after, journal(engine, files=files, boot_id=BOOT_B, position=position))
    assert read_to(after, BOOT_B, 5)
    assert [m.rsplit(" ", 1)[1] for m in messages(after)] == ["A#3", "C#0", "B#0"]


@needs_journal_remote
def test_events_are_never_grouped_across_boots(engine: Engine, tmp_path: Path, started: list[Source]) -> None:
    """A's last record opens a page fault; B's first is a status line of the same device, 0.5 s later by monotonic."""
    dev = device()
    a, b = tmp_path / "a.journal", tmp_path / "b.journal"
    write_journal(
        a, [entry(BOOT_A, 5, f"amdgpu {dev}: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)")]
    )
    write_journal(b, [entry(BOOT_B, 5.5, f"amdgpu {dev}: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031")])
    collector = Collector()
    start(started, collector, journal(engine, files=[str(a), str(b)], boot_id=BOOT_B))
    assert read_to(collector, BOOT_B, 5.5)
    events = collector.events()
    assert len(events) == 2
    assert [{record.boot_id for record in event.records} for event in events] == [{BOOT_A}, {BOOT_B}]


@needs_journal_remote
def test_records_appended_while_waiting_are_read_at_once(engine: Engine, tmp_path: Path, started: list[Source]) -> None:
    path = tmp_path / "b.journal"
    writer = JournalWriter(path)
    try:
        writer.write(entry(BOOT_B, 1, "Linux version 6.18.0"))
        deadline = time.monotonic() + 5
        while not path.exists():
            assert time.monotonic() < deadline, "systemd-journal-remote wrote no file"
            time.sleep(0.02)
        collector = Collector()
        source = start(started, collector, journal(engine, files=[str(path)], boot_id=BOOT_B))
        assert read_to(collector, BOOT_B, 1)
        time.sleep(1.3)  # idle in sd_journal_wait: progress is still reported
        health = source.health()
        assert health.last_progress is not None and time.time() - health.last_progress < 1.2
        dev = device()
        appended = time.monotonic()
        writer.write(entry(BOOT_B, 60, reset(dev)))
        assert collector.wait_for(lambda: any(event.device == dev for event in collector.events()), 2.0)
        assert time.monotonic() - appended < 1.5
    finally:
        writer.close()


@needs_journal_remote
def test_start_fails_when_the_journal_cannot_be_opened(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JournalSource(engine, files=[str(tmp_path / "missing.journal")]).start(Collector())
    with pytest.raises(OSError):
        JournalSource(engine, directory=str(tmp_path / "missing")).start(Collector())


def test_plan() -> None:
    boots = [BOOT_A, BOOT_C, BOOT_B]
    at_a = {"boot_id": BOOT_A, "cursor": "s=1"}
    assert plan(boots, BOOT_B, None) == [Step(BOOT_C, "tail"), Step(BOOT_B, "head", follow=True)]
    assert plan(boots, BOOT_B, None, previous_boot=False) == [Step(BOOT_B, "head", follow=True)]
    assert plan(boots, BOOT_B, {"boot_id": BOOT_B, "cursor": "s=2"}) == [Step(BOOT_B, "cursor", "s=2", follow=True)]
    assert plan(boots, BOOT_B, at_a) == [
        Step(BOOT_A, "cursor", "s=1"),
        Step(BOOT_C, "tail"),
        Step(BOOT_B, "head", follow=True),
    ]
    # The current boot not in the journal yet: the last one there is the previous boot.
    assert plan([BOOT_A, BOOT_C], BOOT_B, None) == [Step(BOOT_C, "tail"), Step(BOOT_B, "head", follow=True)]
    # The saved boot vacuumed away: like a first start.
    assert plan([BOOT_C, BOOT_B], BOOT_B, at_a) == [Step(BOOT_C, "tail"), Step(BOOT_B, "head", follow=True)]
    assert plan([], BOOT_B, {"boot_id": 7}) == [Step(BOOT_B, "head", follow=True)]


# ---------------------------------------------------------------------------
# A private journald reading the real /dev/kmsg.


@pytest.fixture
def journald() -> Iterator[PrivateJournald]:
    with private_journald() as running:
        yield running


@needs_journald
def test_journald_kernel_records_arrive_live(engine: Engine, journald: PrivateJournald, started: list[Source]) -> None:
    marker, dev = new_marker(), device()
    collector = Collector()
    start(started, collector, journal(engine, directory=str(journald.directory)))
    written = time.time()
    write_kmsg(f"<3>{reset(dev, marker)}")
    assert collector.wait_for(lambda: collector.events(marker), 3.0), "journald did not pass the record on"
    [event] = collector.events(marker)
    assert (event.category, event.device, event.first.boot_id) == ("gpu_reset", dev, current_boot_id())
    record = event.first
    assert record.fields["_TRANSPORT"] == "kernel" and record.fields["SYSLOG_FACILITY"] == "1"
    assert event.time is not None and abs(event.time - written) < 1.0


@needs_journald
def test_auto_picks_the_journal_when_it_holds_this_boot_else_kmsg(
    engine: Engine, journald: PrivateJournald, tmp_path: Path
) -> None:
    deadline = time.monotonic() + 5
    while select_kernel_source("auto", journal_directory=str(journald.directory))[0] != "journal":
        assert time.monotonic() < deadline, "the private journal never held a kernel record of this boot"
        time.sleep(0.05)
    empty = tmp_path / "empty"
    empty.mkdir()
    mode, why = select_kernel_source("auto", journal_directory=str(empty))
    assert mode == "kmsg" and "no kernel record of this boot" in why
    mode, why = select_kernel_source("auto", journal_directory=str(empty), kmsg_path=str(tmp_path / "no-kmsg"))
    assert mode == "none" and "no-kmsg" in why
    [source] = kernel_sources("auto", engine, {}, journal_directory=str(journald.directory))
    assert isinstance(source, JournalSource)


@needs_journald
def test_both_yields_each_record_once(engine: Engine, journald: PrivateJournald, started: list[Source]) -> None:
    marker = new_marker()
    devices = [device() for _ in range(4)]
    kmsg, journal_source = kernel_sources(
        "both", engine, {}, journal_directory=str(journald.directory), idle_flush=0.05
    )
    assert isinstance(kmsg, KmsgSource) and isinstance(journal_source, JournalSource)
    assert kmsg.dedupe is not None and kmsg.dedupe is journal_source.dedupe
    collector = Collector()  # one sink, as the daemon has
    start(started, collector, kmsg)
    start(started, collector, journal_source)
    write_kmsg(*(f"<3>{reset(dev, f'{marker} #{n}')}" for n, dev in enumerate(devices)))
    last = f"{marker} #3"

    def both_read_the_last() -> bool:
        """Each source has handed over a position at or after the last record."""
        kmsg_usec = (collector.position("kmsg") or {}).get("usec", 0)
        journal_usec = (collector.position("journal") or {}).get("usec", 0)
        [usec] = [round((r.monotonic or 0) * 1e6) for r in collector.records(last)] or [None]
        return usec is not None and kmsg_usec >= usec and journal_usec >= usec

    assert collector.wait_for(both_read_the_last, 5.0)
    found = sorted(record.message.rsplit("#", 1)[1] for record in collector.records(marker))
    assert found == ["0", "1", "2", "3"], "each record exactly once"
    assert kmsg.dedupe.duplicates >= 4


# ---------------------------------------------------------------------------
# KernelDedupe.


def capture_records() -> tuple[list[KernelRecord], list[KernelRecord]]:
    """The same real records read back from /dev/kmsg and from journald (tests/data/kernel)."""
    kmsg = list(parse_kernel_lines([(DATA / "kmsg.bin").read_bytes().decode()], "kmsg"))
    journal_records: list[KernelRecord] = []
    for line in (DATA / "journal-live.json").read_text().splitlines():
        record = journal_entry_record(json.loads(line), "journal", KernelParseStats())
        if record is not None:
            journal_records.append(record)
    boot = journal_records[0].boot_id
    for record in kmsg:
        record.boot_id = boot
    return kmsg, journal_records


def test_dedupe_knows_a_kmsg_record_in_the_journal() -> None:
    """journald splits `ident:` off user-facility records and decodes escapes: still the same key."""
    kmsg, journal_records = capture_records()
    dedupe = KernelDedupe()
    assert all(dedupe.first_time(record, "kmsg") for record in kmsg)
    seen_by_journal = [dedupe.first_time(record, "journal") for record in journal_records]
    # All but journald's own message at the end, which was logged after kmsg.bin was read.
    assert seen_by_journal == [False] * (len(journal_records) - 1) + [True]
    assert not dedupe.first_time(kmsg[5], "kmsg"), "whichever source comes second is skipped"


def test_dedupe_is_bounded_and_tells_boots_apart() -> None:
    kmsg, _ = capture_records()
    dedupe = KernelDedupe(capacity=3)
    for record in kmsg[:4]:
        assert dedupe.first_time(record)
    assert len(dedupe) == 3
    assert dedupe.first_time(kmsg[0]), "the oldest key was dropped"
    other_boot = KernelRecord(**{**_fields(kmsg[3]), "boot_id": BOOT_B})
    assert dedupe.first_time(other_boot)
    assert dedupe.first_time(KernelRecord(message="no stamp", raw=["no stamp"], index=0))
    assert dedupe.first_time(KernelRecord(message="no stamp", raw=["no stamp"], index=1))


def _fields(record: KernelRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in KernelRecord.__slots__}


def test_dedupe_seeded_from_saved_positions_skips_what_the_other_source_yielded() -> None:
    dedupe = KernelDedupe()
    dedupe.seed("kmsg", BOOT_A.upper(), 5_000_000)
    early = KernelRecord(message="x", raw=["x"], index=0, monotonic=4.0, boot_id=BOOT_A)
    late = KernelRecord(message="y", raw=["y"], index=1, monotonic=6.0, boot_id=BOOT_A)
    other_boot = KernelRecord(message="x", raw=["x"], index=2, monotonic=4.0, boot_id=BOOT_B)
    assert not dedupe.first_time(early, "journal"), "kmsg yielded it before the restart"
    assert dedupe.first_time(late, "journal")
    assert dedupe.first_time(other_boot, "journal")
    assert KernelDedupe().first_time(early, "journal")
    seeded = KernelDedupe()
    seeded.seed("kmsg", BOOT_A, 5_000_000)
    assert seeded.first_time(early, "kmsg"), "a source's own position does not hide its records"


@needs_journal_remote
@pytest.mark.skipif(kmsg_unusable() is not None, reason=str(kmsg_unusable()))
def test_both_after_a_restart_resumes_where_the_other_source_stood(
    engine: Engine, tmp_path: Path, started: list[Source]
) -> None:
    """kmsg had yielded up to 5 s of this boot, the journal up to 3 s: the journal resumes after 5 s."""
    boot = current_boot_id()
    boot_wall = int((time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)) * 1e6)
    directory = tmp_path / "journal"
    directory.mkdir()
    path = directory / "system.journal"
    write_journal(path, [entry(boot, 3 + n, reset(device(), f"#{n}"), boot_wall=boot_wall) for n in range(3)])
    positions = {
        # kmsg was ahead: its seq is beyond the ring, so it reads nothing now.
        "kmsg": {"boot_id": boot, "seq": 2**62, "usec": 5_000_000},
        "journal": {"cursor": _cursor_at(path, boot, 3), "boot_id": boot, "usec": 3_000_000},
    }
    sources = kernel_sources("both", engine, positions, journal_directory=str(directory), idle_flush=0.05)
    collector = Collector()
    for each in sources:
        start(started, collector, each)
    write_journal(path, [entry(boot, 7, reset(device(), "#3"), boot_wall=boot_wall)])
    assert read_to(collector, boot, 7)
    assert [m.rsplit("#", 1)[1] for m in messages(collector)] == ["3"], "#1 and #2 came from kmsg before"


def _cursor_at(path: Path, boot: str, seconds: float) -> str:
    """The cursor of the record at `seconds` in the journal file."""
    from systemd import journal as systemd_journal

    with systemd_journal.Reader(files=[str(path)]) as reader:
        reader.add_match(_BOOT_ID=boot)
        for item in reader:
            if item["_SOURCE_MONOTONIC_TIMESTAMP"].total_seconds() == seconds:
                return str(item["__CURSOR"])
    raise AssertionError("no such record")
