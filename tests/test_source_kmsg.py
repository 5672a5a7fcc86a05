"""KmsgSource against the real /dev/kmsg: records written as root, read back live.

The ring holds every other record of this machine too (and those of earlier
runs), so each test writes a marker of its own and a PCI domain of its own (the
event builder folds identical faults of one device within seconds) and looks
only at what carries them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.batches import Collector
from tests.support.kmsg import kmsg_unusable, new_marker, read_ring, ring_bytes, seq_of, write_kmsg
from triage.engine import Engine
from triage.sources.kernel import current_boot_id
from triage.sources.kmsg import KmsgSource, seq_gap

pytestmark = pytest.mark.skipif(kmsg_unusable() is not None, reason=str(kmsg_unusable()))


def device() -> str:
    """A PCI address no other test (or earlier run) uses."""
    return f"{uuid.uuid4().hex[:4]}:c1:00.0"


def reset(dev: str, marker: str) -> str:
    return f"<3>amdgpu {dev}: amdgpu: GPU reset begin! {marker}"


@pytest.fixture
def started(engine: Engine) -> Iterator[list[KmsgSource]]:
    """Sources a test starts; stopped at the end whatever happens."""
    sources: list[KmsgSource] = []
    yield sources
    for source in sources:
        source.stop()


def start(engine: Engine, started: list[KmsgSource], collector: Collector, **options: object) -> KmsgSource:
    source = KmsgSource(engine, idle_flush=0.05, **options)  # type: ignore[arg-type]
    source.start(collector)
    started.append(source)
    return source


def test_a_gpu_reset_written_to_kmsg_is_an_event_within_a_second(engine: Engine, started: list[KmsgSource]) -> None:
    marker, dev = new_marker(), device()
    collector = Collector()
    source = start(engine, started, collector)
    written = time.time()
    write_kmsg(reset(dev, marker))
    assert collector.wait_for(lambda: collector.events(marker), 2.0), "no event within 2 s"
    [event] = collector.events(marker)
    assert (event.category, event.rule_id, event.device) == ("gpu_reset", "amdgpu.gpu_reset.begin", dev)
    assert event.hint, "the rule's hint is filled in"
    # Written from user space, the record has the user facility: kept all the same.
    assert event.first.fields["SYSLOG_FACILITY"] == "1"
    assert event.first.boot_id == current_boot_id()
    # On the wall clock: boot time + the kernel's stamp, close to when it was written.
    assert event.time is not None and abs(event.time - written) < 1.0
    position = collector.position("kmsg")
    assert position["boot_id"] == current_boot_id() and position["seq"] >= event.first.seq
    health = source.health()
    assert health.alive and health.records > 0 and health.lost == 0
    assert health.last_record is not None and abs(health.last_record - written) < 1.0
    assert health.lag is not None and health.lag < 1.0


def test_restart_from_the_saved_position_repeats_nothing_and_loses_nothing(
    engine: Engine, started: list[KmsgSource]
) -> None:
    marker = new_marker()
    devices = [device() for _ in range(5)]
    first = Collector()
    source = start(engine, started, first)
    write_kmsg(*(reset(dev, f"{marker} #{n}") for n, dev in enumerate(devices[:3])))
    assert first.wait_for(lambda: len(first.records(marker)) == 3)
    source.stop()
    position = first.position("kmsg")
    # Written while the daemon is down: must be read after the restart.
    write_kmsg(*(reset(dev, f"{marker} #{n + 3}") for n, dev in enumerate(devices[3:])))
    second = Collector()
    start(engine, started, second, position=position)
    assert second.wait_for(lambda: len(second.records(marker)) == 2)
    time.sleep(0.2)  # anything repeated would come now
    before = [record.message.rsplit("#", 1)[1] for record in first.records(marker)]
    after = [record.message.rsplit("#", 1)[1] for record in second.records(marker)]
    assert (before, after) == (["0", "1", "2"], ["3", "4"])
    assert all(record.seq is not None and record.seq > position["seq"] for record in second.records(marker))
    assert {event.device for event in second.events(marker)} == set(devices[3:])


def test_a_position_of_another_boot_starts_from_the_beginning_of_the_ring(
    engine: Engine, started: list[KmsgSource]
) -> None:
    marker, dev = new_marker(), device()
    write_kmsg(reset(dev, marker))
    oldest = seq_of(read_ring()[0])
    collector = Collector()
    # A huge seq of another boot: honoured, it would skip the whole ring.
    source = start(engine, started, collector, position={"boot_id": "0" * 32, "seq": 10**12})
    assert collector.wait_for(lambda: collector.records(marker), 2.0)
    assert collector.wait_for(lambda: source.health().records >= 1 and collector.position("kmsg") is not None)
    source.stop()
    health = source.health()
    assert health.lost == 0, "no gap is counted across boots"
    # Every record from the ring's oldest on was read (records + skipped), none skipped as seen before.
    assert health.records + health.skipped == collector.position("kmsg")["seq"] - oldest + 1


def test_overrun_is_counted_from_the_sequence_gap_and_reading_goes_on(
    engine: Engine, started: list[KmsgSource]
) -> None:
    """A real ring overrun: the source is held in a slow sink while more than the ring's size is written.

    Debug-level records (printk level 7) stay off the console. Each record is
    written through its own open file to stay under the kernel's per-file rate limit.
    """
    size = ring_bytes()
    if size > 16 * 1024 * 1024:
        pytest.skip(f"the kernel ring is {size} bytes: too large to overrun quickly")
    marker, dev = new_marker(), device()
    oldest = seq_of(read_ring()[0])
    collector = Collector()
    collector.open.clear()  # the first batch blocks the reading thread in the sink
    source = start(engine, started, collector)
    time.sleep(0.3)  # it reads the ring, goes idle and hands over its first batch: held
    filler = "x" * 900
    flood = size * 3 // 2 // 900 + 20
    write_kmsg(*(f"<7>{marker} flood {n} {filler}" for n in range(flood)))
    collector.open.set()
    write_kmsg(reset(dev, marker))
    assert collector.wait_for(lambda: collector.events(marker), 3.0), "the source stopped after the overrun"
    source.stop()
    health = source.health()
    assert health.detail["overruns"] >= 1
    assert health.lost > 0
    # Each sequence number from the ring's oldest at start to the last one read: read, skipped or lost.
    last = collector.position("kmsg")["seq"]
    assert health.records + health.skipped + health.lost == last - oldest + 1
    [event] = collector.events(marker)
    assert event.device == dev

    # Restarting from a position whose successors rotated out of the ring: they are counted lost.
    ring = read_ring()
    now_oldest = seq_of(ring[0])
    assert now_oldest > oldest + 1
    again = Collector()
    resumed = start(engine, started, again, position={"boot_id": current_boot_id(), "seq": oldest})
    assert again.wait_for(lambda: again.position("kmsg") is not None and again.position("kmsg")["seq"] >= last)
    assert resumed.health().lost == now_oldest - oldest - 1


def test_start_fails_when_the_device_cannot_be_opened(engine: Engine) -> None:
    source = KmsgSource(engine, path="/nonexistent/kmsg")
    with pytest.raises(OSError):
        source.start(Collector())
    assert not source.health().alive


def test_seq_gap() -> None:
    assert [seq_gap(None, 5), seq_gap(4, 5), seq_gap(4, 9), seq_gap(9, 4)] == [0, 0, 4, 0]


def test_stop_is_prompt_and_flushes(engine: Engine) -> None:
    marker, dev = new_marker(), device()
    collector = Collector()
    source = KmsgSource(engine, idle_flush=30.0)  # never idle long enough: stop must hand over the batch
    source.start(collector)
    write_kmsg(reset(dev, marker))
    time.sleep(0.2)  # read by now; handed over only by the 1 s flood rule or by stop
    assert not collector.records(marker)
    stopped = time.monotonic()
    source.stop()
    assert time.monotonic() - stopped < 0.5
    assert not source.health().alive
    assert collector.records(marker), "stop handed over the pending batch"
    assert not any(thread.name == "triage-kmsg" for thread in threading.enumerate())
