"""Incidents as JSON (the shape the API and alerts share) and as a terminal table."""

from __future__ import annotations

import datetime as dt
import shutil
import textwrap
from collections.abc import Sequence
from typing import Any, Protocol

from .model import Incident, KernelEvent, ProgramFailure

#: Raw lines kept per event or failure in the JSON, so one storm cannot bloat it.
MAX_RAW_LINES = 80


def iso(value: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC with milliseconds, or None."""
    if value is None:
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_RAW_LINES:
        return lines
    half = MAX_RAW_LINES // 2
    return [*lines[:half], f"... {len(lines) - MAX_RAW_LINES} lines not shown ...", *lines[-half:]]


def event_to_dict(event: KernelEvent) -> dict[str, Any]:
    return {
        "rule_id": event.rule_id,
        "category": event.category,
        "title": event.title,
        "time": iso(event.time),
        "monotonic": event.monotonic,
        "device": event.device,
        "pid": event.pid,
        "process": event.process,
        "address": event.address,
        "count": event.count,
        "suppressed": event.suppressed,
        "detail_rules": sorted(set(event.detail_rules)),
        "fields": dict(event.fields),
        "origin": event.first.origin,
        "lines": _capped(event.lines),
    }


def failure_to_dict(failure: ProgramFailure) -> dict[str, Any]:
    return {
        "rule_id": failure.rule_id,
        "category": failure.category,
        "title": failure.title,
        "kind": failure.kind,
        "time": iso(failure.time),
        "time_source": failure.time_source,
        "origin": failure.origin,
        "line": failure.line_number,
        "rank": failure.rank,
        "ranks": sorted(set(failure.ranks)),
        "pid": failure.pid,
        "host": failure.host,
        "gpu_node": failure.gpu_node,
        "device": failure.device,
        "address": failure.address,
        "exception_type": failure.exception_type,
        "message": failure.message,
        "chain": list(failure.chain),
        "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in failure.frames],
        "count": failure.count,
        "follow_on": failure.follow_on,
        "fields": dict(failure.fields),
        "lines": _capped(failure.lines),
    }


def incident_to_dict(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.id,
        "level": incident.level,
        "category": incident.category,
        "title": incident.title,
        "hint": incident.hint,
        "first_seen": iso(incident.first_seen),
        "last_seen": iso(incident.last_seen),
        "count": incident.count,
        "fingerprint": incident.fingerprint,
        "clock": incident.clock,
        "ranks": incident.ranks,
        "pids": incident.pids,
        "devices": incident.devices,
        "evidence": incident.evidence,
        "kernel_events": [event_to_dict(event) for event in incident.kernel_events],
        "program_failures": [failure_to_dict(failure) for failure in incident.program_failures],
    }


# -- text --------------------------------------------------------------------

_COLOURS = {"driver": "\033[1;31m", "code": "\033[1;33m", "dim": "\033[2m", "bold": "\033[1m", "reset": "\033[0m"}


def _paint(text: str, style: str, colour: bool) -> str:
    return f"{_COLOURS[style]}{text}{_COLOURS['reset']}" if colour else text


def _local(value: float | None) -> str:
    if value is None:
        return "time unknown"
    return dt.datetime.fromtimestamp(value).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


class TextIncident(Protocol):
    """What the table shows of an incident: an `Incident` of a scan, or the API's view of a stored one."""

    @property
    def id(self) -> str: ...
    @property
    def level(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def hint(self) -> str: ...
    @property
    def first_seen(self) -> float | None: ...
    @property
    def count(self) -> int: ...
    @property
    def evidence(self) -> Sequence[str]: ...


def format_text(
    incidents: Sequence[TextIncident], *, colour: bool = False, width: int | None = None, evidence_lines: int = 4
) -> str:
    """A short report for a terminal: most important first, one block per incident."""
    columns = width or shutil.get_terminal_size((100, 24)).columns
    columns = max(60, min(columns, 160))
    if not incidents:
        return "No incidents found.\n"
    driver = sum(1 for i in incidents if i.level == "driver")
    lines = [f"{len(incidents)} incident(s): {driver} driver-level, {len(incidents) - driver} code-level", ""]
    for number, incident in enumerate(incidents, 1):
        label = f"{incident.level.upper():6} {incident.category}"
        count = f"  x{incident.count}" if incident.count > 1 else ""
        head = f"{number:>2}. {_paint(label, incident.level, colour)}  {incident.title}{count}"
        lines.append(head)
        lines.append(_paint(f"    {_local(incident.first_seen)}  id {incident.id}", "dim", colour))
        shown = incident.evidence[:evidence_lines]
        for item in shown:
            lines.extend(textwrap.wrap(item, columns - 6, initial_indent="    - ", subsequent_indent="      "))
        if len(incident.evidence) > len(shown):
            lines.append(f"      ({len(incident.evidence) - len(shown)} more in --format json)")
        hint = textwrap.wrap(incident.hint, columns - 10, initial_indent="    hint: ", subsequent_indent="          ")
        lines.extend(_paint(line, "bold", colour) if i == 0 else line for i, line in enumerate(hint))
        lines.append("")
    return "\n".join(lines)
