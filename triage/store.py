"""SQLite store: incidents, their evidence, source positions, in one transaction.

WAL mode, so the HTTP API reads while the daemon writes. One writer (the
daemon's processing thread) commits each batch whole: the incidents it changed,
their label changes, the evidence and the positions of the sources that
produced it. A crash therefore loses nothing and repeats nothing. The schema is
versioned; `MIGRATIONS[n]` takes version n to n+1.
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

SCHEMA_VERSION = 1

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
]


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
class Commit:
    """Everything one batch changes, written in one transaction."""

    incidents: list[StoredIncident] = field(default_factory=list)
    changes: list[LabelChange] = field(default_factory=list)
    evidence: list[EvidenceRow] = field(default_factory=list)
    #: source key -> position (None: forget it)
    positions: dict[str, Any] = field(default_factory=dict)


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
            return len(doomed)

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
    ) -> tuple[list[StoredIncident], str | None]:
        """Newest first; `cursor` continues after the last incident of a previous page."""
        after = decode_cursor(cursor) if cursor is not None else None
        where, params = _where(
            ("merged_into IS NULL", () if not include_merged else None),
            ("sort_time >= ?", (since,) if since is not None else None),
            ("sort_time <= ?", (until,) if until is not None else None),
            ("level = ?", (level,) if level is not None else None),
            ("category = ?", (category,) if category is not None else None),
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
