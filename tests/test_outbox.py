"""The alert outbox in the store: migration, atomicity, coalescing, the worker's transitions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from triage.store import MIGRATIONS, SCHEMA_VERSION, Commit, OutboxItem, Store, StoredIncident

T0 = 1_764_500_000.0


def incident(number: int, *, ranks: int = 1) -> StoredIncident:
    when = T0 + number
    return StoredIncident(
        id=f"inc-{number:04d}",
        level="code",
        category="oom",
        fingerprint=f"fp{number}",
        first_seen=when,
        last_seen=when,
        created=when,
        updated=when,
        document={"id": f"inc-{number:04d}", "ranks": ranks},
    )


def alert(number: int, kind: str = "new", *, sink: str = "slack", ranks: int = 1, due: float | None = T0) -> OutboxItem:
    return OutboxItem(sink, f"inc-{number:04d}", kind, {"id": f"inc-{number:04d}", "ranks": ranks}, due=due)


def test_a_v1_database_migrates_to_v2_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "triage.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
    db.execute(
        "INSERT INTO incidents (id, level, category, fingerprint, first_seen, last_seen, sort_time, created, updated,"
        " merged_into, document) VALUES ('old', 'driver', 'xid', 'fp', 1, 2, 2, 1, 2, NULL, '{\"id\": \"old\"}')"
    )
    db.execute("INSERT INTO positions (source, position, updated) VALUES ('kmsg', '{\"seq\": 5}', 1)")
    db.commit()
    assert "outbox" not in {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()

    store = Store(path)
    version = store.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 2
    kept = store.incident("old")
    assert kept is not None and kept.level == "driver" and kept.document == {"id": "old"}
    assert store.positions() == {"kmsg": {"seq": 5}}
    indexes = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"outbox_due", "outbox_incident"} <= indexes
    store.commit(Commit(alerts=[OutboxItem("slack", "old", "resolved", {"id": "old"}, due=T0)]))
    assert [(a.kind, a.state, a.attempts) for a in store.due_alerts("slack", T0)] == [("resolved", "pending", 0)]
    store.close()
    Store(path).close()  # opening again migrates nothing


def test_alerts_are_queued_in_the_same_transaction_as_the_incident(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    bad = Commit(
        incidents=[incident(1)],
        alerts=[alert(1)],
        positions={"file:/x": {"not json": object()}},  # fails after the alert row was written
    )
    with pytest.raises(TypeError):
        store.commit(bad)
    assert store.incident("inc-0001") is None
    assert store.alerts() == [] and store.outbox_counts() == {}
    with pytest.raises(ValueError, match="kind"):
        store.commit(Commit(incidents=[incident(1)], alerts=[alert(1, "shout")]))
    assert store.incident("inc-0001") is None
    store.commit(Commit(incidents=[incident(1)], alerts=[alert(1)]))
    [queued] = store.alerts()
    assert queued.incident_id == "inc-0001" and queued.document == {"id": "inc-0001", "ranks": 1}
    assert queued.created is not None and queued.state == "pending"


def test_a_growing_incident_is_one_message_not_one_per_growth(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(alerts=[alert(1, "new", ranks=1), alert(1, "new", sink="teams", ranks=1)]))
    for ranks in (2, 3, 4):
        store.commit(Commit(alerts=[alert(1, "update", ranks=ranks)]))
    [slack] = store.alerts(sink="slack")
    assert slack.kind == "new" and slack.document["ranks"] == 4
    assert store.alerts(sink="teams")[0].document["ranks"] == 1  # the other sink's row is its own

    # Once delivered, growth is an update, and updates fold into one another.
    assert slack.seq is not None
    store.mark_delivered(slack.seq, T0 + 5)
    store.commit(Commit(alerts=[alert(1, "update", ranks=5)]))
    store.commit(Commit(alerts=[alert(1, "update", ranks=6)]))
    pending = [a for a in store.alerts(sink="slack") if a.state == "pending"]
    assert [(a.kind, a.document["ranks"]) for a in pending] == [("update", 6)]

    # A resolve is never folded, and an update after it is a row of its own.
    store.commit(Commit(alerts=[alert(1, "resolved")]))
    store.commit(Commit(alerts=[alert(2, "update", ranks=9)]))  # nothing pending for inc-0002: a row
    kinds = [(a.incident_id, a.kind) for a in store.alerts(sink="slack") if a.state == "pending"]
    assert kinds == [("inc-0001", "update"), ("inc-0001", "resolved"), ("inc-0002", "update")]


def test_due_alerts_are_pending_due_and_oldest_first(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(
        Commit(
            alerts=[
                alert(1, due=T0 + 10),
                alert(2, due=T0),
                alert(3, due=T0 + 1),
                alert(4, sink="discord", due=T0),
            ]
        )
    )
    assert [a.incident_id for a in store.due_alerts("slack", T0)] == ["inc-0002"]
    assert [a.incident_id for a in store.due_alerts("slack", T0 + 1)] == ["inc-0002", "inc-0003"]
    assert [a.incident_id for a in store.due_alerts("slack", T0 + 10)] == ["inc-0001", "inc-0002", "inc-0003"]
    assert [a.incident_id for a in store.due_alerts("slack", T0 + 10, limit=2)] == ["inc-0001", "inc-0002"]
    assert [a.incident_id for a in store.due_alerts("discord", T0 + 10)] == ["inc-0004"]
    # No due time: due at once (the commit's time).
    store.commit(Commit(alerts=[alert(5, sink="generic", due=None)]))
    assert store.due_alerts("generic", T0) == []
    assert [a.incident_id for a in store.due_alerts("generic", 1e12)] == ["inc-0005"]


def test_an_incidents_later_alert_waits_for_its_earlier_one(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(alerts=[alert(1, "new")]))
    [first] = store.due_alerts("slack", T0)
    assert first.seq is not None
    store.mark_retry(first.seq, T0 + 60, "HTTP 500")
    store.commit(Commit(alerts=[alert(1, "resolved", due=T0)]))
    assert store.due_alerts("slack", T0 + 1) == []  # the resolve would overtake the first message
    assert [a.kind for a in store.due_alerts("slack", T0 + 60)] == ["new"]
    store.mark_delivered(first.seq, T0 + 61)
    assert [a.kind for a in store.due_alerts("slack", T0 + 61)] == ["resolved"]


def test_retry_failed_and_delivered_transitions(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(alerts=[alert(1), alert(2), alert(3)]))
    one, two, three = store.due_alerts("slack", T0)
    assert one.seq is not None and two.seq is not None and three.seq is not None

    store.mark_retry(one.seq, T0 + 30, "HTTP 429, retry after 30 s")
    assert [a.incident_id for a in store.due_alerts("slack", T0 + 29)] == ["inc-0002", "inc-0003"]
    store.mark_retry(one.seq, T0 + 90, "HTTP 503")
    [retried] = store.alerts(incident_id="inc-0001")
    assert (retried.state, retried.attempts, retried.due, retried.last_error) == ("pending", 2, T0 + 90, "HTTP 503")

    store.mark_failed(two.seq, "HTTP 404 from https://hooks.slack.com/services/T***")
    [failed] = store.alerts(incident_id="inc-0002")
    assert (failed.state, failed.attempts, failed.last_error) == (
        "failed",
        1,
        "HTTP 404 from https://hooks.slack.com/services/T***",
    )

    assert store.last_delivered("slack", "inc-0003") is None
    store.mark_delivered(three.seq, T0 + 2)
    [delivered] = store.alerts(incident_id="inc-0003")
    assert (delivered.state, delivered.delivered) == ("delivered", T0 + 2)
    assert store.last_delivered("slack", "inc-0003") == T0 + 2
    assert store.last_delivered("teams", "inc-0003") is None

    # Finished rows do not move any more.
    store.mark_retry(three.seq, T0 + 500, "late")
    store.mark_failed(three.seq, "late")
    store.mark_delivered(two.seq, T0 + 500)
    assert [(a.state, a.attempts) for a in store.alerts()] == [("pending", 2), ("failed", 1), ("delivered", 0)]
    assert [a.incident_id for a in store.due_alerts("slack", T0 + 1000)] == ["inc-0001"]


def test_an_update_folded_in_during_delivery_is_not_lost(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(alerts=[alert(1, "new", ranks=1)]))
    [sending] = store.due_alerts("slack", T0)
    assert sending.seq is not None
    store.commit(Commit(alerts=[alert(1, "update", ranks=8)]))  # arrives while the POST is in flight
    store.mark_delivered(sending.seq, T0 + 1, sent=sending.document)
    rows = [(a.kind, a.state, a.document["ranks"]) for a in store.alerts()]
    assert rows == [("new", "delivered", 1), ("update", "pending", 8)]
    # Without a change in flight, `sent` changes nothing.
    [update] = store.due_alerts("slack", T0 + 1)
    assert update.seq is not None
    store.mark_delivered(update.seq, T0 + 2, sent=update.document)
    assert store.due_alerts("slack", T0 + 10) == []


def test_a_restart_does_not_hand_out_delivered_alerts_again(tmp_path: Path) -> None:
    path = tmp_path / "triage.db"
    daemon = Store(path)
    daemon.commit(Commit(incidents=[incident(1), incident(2)], alerts=[alert(1), alert(2)]))
    first, second = daemon.due_alerts("slack", T0)
    assert first.seq is not None
    daemon.mark_delivered(first.seq, T0 + 1)
    # Killed before the second one was acknowledged: no close, no checkpoint.

    restarted = Store(path)
    assert [a.incident_id for a in restarted.due_alerts("slack", T0 + 100)] == ["inc-0002"]
    assert restarted.last_delivered("slack", "inc-0001") == T0 + 1
    assert second.seq is not None
    restarted.mark_delivered(second.seq, T0 + 101)
    assert daemon.due_alerts("slack", T0 + 200) == []  # the old handle sees it too
    restarted.close()
    again = Store(path)
    assert again.due_alerts("slack", T0 + 300) == []
    assert again.outbox_counts() == {("slack", "delivered"): 2}
    daemon.close()
    again.close()


def test_counts_by_sink_and_state(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(alerts=[alert(n) for n in range(4)] + [alert(9, sink="feishu")]))
    items = store.due_alerts("slack", T0)
    assert items[0].seq is not None and items[1].seq is not None
    store.mark_delivered(items[0].seq, T0)
    store.mark_failed(items[1].seq, "HTTP 410")
    assert store.outbox_counts() == {
        ("slack", "pending"): 2,
        ("slack", "delivered"): 1,
        ("slack", "failed"): 1,
        ("feishu", "pending"): 1,
    }


def test_retention_drops_finished_alerts_of_deleted_incidents_and_keeps_pending_ones(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(
        Commit(
            incidents=[incident(n) for n in range(3)],
            alerts=[alert(0), alert(1), alert(2), alert(0, "resolved")],
        )
    )
    seqs = {a.incident_id + a.kind: a.seq for a in store.alerts()}
    store.mark_delivered(seqs["inc-0000new"] or 0, T0)
    store.mark_failed(seqs["inc-0001new"] or 0, "HTTP 404")
    store.mark_delivered(seqs["inc-0002new"] or 0, T0)
    assert store.retain(max_age=None, max_count=1, now=T0 + 10) == 2  # inc-0000 and inc-0001 go
    left = [(a.incident_id, a.kind, a.state) for a in store.alerts()]
    assert left == [("inc-0002", "new", "delivered"), ("inc-0000", "resolved", "pending")]
