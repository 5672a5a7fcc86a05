"""Live correlation: incidents appear at once, grow, relabel and merge under stable ids."""

from __future__ import annotations

from pathlib import Path

from triage.live import LiveCorrelator, event_from_dict, event_key, failure_from_dict, failure_key
from triage.render import event_to_dict, failure_to_dict
from triage.store import Store

from .test_correlate import T0, event, failure


def test_incident_appears_then_a_late_kernel_fault_relabels_it_in_place() -> None:
    clock = iter([T0 + 1, T0 + 5]).__next__
    live = LiveCorrelator(clock=clock)
    first = live.add([], [failure("unclassified", T0, message="HIP error: unspecified launch failure")])
    assert [(i.level, i.category) for i in first.incidents] == [("code", "unclassified")]
    incident_id = first.incidents[0].id
    second = live.add([event("gpu_reset", T0 - 2)], [])
    assert [(i.id, i.level, i.category) for i in second.incidents] == [(incident_id, "driver", "gpu_reset")]
    assert [(c.field, c.old, c.new, c.at) for c in second.changes] == [
        ("level", "code", "driver", T0 + 5),
        ("category", "unclassified", "gpu_reset", T0 + 5),
    ]
    document = second.incidents[0].document
    assert [c["to"] for c in document["changes"]] == ["driver", "gpu_reset"]
    assert {row.kind for row in second.evidence} == {"kernel"}


def test_ranks_arriving_one_by_one_grow_one_incident() -> None:
    live = LiveCorrelator(clock=lambda: T0 + 10)
    ids = set()
    for rank in range(8):
        commit = live.add([], [failure("oom", T0 + rank * 0.2, rank=rank, message="HIP out of memory", line=rank)])
        ids |= {i.id for i in commit.incidents}
        assert commit.incidents[0].document["count"] == rank + 1
    assert len(ids) == 1


def test_same_evidence_twice_changes_nothing() -> None:
    live = LiveCorrelator(clock=lambda: T0 + 10)
    same = failure("oom", T0, message="HIP out of memory")
    assert live.add([], [same]).incidents
    again = live.add([], [failure("oom", T0, message="HIP out of memory")])
    assert not again.incidents and not again.evidence


def test_bridging_failure_merges_two_incidents_into_the_older() -> None:
    ticks = iter(range(1000))
    live = LiveCorrelator(clock=lambda: T0 + 500 + next(ticks))
    older = live.add([], [failure("oom", T0, message="a", line=1)]).incidents[0].id
    newer = live.add([], [failure("nan_loss", T0 + 100, message="b", line=3)]).incidents[0].id
    assert older != newer
    commit = live.add([], [failure("unclassified", T0 + 50, message="c", line=2)])
    merged = {i.id: i.merged_into for i in commit.incidents}
    assert merged[newer] == older and merged[older] is None


def test_old_evidence_leaves_the_window() -> None:
    now = [T0]
    live = LiveCorrelator(horizon=60, clock=lambda: now[0])
    live.add([], [failure("oom", T0, message="a")])
    now[0] = T0 + 1000
    live.add([], [failure("oom", T0 + 1000, message="b")])
    assert len(live.failures) == 1 and len(live.incidents) == 1


def test_an_old_log_read_now_still_makes_incidents() -> None:
    live = LiveCorrelator(horizon=60, clock=lambda: T0 + 86400)
    commit = live.add([], [failure("oom", T0, message="a day-old OOM")])
    assert [i.category for i in commit.incidents] == ["oom"]


def test_documents_round_trip_for_a_restart() -> None:
    original_event = event("vm_page_fault", T0, pid=7, process="python")
    original_event.fields["page"] = "12"
    again = event_from_dict(event_to_dict(original_event) | {"hint": "h"})
    assert (again.category, again.device, again.pid, again.time, again.fields) == (
        "vm_page_fault",
        "0000:c1:00.0",
        7,
        T0,
        {"page": "12"},
    )
    original_failure = failure("oom", T0, rank=3, message="HIP out of memory")
    back = failure_from_dict(failure_to_dict(original_failure))
    assert (back.category, back.rank, back.message, abs((back.time or 0) - T0) < 0.001) == (
        "oom",
        3,
        "HIP out of memory",
        True,
    )
    assert event_key(original_event) == event_key(original_event)
    assert failure_key(original_failure) == failure_key(back) or back.time != original_failure.time


def test_restart_restores_the_window_and_keeps_ids(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.db")
    live = LiveCorrelator(clock=lambda: T0 + 1)
    commit = live.add([], [failure("illegal_memory_access", T0, message="Memory access fault by GPU node-1")])
    store.commit(commit)
    incident_id = commit.incidents[0].id
    # A new process: what the store kept comes back, and a late kernel fault relabels the same incident.
    restarted = LiveCorrelator(clock=lambda: T0 + 20)
    restarted.restore(store.evidence_since(T0 - 3600), [s for s in store.incidents(limit=1000)[0]])
    late = restarted.add([event("vm_page_fault", T0 - 0.5, pid=None, process="python")], [])
    store.commit(late)
    assert [(i.id, i.category) for i in late.incidents] == [(incident_id, "vm_page_fault")]
    stored = store.incident(incident_id)
    assert stored is not None and stored.level == "driver"
    assert [(c.field, c.new) for c in store.changes(incident_id)] == [
        ("level", "driver"),
        ("category", "vm_page_fault"),
    ]
