"""Which sinks an incident goes to, and the labels its alerts carry. Pure: no I/O.

`sink_wants` applies a sink's filters (`min_level`, `categories`, `exclude_categories`) to an
incident document (render.incident_to_dict, or the API's). `job_of` reads the fields of
`alerts.job_from_path` (`/shared/logs/{job}/rank{rank}.log`) out of a log's path, and
`labels_for` puts together what every alert of an incident is labelled with: the static
`alerts.labels`, the node, and the job of the first program failure whose log path matches.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import AlertsConfig, Config, SinkConfig, template_fields
from ..store import OutboxItem, StoredIncident

#: What one `{name}` field matches: a non-empty run inside one path component.
_FIELD = r"[^/]+?"


def sink_wants(sink: SinkConfig, document: Mapping[str, Any]) -> bool:
    """Whether `sink`'s filters let the incident `document` through.

    `min_level = "driver"` passes only driver-level incidents ("code", the default, passes both);
    a non-empty `categories` passes only those; `exclude_categories` always wins.
    """
    level = str(document.get("level", ""))
    category = str(document.get("category", ""))
    if sink.min_level == "driver" and level != "driver":
        return False
    if sink.categories and category not in sink.categories:
        return False
    return category not in sink.exclude_categories


@functools.lru_cache(maxsize=32)
def _template_regex(template: str) -> re.Pattern[str]:
    """`/shared/logs/{job}/rank{rank}.log` -> a regex with one named group per field.

    A field used twice must match the same text both times; literal text is matched as is.
    """
    template_fields(template)  # ValueError on a malformed template
    pattern: list[str] = []
    seen: set[str] = set()
    for literal, name, _, _ in string.Formatter().parse(template):
        pattern.append(re.escape(literal))
        if name is None:
            continue
        pattern.append(f"(?P={name})" if name in seen else f"(?P<{name}>{_FIELD})")
        seen.add(name)
    anchor = "" if template.startswith("/") else "(?:.*/)?"  # relative: any directory above
    return re.compile(anchor + "".join(pattern))


def job_of(path: str, template: str) -> dict[str, str]:
    """The fields of `template` read from `path` ({} when the template is "" or does not match).

    The whole path must match: `job_of("/shared/logs/llama-70b/rank3.log",
    "/shared/logs/{job}/rank{rank}.log") == {"job": "llama-70b", "rank": "3"}`. A field never
    spans a `/`. A relative template matches the end of a path at a component boundary, so
    `{job}/rank{rank}.log` reads the same fields from any directory.
    """
    if not template or not path:
        return {}
    match = _template_regex(template).fullmatch(path)
    if match is None:
        return {}
    return {name: value for name, value in match.groupdict().items() if value is not None}


def labels_for(document: Mapping[str, Any], config: Config | AlertsConfig) -> dict[str, str]:
    """Labels every alert of this incident carries: static labels, `node`, and `job` where known.

    The job comes from the first program failure whose log path (`origin`) matches
    `alerts.job_from_path`; an incident with only kernel evidence has no job label.
    """
    alerts = config.alerts if isinstance(config, Config) else config
    labels = dict(alerts.labels)
    labels["node"] = alerts.node
    if alerts.job_from_path:
        for failure in document.get("program_failures") or []:
            fields = job_of(str(failure.get("origin") or ""), alerts.job_from_path)
            if fields.get("job"):
                labels["job"] = fields["job"]
                break
    return labels


def alerts_for(
    incidents: Sequence[StoredIncident],
    alerts: AlertsConfig,
    *,
    now: float,
    last_delivered: Callable[[str, str], float | None],
) -> list[OutboxItem]:
    """The outbox rows a batch's incident changes call for, one per interested sink.

    A first appearance is a `new` alert; growth or a new label is an `update`, due no
    sooner than `update_interval` after the last message for that incident on that sink
    (and the store folds updates still waiting into one), so a growing incident never
    floods a channel. Merged-away incidents say nothing of their own.
    """
    rows: list[OutboxItem] = []
    for incident in incidents:
        if incident.merged_into:
            continue
        kind = "new" if incident.created == incident.updated else "update"
        for sink in alerts.sinks:
            if not sink_wants(sink, incident.document):
                continue
            due = now
            if kind == "update":
                previous = last_delivered(sink.name, incident.id)
                if previous is not None:
                    due = max(now, previous + alerts.update_interval)
            rows.append(
                OutboxItem(sink=sink.name, incident_id=incident.id, kind=kind, document=incident.document, due=due)
            )
    return rows
