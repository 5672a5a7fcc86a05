"""The correlator's rules, on evidence built by hand (no parsing involved)."""

from __future__ import annotations

from triage.correlate import correlate
from triage.model import KernelEvent, KernelRecord, ProgramFailure

T0 = 1_764_500_000.0  # a fixed wall time


def event(
    category: str,
    at: float,
    *,
    rule_id: str = "",
    device: str | None = "0000:c1:00.0",
    pid: int | None = None,
    process: str | None = None,
    count: int = 1,
) -> KernelEvent:
    record = KernelRecord(message=f"{category} line", raw=[f"{category} line"], index=int(at), origin="kern.log")
    found = KernelEvent(
        rule_id=rule_id or f"test.{category}",
        category=category,
        title=category.replace("_", " "),
        records=[record],
        device=device,
        pid=pid,
        process=process,
        count=count,
    )
    found.time = at
    return found


def failure(
    category: str,
    at: float | None,
    *,
    message: str = "boom",
    rank: int | None = None,
    pid: int | None = None,
    follow_on: bool = False,
    fields: dict[str, str] | None = None,
    line: int = 10,
) -> ProgramFailure:
    return ProgramFailure(
        kind="traceback",
        lines=[f"RuntimeError: {message}"],
        text=f"RuntimeError: {message}",
        origin="train.log",
        line_number=line,
        exception_type="RuntimeError",
        message=message,
        time=at,
        time_source="stamp",
        rank=rank,
        pid=pid,
        rule_id=f"test.{category}",
        category=category,
        title=f"{category} title",
        hint=f"{category} hint",
        follow_on=follow_on,
        fields=fields or {},
    )


def test_symptom_is_explained_by_gpu_reset_in_window() -> None:
    incidents = correlate([event("gpu_reset", T0 - 3.2)], [failure("unclassified", T0, message="HIP error")])
    assert len(incidents) == 1
    first = incidents[0]
    assert (first.level, first.category) == ("driver", "gpu_reset")
    assert any("0000:c1:00.0" in line and "3.2 s before" in line for line in first.evidence), first.evidence
    assert first.program_failures and first.kernel_events


def test_self_explaining_failure_keeps_its_label_despite_other_process_fault() -> None:
    fault = event("vm_page_fault", T0 - 4, pid=1671, process="kwin_wayland")
    incidents = correlate([fault], [failure("oom", T0, message="HIP out of memory", pid=4242)])
    labels = [(i.level, i.category) for i in incidents]
    assert ("code", "oom") in labels
    oom = next(i for i in incidents if i.category == "oom")
    assert not oom.kernel_events
    # The fault is still reported, as the node-level fact it is.
    assert ("driver", "vm_page_fault") in labels


def test_page_fault_of_another_process_does_not_relabel_a_symptom() -> None:
    fault = event("vm_page_fault", T0 - 1, pid=1671, process="kwin_wayland")
    incidents = correlate([fault], [failure("illegal_memory_access", T0)])
    code = next(i for i in incidents if i.level == "code")
    assert code.category == "illegal_memory_access"
    assert not code.kernel_events


def test_page_fault_of_the_training_process_makes_it_vm_page_fault() -> None:
    fault = event("vm_page_fault", T0 - 0.01, pid=5578, process="python")
    incidents = correlate([fault], [failure("illegal_memory_access", T0)])
    assert [(i.level, i.category) for i in incidents] == [("driver", "vm_page_fault")]


def test_collective_timeout_window_is_the_collective_timeout() -> None:
    timeout = {"timeout_ms": "1800000"}
    reset_25_min_before = event("gpu_reset", T0 - 25 * 60)
    linked = correlate([reset_25_min_before], [failure("collective_failure", T0, fields=timeout)])
    assert [(i.level, i.category) for i in linked] == [("driver", "gpu_reset")]
    reset_40_min_before = event("gpu_reset", T0 - 40 * 60)
    apart = correlate([reset_40_min_before], [failure("collective_failure", T0, fields=timeout)])
    assert sorted((i.level, i.category) for i in apart) == [("code", "collective_failure"), ("driver", "gpu_reset")]


def test_page_fault_long_before_a_memory_fault_is_not_its_cause() -> None:
    incidents = correlate([event("vm_page_fault", T0 - 600)], [failure("illegal_memory_access", T0)])
    assert len(incidents) == 2


def test_eight_ranks_one_incident_with_counts() -> None:
    failures = [failure("oom", T0 + rank * 0.1, rank=rank, message="HIP out of memory") for rank in range(8)]
    incidents = correlate([], failures)
    assert len(incidents) == 1
    assert incidents[0].count == 8
    assert incidents[0].ranks == list(range(8))
    assert any("8 ranks (0-7)" in line for line in incidents[0].evidence)


def test_follow_on_does_not_name_the_incident() -> None:
    incidents = correlate(
        [],
        [
            failure("wrong_arch", T0, message="invalid device function"),
            failure("unclassified", T0 + 1, message="ChildFailedError", follow_on=True, line=40),
        ],
    )
    assert [(i.level, i.category) for i in incidents] == [("code", "wrong_arch")]


def test_kernel_storm_is_one_incident() -> None:
    storm = [event("vm_page_fault", T0 + i * 0.001, pid=7, process="python", count=1) for i in range(1000)]
    incidents = correlate(storm, [])
    assert len(incidents) == 1
    assert incidents[0].count == 1000


def test_reset_then_hang_on_one_gpu_is_one_incident_named_by_priority() -> None:
    events = [event("gpu_hang", T0), event("gpu_reset", T0 + 0.5), event("vm_page_fault", T0 + 1)]
    incidents = correlate(events, [])
    assert [(i.level, i.category) for i in incidents] == [("driver", "gpu_reset")]


def test_two_gpus_two_incidents() -> None:
    events = [event("gpu_reset", T0, device="0000:c1:00.0"), event("gpu_reset", T0 + 1, device="0000:83:00.0")]
    assert len(correlate(events, [])) == 2


def test_unaligned_clocks_say_so() -> None:
    fault = event("vm_page_fault", 0.0)
    incidents = correlate([fault], [failure("illegal_memory_access", T0)], one_window=True, clock_note="no clock")
    assert incidents[0].category == "vm_page_fault"
    assert incidents[0].clock == "one_window"
    assert any(line.startswith("clock: no clock") for line in incidents[0].evidence)


def test_order_driver_first_then_newest() -> None:
    incidents = correlate(
        [event("gpu_reset", T0 - 7200)],
        [failure("oom", T0, message="a"), failure("nan_loss", T0 + 4000, message="b")],
    )
    assert [i.category for i in incidents] == ["gpu_reset", "nan_loss", "oom"]


def test_fingerprint_is_stable_across_addresses_and_numbers() -> None:
    a = correlate([], [failure("oom", T0, message="Tried to allocate 124.00 MiB at 0x7f00")])
    b = correlate([], [failure("oom", T0 + 9999, message="Tried to allocate 2.00 MiB at 0x1234")])
    assert a[0].fingerprint == b[0].fingerprint
    assert a[0].id != b[0].id


def test_same_fault_address_links_and_says_so() -> None:
    fault = event("vm_page_fault", T0 - 0.001, pid=18204, process="debayer")
    fault.fields["page"] = str(0x508400)  # gmc v8: "VM fault (...) at page 5276672"
    memory_fault = failure("illegal_memory_access", T0, message="Memory access fault by GPU node-1")
    memory_fault.address = "0x508400000"
    memory_fault.pid = 4242  # another pid than the kernel's: the address still ties them
    incidents = correlate([fault], [memory_fault])
    assert [(i.level, i.category) for i in incidents] == [("driver", "vm_page_fault")]
    assert any("same fault address 0x508400000" in line for line in incidents[0].evidence)


def test_correlate_is_pure_same_inputs_same_answer() -> None:
    failures = [failure("oom", T0 + rank, rank=rank, message="HIP out of memory") for rank in range(4)]
    events = [event("gpu_reset", T0 - 5)]
    first = correlate(events, failures)
    second = correlate(events, failures)
    assert [(i.category, i.count, i.ranks) for i in first] == [(i.category, i.count, i.ranks) for i in second]
    assert all(f.count == 1 and f.ranks == [] for f in failures)


def test_first_observed_cause_names_the_crash_not_a_later_one() -> None:
    incidents = correlate(
        [],
        [
            failure("unclassified", T0 - 1, message="symptom first", line=1),
            failure("dtype_config", T0, message="expected scalar type", rank=2, line=5),
            failure("missing_op", T0 + 2, message="not implemented for 'Half'", rank=1, line=39),
        ],
    )
    assert [i.category for i in incidents] == ["dtype_config"]
