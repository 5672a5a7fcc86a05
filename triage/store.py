"""SQLite store: incidents, their evidence, source positions, in one transaction.

WAL mode, so the HTTP API reads while the daemon writes. One writer (the
daemon's processing thread) commits each batch whole: the incidents it changed,
their label changes, the evidence and the positions of the sources that
produced it. A crash therefore loses nothing and repeats nothing. The schema is
versioned; `MIGRATIONS[n]` takes version n to n+1.

The outbox (schema 2) holds the alerts to deliver. An alert is queued in the
same transaction as the incident change it reports, so it is never lost and
never invented; the delivery worker then drains it with short transactions of
its own (`due_alerts`, `mark_delivered`, `mark_retry`, `mark_failed`). A row
marked delivered is never handed out again, across restarts too.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2

MIGRATIONS: list[str] = [
    # 0 -> 1
    """
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        level TEXT NOT NULL,
        category TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        first_seen REAL,
        last_seen REAL,
        sort_time REAL NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        merged_into TEXT,
        document TEXT NOT NULL
    );
    CREATE INDEX incidents_sort ON incidents (sort_time DESC, id DESC);
    CREATE INDEX incidents_label ON incidents (level, category);
    CREATE TABLE incident_changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        incident_id TEXT NOT NULL,
        at REAL NOT NULL,
        field TEXT NOT NULL,
        old TEXT,
        new TEXT
    );
    CREATE INDEX incident_changes_incident ON incident_changes (incident_id, seq);
    CREATE TABLE evidence (
        key TEXT PRIMARY KEY,
        incident_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        time REAL,
        stored REAL NOT NULL,
        document TEXT NOT NULL
    );
    CREATE INDEX evidence_incident ON evidence (incident_id);
    CREATE INDEX evidence_time ON evidence (stored DESC);
    CREATE TABLE positions (source TEXT PRIMARY KEY, position TEXT NOT NULL, updated REAL NOT NULL);
    """,
    # 1 -> 2: the alert outbox
    """
    CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        sink TEXT NOT NULL,
        incident_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('new', 'update', 'resolved', 'test')),
        created REAL NOT NULL,
        due REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
        last_error TEXT,
        delivered REAL,
        document TEXT NOT NULL
    );
    CREATE INDEX outbox_due ON outbox (state, sink, due);
    CREATE INDEX outbox_incident ON outbox (incident_id);
    """,
]

ALERT_KINDS = ("new", "update", "resolved", "test")
OUTBOX_STATES = ("pending", "delivered", "failed")


class StoreError(RuntimeError):
    pass


@dataclass(slots=True)
class StoredIncident:
    """An incident as the daemon keeps it: the API document plus what indexes it."""

    id: str
    level: str
    category: str
    fingerprint: str
    first_seen: float | None
    last_seen: float | None
    created: float
    updated: float
    document: dict[str, Any]
    merged_into: str | None = None

    @property
    def sort_time(self) -> float:
        return self.last_seen if self.last_seen is not None else self.created


@dataclass(slots=True)
class LabelChange:
    incident_id: str
    at: float
    field: str
    old: str | None
    new: str | None


@dataclass(slots=True)
class EvidenceRow:
    key: str
    incident_id: str
    kind: str  # "kernel" or "program"
    time: float | None
    document: dict[str, Any]


@dataclass(slots=True)
class OutboxItem:
    """One alert for one sink: queued by a Commit, read back by the delivery worker.

    To queue, give `sink`, `incident_id`, `kind` and `document` (the incident document as
    the API returns it, at queue time); `due` defaults to the commit time and `created` is
    always the commit time. The other fields are the store's and are filled in on reading.
    """

    sink: str
    incident_id: str
    kind: str  # "new", "update", "resolved" or "test"
    document: dict[str, Any]
    due: float | None = None  # not before (rate limits, backoff); None: at once
    created: float | None = None
    seq: int | None = None
    attempts: int = 0
    state: str = "pending"  # "pending", "delivered" or "failed"
    last_error: str | None = None  # already redacted by whoever wrote it
    delivered: float | None = None


@dataclass(slots=True)
class Commit:
    """Everything one batch changes, written in one transaction."""

    incidents: list[StoredIncident] = field(default_factory=list)
    changes: list[LabelChange] = field(default_factory=list)
    evidence: list[EvidenceRow] = field(default_factory=list)
    #: source key -> position (None: forget it)
    positions: dict[str, Any] = field(default_factory=dict)
    #: alerts to queue; an "update" coalesces into a pending "new"/"update" of the same sink and incident
    alerts: list[OutboxItem] = field(default_factory=list)


def default_state_dir() -> Path:
    """/var/lib/triage as root, else $XDG_STATE_HOME/triage (~/.local/state/triage)."""
    import os

    if os.geteuid() == 0:
        return Path("/var/lib/triage")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "triage"


def _encode_cursor(sort_time: float, incident_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([sort_time, incident_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The (sort_time, id) a page ended at; ValueError for anything else."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
        sort_time, incident_id = value
        return float(sort_time), str(incident_id)
    except Exception as error:  # any garbage is a bad cursor, never a 500
        raise ValueError(f"bad cursor {cursor!r}") from error


class Store:
    """The daemon's SQLite database. Writes from one thread; reads from any."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._migrate()

    # -- connections ---------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        connection.row_factory = sqlite3.Row
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA foreign_keys=ON")
        return connection

    @property
    def db(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            self._local.connection = connection
        return connection

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _migrate(self) -> None:
        db = self.db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row["value"]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this triage knows ({SCHEMA_VERSION})"
            )
        while version < SCHEMA_VERSION:
            with self._transaction():
                for statement in _statements(MIGRATIONS[version]):
                    db.execute(statement)
                version += 1
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(version),),
                )

    class _Transaction:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, kind: object, value: object, traceback: object) -> None:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")

    def _transaction(self) -> Store._Transaction:
        return Store._Transaction(self.db)

    # -- writes --------------------------------------------------------------

    def commit(self, commit: Commit) -> None:
        """Write a batch's incidents, label changes, evidence and positions, all or nothing."""
        now = time.time()
        with self._write_lock, self._transaction() as db:
            for incident in commit.incidents:
                db.execute(
                    """INSERT INTO incidents (id, level, category, fingerprint, first_seen, last_seen, sort_time,
                                              created, updated, merged_into, document)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                       ON CONFLICT (id) DO UPDATE SET
                         level = excluded.level, category = excluded.category, fingerprint = excluded.fingerprint,
                         first_seen = excluded.first_seen, last_seen = excluded.last_seen,
                         sort_time = excluded.sort_time, updated = excluded.updated,
                         merged_into = excluded.merged_into, document = excluded.document""",
                    (
                        incident.id,
                        incident.level,
                        incident.category,
                        incident.fingerprint,
                        incident.first_seen,
                        incident.last_seen,
                        incident.sort_time,
                        incident.created,
                        incident.updated,
                        incident.merged_into,
                        json.dumps(incident.document, separators=(",", ":")),
                    ),
                )
            db.executemany(
                "INSERT INTO incident_changes (incident_id, at, field, old, new) VALUES (?, ?, ?, ?, ?)",
                [(c.incident_id, c.at, c.field, c.old, c.new) for c in commit.changes],
            )
            db.executemany(
                """INSERT INTO evidence (key, incident_id, kind, time, stored, document) VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT (key) DO UPDATE SET incident_id = excluded.incident_id, document = excluded.document""",
                [
                    (e.key, e.incident_id, e.kind, e.time, now, json.dumps(e.document, separators=(",", ":")))
                    for e in commit.evidence
                ],
            )
            for source, position in commit.positions.items():
                if position is None:
                    db.execute("DELETE FROM positions WHERE source = ?", (source,))
                else:
                    db.execute(
                        """INSERT INTO positions (source, position, updated) VALUES (?, ?, ?)
                           ON CONFLICT (source) DO UPDATE SET position = excluded.position,
                                                              updated = excluded.updated""",
                        (source, json.dumps(position), now),
                    )
            for alert in commit.alerts:
                _queue(db, alert, now)

    def retain(self, *, max_age: float | None, max_count: int | None, now: float | None = None) -> int:
        """Delete incidents older than `max_age` seconds or beyond the newest `max_count`
        (with their evidence and changes); returns how many went."""
        current = time.time() if now is None else now
        with self._write_lock, self._transaction() as db:
            doomed: set[str] = set()
            if max_age is not None:
                doomed |= {
                    row["id"]
                    for row in db.execute("SELECT id FROM incidents WHERE sort_time < ?", (current - max_age,))
                }
            if max_count is not None:
                doomed |= {
                    row["id"]
                    for row in db.execute(
                        "SELECT id FROM incidents ORDER BY sort_time DESC, id DESC LIMIT -1 OFFSET ?", (max_count,)
                    )
                }
            for incident_id in doomed:
                db.execute("DELETE FROM incidents WHERE id = ?", (incident_id,))
                db.execute("DELETE FROM evidence WHERE incident_id = ?", (incident_id,))
                db.execute("DELETE FROM incident_changes WHERE incident_id = ?", (incident_id,))
                # Pending alerts stay: the worker still owes them (a resolve, say).
                db.execute("DELETE FROM outbox WHERE incident_id = ? AND state != 'pending'", (incident_id,))
            return len(doomed)

    # -- outbox (the delivery worker's side; each call its own short transaction) --

    def due_alerts(self, sink: str, now: float, limit: int = 100) -> list[OutboxItem]:
        """Pending alerts of `sink` due by `now`, oldest first. An alert waits while an older
        pending one of the same sink and incident exists (in backoff, say), so a receiver
        never sees an incident's update or resolve before its first message."""
        rows = self.db.execute(
            """SELECT * FROM outbox AS o
               WHERE o.state = 'pending' AND o.sink = ? AND o.due <= ?
                 AND NOT EXISTS (SELECT 1 FROM outbox AS older
                                 WHERE older.incident_id = o.incident_id AND older.sink = o.sink
                                   AND older.state = 'pending' AND older.seq < o.seq)
               ORDER BY o.seq LIMIT ?""",
            (sink, now, limit),
        ).fetchall()
        return [_outbox_item(row) for row in rows]

    def mark_delivered(self, seq: int, at: float, *, sent: dict[str, Any] | None = None) -> None:
        """The receiver acknowledged alert `seq`. With `sent` (the document that went out):
        when an update coalesced into the row while it was in flight, the newer document is
        queued again as an "update" instead of being lost."""
        with self._write_lock, self._transaction() as db:
            row = db.execute("SELECT * FROM outbox WHERE seq = ?", (seq,)).fetchone()
            if row is None or row["state"] != "pending":
                return
            went = _json(sent) if sent is not None else row["document"]
            db.execute(
                "UPDATE outbox SET state = 'delivered', delivered = ?, document = ? WHERE seq = ?", (at, went, seq)
            )
            if went != row["document"]:
                db.execute(
                    """INSERT INTO outbox (sink, incident_id, kind, created, due, state, document)
                       VALUES (?, ?, 'update', ?, ?, 'pending', ?)""",
                    (row["sink"], row["incident_id"], at, at, row["document"]),
                )

    def mark_retry(self, seq: int, due: float, error: str) -> None:
        """Delivery failed for now: try again not before `due`. `error` must be redacted."""
        with self._write_lock, self._transaction() as db:
            db.execute(
                """UPDATE outbox SET attempts = attempts + 1, due = ?, last_error = ?
                   WHERE seq = ? AND state = 'pending'""",
                (due, error, seq),
            )

    def mark_failed(self, seq: int, error: str) -> None:
        """Delivery failed for good (404, bad signature, invalid payload). `error` must be redacted."""
        with self._write_lock, self._transaction() as db:
            db.execute(
                """UPDATE outbox SET attempts = attempts + 1, state = 'failed', last_error = ?
                   WHERE seq = ? AND state = 'pending'""",
                (error, seq),
            )

    def outbox_counts(self) -> dict[tuple[str, str], int]:
        """(sink, state) -> rows, for /metrics and /healthz."""
        return {
            (row["sink"], row["state"]): row["n"]
            for row in self.db.execute("SELECT sink, state, count(*) AS n FROM outbox GROUP BY sink, state")
        }

    def last_delivered(self, sink: str, incident_id: str) -> float | None:
        """When `sink` last acknowledged an alert about the incident (to rate limit updates)."""
        row = self.db.execute(
            "SELECT max(delivered) FROM outbox WHERE sink = ? AND incident_id = ? AND state = 'delivered'",
            (sink, incident_id),
        ).fetchone()
        value = row[0]
        return float(value) if value is not None else None

    def alerts(self, *, sink: str | None = None, incident_id: str | None = None) -> list[OutboxItem]:
        """Every outbox row (optionally of one sink or incident), oldest first."""
        where, params = _where(
            ("sink = ?", (sink,) if sink is not None else None),
            ("incident_id = ?", (incident_id,) if incident_id is not None else None),
        )
        return [_outbox_item(row) for row in self.db.execute(f"SELECT * FROM outbox {where} ORDER BY seq", params)]

    # -- reads ---------------------------------------------------------------

    def positions(self) -> dict[str, Any]:
        return {row["source"]: json.loads(row["position"]) for row in self.db.execute("SELECT * FROM positions")}

    def incident(self, incident_id: str) -> StoredIncident | None:
        row = self.db.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return _stored(row) if row else None

    def incidents(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        level: str | None = None,
        category: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        include_merged: bool = False,
        updated_since: float | None = None,
    ) -> tuple[list[StoredIncident], str | None]:
        """Newest first; `cursor` continues after the last incident of a previous page."""
        after = decode_cursor(cursor) if cursor is not None else None
        where, params = _where(
            ("merged_into IS NULL", () if not include_merged else None),
            ("sort_time >= ?", (since,) if since is not None else None),
            ("sort_time <= ?", (until,) if until is not None else None),
            ("level = ?", (level,) if level is not None else None),
            ("category = ?", (category,) if category is not None else None),
            ("updated >= ?", (updated_since,) if updated_since is not None else None),
            ("(sort_time < ? OR (sort_time = ? AND id < ?))", (after[0], after[0], after[1]) if after else None),
        )
        rows = self.db.execute(
            f"SELECT * FROM incidents {where} ORDER BY sort_time DESC, id DESC LIMIT ?", (*params, limit + 1)
        ).fetchall()
        found = [_stored(row) for row in rows[:limit]]
        following = _encode_cursor(found[-1].sort_time, found[-1].id) if len(rows) > limit and found else None
        return found, following

    def changes(self, incident_id: str) -> list[LabelChange]:
        return [
            LabelChange(row["incident_id"], row["at"], row["field"], row["old"], row["new"])
            for row in self.db.execute(
                "SELECT * FROM incident_changes WHERE incident_id = ? ORDER BY seq", (incident_id,)
            )
        ]

    def evidence(self, *, since: float | None = None, limit: int = 100, kind: str | None = None) -> list[EvidenceRow]:
        """Recent kernel events and program failures, newest stored first."""
        where, params = _where(
            ("stored >= ?", (since,) if since is not None else None),
            ("kind = ?", (kind,) if kind is not None else None),
        )
        rows = self.db.execute(
            f"SELECT * FROM evidence {where} ORDER BY stored DESC, key DESC LIMIT ?", (*params, limit)
        ).fetchall()
        return [_evidence(row) for row in rows]

    def evidence_since(self, since: float) -> list[EvidenceRow]:
        """Evidence whose own time (or storage time) is recent: what a restarted daemon correlates again."""
        rows = self.db.execute(
            "SELECT * FROM evidence WHERE coalesce(time, stored) >= ? ORDER BY coalesce(time, stored)", (since,)
        ).fetchall()
        return [_evidence(row) for row in rows]

    def label_counts(self) -> dict[tuple[str, str], int]:
        return {
            (row["level"], row["category"]): row["n"]
            for row in self.db.execute(
                "SELECT level, category, count(*) AS n FROM incidents WHERE merged_into IS NULL "
                "GROUP BY level, category"
            )
        }


def _where(*conditions: tuple[str, tuple[object, ...] | None]) -> tuple[str, list[object]]:
    """A WHERE clause of the conditions whose parameters are given (None: left out)."""
    used = [(clause, params) for clause, params in conditions if params is not None]
    where = f"WHERE {' AND '.join(clause for clause, _ in used)}" if used else ""
    return where, [value for _, params in used for value in params]


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))


def _queue(db: sqlite3.Connection, alert: OutboxItem, now: float) -> None:
    """Insert one alert, or fold an update into the pending message about the same incident."""
    if alert.kind not in ALERT_KINDS:
        raise ValueError(f"unknown alert kind {alert.kind!r}")
    document = _json(alert.document)
    if alert.kind == "update":
        replaced = db.execute(
            """UPDATE outbox SET document = ?
               WHERE seq = (SELECT seq FROM outbox
                            WHERE sink = ? AND incident_id = ? AND state = 'pending' AND kind IN ('new', 'update')
                            ORDER BY seq DESC LIMIT 1)""",
            (document, alert.sink, alert.incident_id),
        )
        if replaced.rowcount:
            return
    db.execute(
        """INSERT INTO outbox (sink, incident_id, kind, created, due, state, document)
           VALUES (?, ?, ?, ?, ?, 'pending', ?)""",
        (alert.sink, alert.incident_id, alert.kind, now, now if alert.due is None else alert.due, document),
    )


def _outbox_item(row: sqlite3.Row) -> OutboxItem:
    return OutboxItem(
        sink=row["sink"],
        incident_id=row["incident_id"],
        kind=row["kind"],
        document=json.loads(row["document"]),
        due=row["due"],
        created=row["created"],
        seq=row["seq"],
        attempts=row["attempts"],
        state=row["state"],
        last_error=row["last_error"],
        delivered=row["delivered"],
    )


def _statements(script: str) -> Iterable[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def _stored(row: sqlite3.Row) -> StoredIncident:
    return StoredIncident(
        id=row["id"],
        level=row["level"],
        category=row["category"],
        fingerprint=row["fingerprint"],
        first_seen=row["first_seen"],
        last_seen=row["last_seen"],
        created=row["created"],
        updated=row["updated"],
        document=json.loads(row["document"]),
        merged_into=row["merged_into"],
    )


def _evidence(row: sqlite3.Row) -> EvidenceRow:
    return EvidenceRow(row["key"], row["incident_id"], row["kind"], row["time"], json.loads(row["document"]))
