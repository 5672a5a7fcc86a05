"""Kernel records -> KernelEvents: grouping multi-line faults, ordering, folding storms.

Rules come from the shipped catalog where it has them; the catalog grows while
this is written, so a rule it lacks is built here with the same group as the
shipped page-fault header.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from triage.kernel.events import MAX_EVENT_LINES, KernelEventBuilder, build_events, device_of
from triage.kernel.formats import parse_kernel_lines, read_kernel_stream
from triage.model import KernelEvent, KernelRecord
from triage.patterns import Catalog, Rule, load_catalog, parse_rule

DATA = Path(__file__).resolve().parent / "data" / "kernel"
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus" / "cases.jsonl"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _test_rule(rule_id: str, regex: str, category: str, example: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": rule_id,
        "source": "kernel",
        "regex": regex,
        "category": category,
        "title": rule_id,
        "hint": "test rule",
        "match": [example],
        **extra,
    }


def shipped_or_built(catalog: Catalog, raw: dict[str, Any]) -> Rule:
    """The shipped rule of this id if there is one, else the rule described here."""
    return catalog.by_id(raw["id"]) or parse_rule(raw, "test")


@pytest.fixture(scope="module")
def rules(catalog: Catalog) -> list[Rule]:
    """A page fault header, its detail lines, a GPU reset and NVIDIA's fallen-off-the-bus lines."""
    header = shipped_or_built(
        catalog,
        _test_rule(
            "amdgpu.vm_fault.header",
            r"\[(?:gfxhub|mmhub)\d?\] (?:no-)?(?:retry )?page fault \(src_id:\d+ ring:\d+ vmid:\d+ pasid:\d+",
            "vm_page_fault",
            "amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
            group="amdgpu_fault",
        ),
    )
    group = header.group or "amdgpu_fault"
    details = {
        "test.vm_fault.address": (
            r"in page starting at address (?P<address>0x[0-9a-fA-F]+)",
            "  in page starting at address 0x1",
        ),
        "test.vm_fault.process": (
            r"^\S+ \S+: (?:amdgpu: )?\s*(?:Process|in process) (?P<process>\S+) pid (?P<pid>\d+)",
            "a 0000:c2:00.0:  Process python pid 1",
        ),
        "test.vm_fault.status": (
            r"(?:GC)?VM_L2_PROTECTION_FAULT_STATUS:0x[0-9A-Fa-f]+",
            "GCVM_L2_PROTECTION_FAULT_STATUS:0x0",
        ),
        "test.vm_fault.fields": (
            r"(?:Faulty UTCL2 client ID|MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW):",
            "MORE_FAULTS: 0x1",
        ),
    }
    built = [
        parse_rule(_test_rule(rule_id, regex, "vm_page_fault", example, group=group, role="detail"), "test")
        for rule_id, (regex, example) in details.items()
    ]
    reset = shipped_or_built(
        catalog, _test_rule("amdgpu.gpu_reset.begin", r"GPU reset begin!", "gpu_reset", "GPU reset begin!")
    )
    fallen = parse_rule(
        _test_rule("test.nvidia.fallen_off_bus", r"fallen off the bus", "gpu_lost", "fallen off the bus"), "test"
    )
    return [header, *built, reset, fallen]


def corpus_records(case_prefix: str, year: int = 2025) -> list[KernelRecord]:
    if not CORPUS.exists():
        pytest.skip("corpus not present (../shared/corpus/cases.jsonl)")
    with open(CORPUS, encoding="utf-8") as corpus:
        for line in corpus:
            case = json.loads(line)
            if case["id"].startswith(case_prefix):
                return list(parse_kernel_lines(str(case["kernel_log"]).split("\n"), case["id"], reference_year=year))
    pytest.fail(f"no corpus case {case_prefix}")


def fixture_records(name: str) -> list[KernelRecord]:
    with open(DATA / name, "rb") as stream:
        return list(read_kernel_stream(stream, name, reference_year=2026))


def faults(events: list[KernelEvent]) -> list[KernelEvent]:
    return [event for event in events if event.category == "vm_page_fault"]


# ---------------------------------------------------------------------------
# grouping


def test_page_fault_groups_with_its_status_lines(rules: list[Rule]) -> None:
    events = build_events(corpus_records("therock1271"), rules)
    first, second = events
    assert first.rule_id == rules[0].id and first.category == "vm_page_fault"
    assert len(first.records) == 10  # header, process, address, STATUS and its six fields
    assert first.device == "0000:c2:00.0" and first.pid == 5578 and first.process == "python"
    assert first.address == "0x00007f5e85f94000"
    assert set(first.detail_rules) == {
        "test.vm_fault.process",
        "test.vm_fault.address",
        "test.vm_fault.status",
        "test.vm_fault.fields",
    }
    # the excerpt ends inside a second fault: its header, process and address only
    assert len(second.records) == 3 and second.address == "0x00007f5e85f72000" and second.count == 1


def test_page_fault_with_the_shipped_catalog(catalog: Catalog) -> None:
    events = build_events(corpus_records("rocm5225"), catalog.for_source("kernel"))
    fault = faults(events)[0]
    assert fault.device == "0000:74:00.0" and fault.pid == 3416 and fault.process == "python3"
    assert fault.address == "0x00007bf2f3408000"


def test_header_printed_after_its_status_lines_names_the_fault(rules: list[Rule]) -> None:
    """journald printed the STATUS lines before the header (corpus cachyos960): one fault."""
    for records in (corpus_records("cachyos960"), fixture_records("journal-short.txt")):
        fault = next(event for event in faults(build_events(records, rules)) if event.device == "0000:0d:00.0")
        assert fault.rule_id == rules[0].id
        assert fault.records[0].message == "amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031"
        assert "test.vm_fault.status" in fault.detail_rules
        assert fault.pid == 1671 and fault.process == "kwin_wayland"
        assert fault.address == "0x00000043800e1000"
        assert len(fault.records) >= 6


def test_status_lines_long_before_a_header_stay_their_own_fault(rules: list[Rule]) -> None:
    lines = [
        "[  10.000000] amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031",
        "[  11.500000] amdgpu 0000:0d:00.0: [gfxhub] page fault (src_id:0 ring:24 vmid:4 pasid:10)",
    ]
    status, header = build_events(parse_kernel_lines(lines), rules)
    assert status.rule_id == "test.vm_fault.status" and header.rule_id == rules[0].id


def test_two_gpus_interleaving_give_two_faults(rules: list[Rule]) -> None:
    for name in ("dmesg.txt", "kmsg.bin", "journal-json.json", "journal-short-monotonic.txt"):
        events = faults(build_events(fixture_records(name), rules))
        last_two = events[-2:]
        assert [event.device for event in last_two] == ["0000:c2:00.0", "0000:c3:00.0"], name
        c2, c3 = last_two
        assert c2.address == "0x00007f5e85f94000" and c3.address == "0x00007f0000001000"
        assert all(record.message.startswith("amdgpu 0000:c2:00.0") for record in c2.records)
        assert all(record.message.startswith("amdgpu 0000:c3:00.0") for record in c3.records)
        assert len(c2.records) == len(c3.records) == 3


def test_a_fault_closes_when_time_moves_on(rules: list[Rule]) -> None:
    lines = [
        "[  10.000000] amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
        "[  13.000000] amdgpu 0000:c2:00.0: amdgpu:   in page starting at address 0x00007f5e85f94000 from client 10",
    ]
    header, late_detail = build_events(parse_kernel_lines(lines), rules)
    assert len(header.records) == 1 and header.address is None
    assert late_detail.rule_id == "test.vm_fault.address"


def test_with_no_clock_a_fault_closes_after_many_records(rules: list[Rule]) -> None:
    header = "amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)"
    detail = "amdgpu 0000:c2:00.0: amdgpu:   in page starting at address 0x00007f5e85f94000 from client 10"
    near = build_events(parse_kernel_lines([header, "unrelated", detail]), rules)
    far = build_events(parse_kernel_lines([header, *["unrelated"] * 300, detail]), rules)
    assert len(near) == 1 and len(near[0].records) == 2
    assert len(far) == 2


def test_nvrm_fallen_off_the_bus_on_three_lines_is_one_event(rules: list[Rule]) -> None:
    events = build_events(corpus_records("nvidia-nvsentinel155"), rules)
    (fallen,) = events
    assert fallen.category == "gpu_lost" and fallen.device == "0000:b3:00.0"
    assert len(fallen.lines) == 3 and fallen.lines[2].strip().startswith("NVRM: fallen off the bus")
    for name in ("dmesg.txt", "journal-export.export", "kmsg.bin"):
        lost = [event for event in build_events(fixture_records(name), rules) if event.category == "gpu_lost"]
        assert [event.device for event in lost] == ["0000:b3:00.0", "0000:0a:00.0"], name  # and the Xid 79
        assert lost[0].records[0].message.count("\n") == 2


def test_records_of_other_programs_never_make_events() -> None:
    everything = parse_rule(
        _test_rule("test.anything", r"HIP error|worker 0 failed|not a kernel line|capture done", "unclassified", "x"),
        "test",
    )
    for name in ("journal-short.txt", "journal-json.json", "journal-export.export", "journal-live.json"):
        assert build_events(fixture_records(name), [everything]) == [], name


# ---------------------------------------------------------------------------
# counts, order, folding


def test_callbacks_suppressed_go_to_the_next_event(rules: list[Rule]) -> None:
    (fault,) = build_events(corpus_records("rocm2804"), rules)
    assert fault.suppressed == 41
    first = faults(build_events(corpus_records("amdgpu150"), rules))[0]
    assert first.suppressed == 1
    lines = [
        "[ 1.0] print_sq_intr_info_error: 182 callbacks suppressed",
        "[ 1.1] amdgpu: sq_intr: error, detail 0x00000000, type 2",
        "[ 1.2] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
    ]
    builder = KernelEventBuilder(rules)
    events = [event for record in parse_kernel_lines(lines) for event in builder.feed(record)] + builder.flush()
    assert [event.suppressed for event in events] == [182]  # the next event, whatever its device
    assert builder.stats.suppressed_lines == 1 and builder.stats.unmatched == 1


def test_events_come_out_in_order_of_their_first_record(rules: list[Rule]) -> None:
    lines = [
        "[ 5.000] amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
        "[ 5.001] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "[ 5.002] amdgpu 0000:c2:00.0: amdgpu:   in page starting at address 0x00007f5e85f94000 from client 10",
    ]
    builder = KernelEventBuilder(rules)
    fed = [builder.feed(record) for record in parse_kernel_lines(lines)]
    assert fed == [[], [], []]  # the reset waits behind the open fault that began before it
    events = builder.flush()
    assert [event.rule_id for event in events] == [rules[0].id, "amdgpu.gpu_reset.begin"]
    assert [event.index for event in events] == [0, 1]


def test_events_are_released_while_streaming(rules: list[Rule]) -> None:
    builder = KernelEventBuilder(rules)
    first = builder.feed(KernelRecord("amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", ["x"], 0, monotonic=1.0))
    assert first == []  # it may still fold with an identical reset
    later = builder.feed(KernelRecord("amdgpu 0000:c9:00.0: something else", ["y"], 1, monotonic=30.0))
    assert [event.rule_id for event in later] == ["amdgpu.gpu_reset.begin"]
    assert builder.flush() == []


def fault_lines(number: int, device: str = "0000:c2:00.0", pid: int = 5578, spacing: float = 0.001) -> list[str]:
    """The four lines of one page fault, `spacing` seconds after the previous one, at a new address."""
    prefix = f"[{100 + number * spacing:14.6f}] amdgpu {device}: amdgpu:"
    address = f"0x{0x7F0000000000 + number * 4096:016x}"
    return [
        f"{prefix} [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
        f"{prefix}  Process python pid {pid} thread python pid {pid}",
        f"{prefix}   in page starting at address {address} from client 10",
        f"{prefix} GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
    ]


def storm(count: int, **kwargs: Any) -> Iterator[str]:
    for number in range(count):
        yield from fault_lines(number, **kwargs)


def test_a_storm_of_1000_page_faults_is_one_event(rules: list[Rule]) -> None:
    builder = KernelEventBuilder(rules)
    events: list[KernelEvent] = []
    for record in parse_kernel_lines(storm(1000)):
        events.extend(builder.feed(record))
    events.extend(builder.flush())
    (event,) = events
    assert event.count == 1000 and event.pid == 5578
    assert len(event.lines) <= MAX_EVENT_LINES and len(event.records) == 5 * 4
    addresses = event.fields["addresses"].split(",")
    assert len(addresses) == 10 and addresses[0] == "0x00007f0000000000"
    assert builder.stats.folded == 999 and builder.stats.records == 4000


def test_a_storm_holds_bounded_memory(rules: list[Rule]) -> None:
    """Memory does not grow with the storm: 10x the faults, about the same peak."""

    def peak(count: int) -> int:
        tracemalloc.start()
        events = build_events(parse_kernel_lines(storm(count, spacing=0.01)), rules)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert sum(event.count for event in events) == count
        assert all(len(event.lines) <= MAX_EVENT_LINES for event in events)
        return top

    small, large = peak(200), peak(2_000)  # 2 s and 20 s of faults: one event per 10 s window
    assert large < 2 * small


def test_identical_faults_of_two_gpus_fold_per_gpu(rules: list[Rule]) -> None:
    lines = []
    for number in range(50):
        lines += fault_lines(number, device="0000:c2:00.0") + fault_lines(number, device="0000:c3:00.0", pid=6000)
    events = build_events(parse_kernel_lines(lines), rules)
    assert [(event.device, event.count) for event in events] == [("0000:c2:00.0", 50), ("0000:c3:00.0", 50)]


def test_identical_events_far_apart_are_not_folded(rules: list[Rule]) -> None:
    def resets(*stamps: float) -> list[int]:
        lines = [f"[{stamp:.6f}] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!" for stamp in stamps]
        return [event.count for event in build_events(parse_kernel_lines(lines), rules)]

    assert resets(1.0, 60.0) == [1, 1]
    assert resets(1.0, 5.0) == [2]


def test_german_dmesg_faults_fold_with_their_addresses(rules: list[Rule]) -> None:
    (event,) = build_events(corpus_records("rocm5151"), rules)
    assert event.count == 3 and event.pid == 15273 and event.process == "llama-server"
    assert event.fields["addresses"] == "0x00007f2b03da7000,0x00007f2b03d5e000,0x00007f2b03d58000"


# ---------------------------------------------------------------------------
# devices


@pytest.mark.parametrize(
    ("message", "device"),
    [
        ("amdgpu 0000:C1:00.0: amdgpu: GPU reset begin!", "0000:c1:00.0"),
        ("pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0", "0000:00:03.0"),
        ("NVRM: Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "0000:0a:00.0"),
        ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has", "0000:b3:00.0"),
        ("amdgpu: probe of 0000:83:00.0 failed with error -12", "0000:83:00.0"),
        ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout", None),
    ],
)
def test_device_of(message: str, device: str | None) -> None:
    assert device_of(message) == device


def test_device_from_a_rule_group_wins() -> None:
    assert device_of("anything 0000:01:00.0: x", "0a:00.0") == "0000:0a:00.0"


def test_builder_stats_add_up(rules: list[Rule]) -> None:
    records = fixture_records("kmsg.bin")
    builder = KernelEventBuilder(rules)
    for record in records:
        builder.feed(record)
    builder.flush()
    counted = builder.stats
    assert counted.records == len(records) == counted.matched + counted.unmatched + counted.suppressed_lines
