"""Live correlation: the scan engine over a sliding window, with incidents that keep their id.

Each batch of new evidence re-runs the pure correlator over the recent window
(`horizon`), so a live incident is exactly what `triage scan` would say about
the same evidence. What live adds is identity: every piece of evidence has a
stable key, an incident is known by the evidence it owns, and when re-correlation
grows, relabels or merges incidents the stored ones are updated in place (the
oldest id wins a merge) and every change of level or category is recorded with
its time.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .correlate import correlate
from .fingerprint import digest
from .model import Frame, Incident, KernelEvent, KernelRecord, ProgramFailure
from .render import event_to_dict, failure_to_dict, incident_to_dict, iso
from .store import Commit, EvidenceRow, LabelChange, StoredIncident


def event_key(event: KernelEvent) -> str:
    """Stable across restarts: where the first record came from and which it was."""
    record = event.first
    position = record.seq if record.seq is not None else (record.monotonic, record.index)
    return f"k:{digest(record.origin, record.boot_id, position, record.message)}"


def failure_key(failure: ProgramFailure) -> str:
    first = failure.lines[0] if failure.lines else failure.text[:200]
    return f"p:{digest(failure.origin, failure.line_number, failure.time, first)}"


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def event_from_dict(document: dict[str, Any]) -> KernelEvent:
    """A KernelEvent good enough to correlate again after a restart."""
    record = KernelRecord(
        message=(document.get("lines") or [""])[0],
        raw=list(document.get("lines") or []),
        index=0,
        monotonic=document.get("monotonic"),
        origin=document.get("origin") or "",
        seq=document.get("seq"),
        boot_id=document.get("boot_id"),
    )
    event = KernelEvent(
        rule_id=document["rule_id"],
        category=document["category"],
        title=document.get("title") or document["category"],
        records=[record],
        hint=document.get("hint") or "",
        detail_rules=list(document.get("detail_rules") or []),
        device=document.get("device"),
        pid=document.get("pid"),
        process=document.get("process"),
        address=document.get("address"),
        count=int(document.get("count") or 1),
        suppressed=int(document.get("suppressed") or 0),
        fields=dict(document.get("fields") or {}),
    )
    event.time = _epoch(document.get("time"))
    return event


def failure_from_dict(document: dict[str, Any]) -> ProgramFailure:
    lines = list(document.get("lines") or [])
    return ProgramFailure(
        kind=document.get("kind") or "fatal_line",
        lines=lines,
        text="\n".join(lines),
        origin=document.get("origin") or "",
        line_number=int(document.get("line") or 0),
        exception_type=document.get("exception_type"),
        message=document.get("message") or "",
        frames=[Frame(f["file"], f.get("line"), f.get("function") or "") for f in document.get("frames") or []],
        chain=list(document.get("chain") or []),
        time=_epoch(document.get("time")),
        time_source=document.get("time_source") or "none",
        rank=document.get("rank"),
        pid=document.get("pid"),
        host=document.get("host"),
        gpu_node=document.get("gpu_node"),
        device=document.get("device"),
        address=document.get("address"),
        rule_id=document.get("rule_id"),
        category=document.get("category") or "unclassified",
        title=document.get("title") or "",
        hint=document.get("hint") or "",
        follow_on=bool(document.get("follow_on")),
        fields=dict(document.get("fields") or {}),
        count=int(document.get("count") or 1),
        ranks=list(document.get("ranks") or []),
    )


def _event_document(event: KernelEvent, key: str) -> dict[str, Any]:
    document = event_to_dict(event)
    document.update(key=key, hint=event.hint, seq=event.first.seq, boot_id=event.first.boot_id)
    return document


def _failure_document(failure: ProgramFailure, key: str) -> dict[str, Any]:
    document = failure_to_dict(failure)
    document.update(key=key, hint=failure.hint)
    return document


#: Fields of an incident document whose change makes it worth an update.
_WATCHED = ("level", "category", "title", "count", "last_seen", "ranks", "pids", "devices")


@dataclass(slots=True)
class LiveCorrelator:
    """The recent evidence and the incidents it makes, kept by stable ids."""

    horizon: float = 7200.0
    max_items: int = 20000
    clock: Callable[[], float] = time.time
    events: dict[str, KernelEvent] = field(default_factory=dict)
    failures: dict[str, ProgramFailure] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    incidents: dict[str, StoredIncident] = field(default_factory=dict)
    arrived: dict[str, float] = field(default_factory=dict)

    def restore(self, rows: Iterable[EvidenceRow], incidents: Iterable[StoredIncident]) -> None:
        """Take back the recent window a previous run stored (after a restart)."""
        for incident in incidents:
            self.incidents[incident.id] = incident
        for row in rows:
            if row.kind == "kernel":
                self.events[row.key] = event_from_dict(row.document)
            else:
                self.failures[row.key] = failure_from_dict(row.document)
            self.owner[row.key] = row.incident_id
            self.arrived[row.key] = self.clock()

    def add(self, events: Sequence[KernelEvent], failures: Sequence[ProgramFailure]) -> Commit:
        """Take new evidence; return what changed, ready for Store.commit."""
        now = self.clock()
        fresh = False
        for event in events:
            key = event_key(event)
            if key not in self.events:
                self.events[key] = event
                self.arrived[key] = now
                fresh = True
        for failure in failures:
            key = failure_key(failure)
            if key not in self.failures:
                self.failures[key] = failure
                self.arrived[key] = now
                fresh = True
        if not fresh:
            return Commit()
        self._prune(now)
        return self._recorrelate(now)

    def _prune(self, now: float) -> None:
        """Forget what arrived more than `horizon` ago (by arrival, not by its own time:
        an old log read today is still correlated with its own neighbours)."""
        oldest = now - self.horizon
        for pool in (self.events, self.failures):
            for key in [k for k in pool if self.arrived.get(k, now) < oldest]:
                del pool[key]
        while len(self.events) + len(self.failures) > self.max_items:
            pool = self.events if len(self.events) >= len(self.failures) else self.failures
            del pool[next(iter(pool))]
        live = set(self.events) | set(self.failures)
        for key in [k for k in self.owner if k not in live]:
            del self.owner[key]
            self.arrived.pop(key, None)
        owning = set(self.owner.values())
        for incident_id in [i for i in self.incidents if i not in owning]:
            del self.incidents[incident_id]  # its evidence left the window; the store keeps it

    def _recorrelate(self, now: float) -> Commit:
        keys: dict[int, str] = {id(e): k for k, e in self.events.items()}
        keys.update({id(f): k for k, f in self.failures.items()})
        computed = correlate(list(self.events.values()), list(self.failures.values()))
        commit = Commit()
        for incident in computed:
            members = [keys[id(member)] for member in incident.members]
            self._settle(incident, members, now, commit)
        return commit

    def _settle(self, incident: Incident, members: list[str], now: float, commit: Commit) -> None:
        owners = sorted(
            {self.owner[k] for k in members if k in self.owner and self.owner[k] in self.incidents},
            key=lambda i: (self.incidents[i].created, i),
        )
        incident_id = owners[0] if owners else f"inc-{digest(min(members))}"
        for merged in owners[1:]:
            gone = self.incidents[merged]
            if gone.merged_into != incident_id:
                gone.merged_into = incident_id
                gone.updated = now
                gone.document["merged_into"] = incident_id
                commit.incidents.append(gone)
        previous = self.incidents.get(incident_id)
        document = incident_to_dict(incident)
        document["id"] = incident_id
        changes = list(previous.document.get("changes", [])) if previous else []
        if previous is not None:
            for name in ("level", "category"):
                old, new = previous.document.get(name), document[name]
                if old != new:
                    commit.changes.append(LabelChange(incident_id, now, name, old, new))
                    changes.append({"at": iso(now), "field": name, "from": old, "to": new})
        document["changes"] = changes
        document["created"] = iso(previous.created if previous else now)
        document["updated"] = iso(now)
        moved = [k for k in members if self.owner.get(k) != incident_id]
        if previous is not None and not moved and all(previous.document.get(f) == document[f] for f in _WATCHED):
            return  # nothing a reader would see has changed
        stored = StoredIncident(
            id=incident_id,
            level=incident.level,
            category=incident.category,
            fingerprint=incident.fingerprint,
            first_seen=incident.first_seen,
            last_seen=incident.last_seen,
            created=previous.created if previous else now,
            updated=now,
            document=document,
        )
        self.incidents[incident_id] = stored
        commit.incidents.append(stored)
        for key in moved:
            self.owner[key] = incident_id
            if key in self.events:
                event = self.events[key]
                commit.evidence.append(EvidenceRow(key, incident_id, "kernel", event.time, _event_document(event, key)))
            else:
                failure = self.failures[key]
                commit.evidence.append(
                    EvidenceRow(key, incident_id, "program", failure.time, _failure_document(failure, key))
                )
