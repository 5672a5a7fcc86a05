"""The SQLite store: schema versions, one transaction per batch, pages, retention."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from triage.store import SCHEMA_VERSION, Commit, EvidenceRow, LabelChange, Store, StoredIncident, StoreError

T0 = 1_764_500_000.0


def incident(number: int, *, level: str = "code", category: str = "oom", at: float | None = None) -> StoredIncident:
    when = T0 + number if at is None else at
    return StoredIncident(
        id=f"inc-{number:04d}",
        level=level,
        category=category,
        fingerprint=f"fp{number}",
        first_seen=when,
        last_seen=when,
        created=when,
        updated=when,
        document={"id": f"inc-{number:04d}", "level": level, "category": category},
    )


def test_fresh_database_is_at_the_current_schema_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "state" / "triage.db"
    store = Store(path)
    store.commit(Commit(incidents=[incident(1)], positions={"kmsg": {"boot_id": "b", "seq": 7}}))
    store.close()
    again = Store(path)
    assert again.incident("inc-0001") is not None
    assert again.positions() == {"kmsg": {"boot_id": "b", "seq": 7}}
    version = again.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    assert again.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "triage.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_a_batch_is_all_or_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    bad = Commit(
        incidents=[incident(1)],
        evidence=[EvidenceRow("k1", "inc-0001", "kernel", T0, {"a": 1})],
        positions={"file:/x": {"not json": object()}},  # fails last, inside the transaction
    )
    with pytest.raises(TypeError):
        store.commit(bad)
    assert store.incident("inc-0001") is None
    assert store.evidence() == []
    store.commit(Commit(incidents=[incident(1)], positions={"file:/x": {"offset": 3}}))
    assert store.incident("inc-0001") is not None
    store.commit(Commit(positions={"file:/x": None}))
    assert store.positions() == {}


def test_pages_with_a_cursor_have_no_gaps_and_no_repeats(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(Commit(incidents=[incident(n, at=T0 + n // 3) for n in range(50)]))  # ties in time too
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = store.incidents(limit=7, cursor=cursor)
        seen += [i.id for i in page]
        if cursor is None:
            break
    assert len(seen) == 50 and len(set(seen)) == 50
    times = [store.incident(i).sort_time for i in seen]  # type: ignore[union-attr]
    assert times == sorted(times, reverse=True)
    with pytest.raises(ValueError):
        store.incidents(cursor="garbage!")


def test_filters_and_label_counts(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(
        Commit(
            incidents=[incident(1), incident(2, level="driver", category="gpu_reset"), incident(3)],
            changes=[LabelChange("inc-0002", T0 + 2, "level", "code", "driver")],
        )
    )
    assert [i.id for i in store.incidents(level="driver")[0]] == ["inc-0002"]
    assert [i.id for i in store.incidents(since=T0 + 2, category="oom")[0]] == ["inc-0003"]
    assert [i.id for i in store.incidents(until=T0 + 1)[0]] == ["inc-0001"]
    assert store.label_counts() == {("code", "oom"): 2, ("driver", "gpu_reset"): 1}
    assert [(c.field, c.new) for c in store.changes("inc-0002")] == [("level", "driver")]


def test_retention_by_age_and_count(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    store.commit(
        Commit(
            incidents=[incident(n) for n in range(10)],
            evidence=[EvidenceRow(f"k{n}", f"inc-{n:04d}", "program", T0 + n, {}) for n in range(10)],
        )
    )
    assert store.retain(max_age=None, max_count=6, now=T0 + 10) == 4
    assert store.retain(max_age=3.5, max_count=None, now=T0 + 10) == 3
    assert sorted(i.id for i in store.incidents()[0]) == ["inc-0007", "inc-0008", "inc-0009"]
    assert len(store.evidence(limit=100)) == 3


def test_readers_see_whole_batches_while_a_writer_writes(tmp_path: Path) -> None:
    store = Store(tmp_path / "triage.db")
    done = threading.Event()
    problems: list[str] = []

    def read() -> None:
        reader = Store(tmp_path / "triage.db")
        while not done.is_set():
            # Evidence first: whatever it names was committed before the incidents are read.
            evidence = {e.incident_id for e in reader.evidence(limit=1000)}
            found = {i.id for i in reader.incidents(limit=1000)[0]}
            if not evidence <= found:
                problems.append(f"evidence without its incident: {sorted(evidence - found)[:3]}")
        reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    for n in range(200):
        store.commit(Commit(incidents=[incident(n)], evidence=[EvidenceRow(f"k{n}", f"inc-{n:04d}", "kernel", T0, {})]))
    done.set()
    thread.join()
    assert problems == []
