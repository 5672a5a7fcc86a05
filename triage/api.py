"""The HTTP API of `triage serve`: incidents, evidence, health and metrics, read-only.

A thin shell over the Store: each endpoint parses its query (bad input is a 4xx
that says what is wrong, never a 500), asks the store, and shapes the answer with
the pure functions below (`parse_time`, `health_report`, `format_metrics`,
`text_view`), which the tests exercise without a server. JSON is indented so that
`curl localhost:8750/incidents` reads well; `jq` does not mind.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import logging
import math
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException

from .render import format_text, iso
from .sources import SourceHealth
from .store import LabelChange, Store, StoredIncident, decode_cursor
from .taxonomy import CATEGORIES, level_of

log = logging.getLogger("triage.api")

#: Paths that answer without the bearer token: a load balancer or systemd probe has none.
#: Open without the token: liveness, and the API's description (no incident data in either).
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/openapi.json", "/docs/oauth2-redirect"})
MAX_LIMIT = 1000
TEXT_WIDTH = 100
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class IndentedJSONResponse(JSONResponse):
    """JSON for people and jq alike: indented, UTF-8, one trailing newline, never NaN."""

    def render(self, content: Any) -> bytes:
        return (json.dumps(content, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


class BadQuery(Exception):
    """A query parameter the API cannot use; answered with 400 and this message."""


# -- pure helpers ---------------------------------------------------------------

_EPOCH = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def parse_time(name: str, value: str | None) -> float | None:
    """ISO 8601 (naive: this machine's local time, as `triage scan --boot-time`) or epoch seconds."""
    if value is None:
        return None
    text = value.strip()
    if _EPOCH.fullmatch(text):
        seconds = float(text)
        if math.isfinite(seconds):
            return seconds
    else:
        try:
            moment = dt.datetime.fromisoformat(text.replace("z", "Z"))
            if moment.tzinfo is None:
                moment = moment.astimezone()
            return moment.timestamp()
        except (ValueError, OverflowError, OSError):
            pass
    raise BadQuery(
        f"{name}: expected an ISO 8601 time (2024-05-01T12:00:00Z) or epoch seconds, got {json.dumps(value)}"
    )


def check_category(value: str | None) -> str | None:
    if value is not None and value not in CATEGORIES:
        raise BadQuery(f"category: unknown category {json.dumps(value)}; known: {', '.join(CATEGORIES)}")
    return value


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def source_report(health: SourceHealth, now: float, stale_after: float) -> dict[str, Any]:
    """One source as /healthz shows it; `progressing` is whether it read or checked its input lately."""
    progressing = health.last_progress is not None and now - health.last_progress <= stale_after
    return {
        "name": health.name,
        "ok": health.alive and progressing,
        "alive": health.alive,
        "progressing": progressing,
        "last_record": iso(_finite(health.last_record)),
        "last_progress": iso(_finite(health.last_progress)),
        "lag": _finite(health.lag),
        "records": health.records,
        "skipped": health.skipped,
        "lost": health.lost,
        "error": health.error,
        "detail": _plain(health.detail),
    }


def _plain(value: Any) -> Any:
    """`value` as strict JSON data (unknown types as text), so one odd detail cannot fail /healthz."""
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False))
    except ValueError:
        return str(value)


def health_report(sources: Sequence[SourceHealth], now: float, stale_after: float) -> tuple[int, dict[str, Any]]:
    """(status code, body): 200 when every source is alive and making progress, else 503."""
    reports = [source_report(source, now, stale_after) for source in sources]
    ok = all(report["ok"] for report in reports)
    return (200 if ok else 503), {"status": "ok" if ok else "unhealthy", "time": iso(now), "sources": reports}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float | int]]

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            inside = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
            yield f"{self.name}{{{inside}}} {_number(value)}" if inside else f"{self.name} {_number(value)}"


def format_metrics(
    counts: dict[tuple[str, str], int],
    sources: Sequence[SourceHealth],
    version: str,
    outbox: dict[tuple[str, str], int] | None = None,
) -> str:
    """Prometheus text exposition 0.0.4: incidents by label (every category, 0 where none), source
    counters, and alerts by sink and state (a `failed` alert is a permanent delivery failure)."""
    incidents: dict[tuple[str, str], int] = {(level_of(category), category): 0 for category in CATEGORIES}
    incidents.update(counts)
    families = [
        _Family(
            "triage_incidents",
            "gauge",
            "Incidents in the store by level and category (TAXONOMY.md).",
            [({"level": level, "category": category}, n) for (level, category), n in incidents.items()],
        ),
        _Family(
            "triage_source_records_total",
            "counter",
            "Records a source has read.",
            [({"source": s.name}, s.records) for s in sources],
        ),
        _Family(
            "triage_source_skipped_total",
            "counter",
            "Records a source skipped (unreadable, over the line cap).",
            [({"source": s.name}, s.skipped) for s in sources],
        ),
        _Family(
            "triage_source_lost_total",
            "counter",
            "Records a source knows it lost (kernel ring overrun, truncated file).",
            [({"source": s.name}, s.lost) for s in sources],
        ),
        _Family(
            "triage_source_up",
            "gauge",
            "1 while the source's reader is alive.",
            [({"source": s.name}, int(s.alive)) for s in sources],
        ),
        _Family(
            "triage_source_lag_seconds",
            "gauge",
            "Seconds between the newest record's own time and when it was read.",
            [({"source": s.name}, lag) for s in sources if (lag := _finite(s.lag)) is not None],
        ),
        _Family(
            "triage_source_last_progress_timestamp_seconds",
            "gauge",
            "When the source last read or checked its input (epoch seconds).",
            [({"source": s.name}, p) for s in sources if (p := _finite(s.last_progress)) is not None],
        ),
        _Family(
            "triage_alerts",
            "gauge",
            "Alerts in the outbox by sink and state (pending, delivered, failed: failed ones are not retried).",
            [({"sink": sink, "state": state}, n) for (sink, state), n in sorted((outbox or {}).items())],
        ),
        _Family("triage_build_info", "gauge", "The running triage version.", [({"version": version}, 1)]),
    ]
    return "".join(line + "\n" for family in families for line in family.lines())


@dataclass(frozen=True, slots=True)
class _TextView:
    """A stored incident as render.format_text reads it (render.TextIncident)."""

    id: str
    level: str
    category: str
    title: str
    hint: str
    first_seen: float | None
    count: int
    evidence: Sequence[str]


def text_view(incident: StoredIncident) -> _TextView:
    document = incident.document
    return _TextView(
        id=incident.id,
        level=incident.level,
        category=incident.category,
        title=str(document.get("title") or ""),
        hint=str(document.get("hint") or ""),
        first_seen=incident.first_seen,
        count=int(document.get("count") or 1),
        evidence=[str(item) for item in document.get("evidence") or []],
    )


def format_text_incidents(incidents: Sequence[StoredIncident], next_cursor: str | None = None) -> str:
    """The table `triage scan` prints, for stored incidents; a last line says how to get the next page."""
    text = format_text([text_view(incident) for incident in incidents], width=TEXT_WIDTH)
    if next_cursor is not None:
        text += f"More incidents: add cursor={next_cursor} to the query.\n"
    return text


def change_to_dict(change: LabelChange) -> dict[str, Any]:
    return {"at": iso(change.at), "field": change.field, "from": change.old, "to": change.new}


def incident_detail(incident: StoredIncident, changes: Sequence[LabelChange]) -> dict[str, Any]:
    """The stored document with its label changes (and where it went, when merged)."""
    detail = dict(incident.document)
    detail["changes"] = [change_to_dict(change) for change in changes]
    if incident.merged_into is not None:
        detail["merged_into"] = incident.merged_into
    return detail


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether `Authorization: Bearer <token>` carries `token`, compared in constant time."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8"))


def _validation_message(errors: Sequence[Any]) -> str:
    parts = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part not in ("query", "path", "body")]
        parts.append(f"{'.'.join(location) or 'request'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


# -- the app --------------------------------------------------------------------

INCIDENT_PAGE_EXAMPLE = {"incidents": [{"id": "3e15d3cdb71e", "level": "driver", "category": "vm_page_fault"}]}


def create_app(
    store: Store,
    *,
    health: Callable[[], list[SourceHealth]],
    token: str | None,
    version: str,
    stale_after: float = 30.0,
) -> FastAPI:
    """The API over `store`; `health` reports the sources; `token` (when set) guards all but /healthz."""
    app = FastAPI(
        title="triage",
        version=version,
        description="GPU training failures labelled driver- or code-level (TAXONOMY.md), read-only.",
        default_response_class=IndentedJSONResponse,
    )
    secret = token or None

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        return IndentedJSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> Response:
        errors = error.errors()
        return IndentedJSONResponse(
            {
                "detail": _validation_message(errors),
                "errors": [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors],
            },
            status_code=422,
        )

    @app.exception_handler(BadQuery)
    async def bad_query(request: Request, error: BadQuery) -> Response:
        return IndentedJSONResponse({"detail": str(error)}, status_code=400)

    @app.exception_handler(sqlite3.OperationalError)
    async def store_busy(request: Request, error: sqlite3.OperationalError) -> Response:
        log.warning("store unavailable for %s: %s", request.url.path, error)
        return IndentedJSONResponse({"detail": f"store unavailable: {error}"}, status_code=503)

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """The token check for every path but the public ones, and a JSON 500 for genuine bugs."""
        public = request.url.path in PUBLIC_PATHS
        if secret is not None and not public and not bearer_ok(request.headers.get("authorization"), secret):
            return IndentedJSONResponse(
                {"detail": "missing or wrong bearer token (Authorization: Bearer TOKEN)"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            return await call_next(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return IndentedJSONResponse({"detail": "internal error; the daemon's log has the details"}, 500)

    # The scheme only documents the token in /docs; `guard` enforces it, /docs included.
    protected = APIRouter(dependencies=[Depends(HTTPBearer(auto_error=False))] if secret else [])

    @protected.get(
        "/incidents",
        summary="Incidents, newest first",
        responses={
            200: {
                "description": "A page of incident documents (the JSON of `triage scan`) and the cursor of the next",
                "content": {"application/json": {"example": INCIDENT_PAGE_EXAMPLE}, "text/plain": {}},
            },
            400: {"description": "A query parameter the API cannot use"},
        },
    )
    def list_incidents(
        since: str | None = Query(None, description="Seen at or after: ISO 8601 (naive = local) or epoch seconds"),
        until: str | None = Query(None, description="Seen at or before: ISO 8601 or epoch seconds"),
        level: Literal["driver", "code"] | None = Query(None, description="driver or code"),
        category: str | None = Query(
            None, description=f"A TAXONOMY.md category: {', '.join(CATEGORIES)}", examples=["vm_page_fault"]
        ),
        limit: int = Query(100, ge=1, le=MAX_LIMIT, description="Incidents per page"),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page"),
        format: Literal["json", "text"] = Query("json", description="text: the table `triage scan` prints"),
    ) -> Response:
        start, end = parse_time("since", since), parse_time("until", until)
        if start is not None and end is not None and start > end:
            raise BadQuery("since: is after until")
        check_category(category)
        if cursor is not None:
            try:
                decode_cursor(cursor)
            except ValueError:
                raise BadQuery("cursor: not a cursor this API gave out (use next_cursor as it is)") from None
        found, following = store.incidents(
            since=start, until=end, level=level, category=category, limit=limit, cursor=cursor
        )
        if format == "text":
            return PlainTextResponse(format_text_incidents(found, following))
        return IndentedJSONResponse({"incidents": [incident.document for incident in found], "next_cursor": following})

    @protected.get(
        "/incidents/{incident_id}",
        summary="One incident: all its evidence with raw lines, and its label changes",
        responses={404: {"description": "No such incident"}},
    )
    def get_incident(incident_id: str = Path(..., max_length=200)) -> Response:
        incident = store.incident(incident_id)
        if incident is None:
            raise HTTPException(404, f"no incident {json.dumps(incident_id)}")
        return IndentedJSONResponse(incident_detail(incident, store.changes(incident_id)))

    @protected.get("/events", summary="Recent kernel events and program failures, newest stored first")
    def list_events(
        since: str | None = Query(None, description="Stored at or after: ISO 8601 or epoch seconds"),
        limit: int = Query(100, ge=1, le=MAX_LIMIT),
        kind: Literal["kernel", "program"] | None = Query(None),
    ) -> Response:
        rows = store.evidence(since=parse_time("since", since), limit=limit, kind=kind)
        events = [
            {
                "key": row.key,
                "kind": row.kind,
                "incident_id": row.incident_id,
                "time": iso(row.time),
                "evidence": row.document,
            }
            for row in rows
        ]
        return IndentedJSONResponse({"events": events})

    @protected.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {METRICS_CONTENT_TYPE: {}}}},
    )
    def metrics() -> Response:
        body = format_metrics(store.label_counts(), _safe_health(health), version, store.outbox_counts())
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    @app.get(
        "/healthz",
        summary="Per source: alive, last record, lag, counts; 503 when one is dead or stalled",
        responses={503: {"description": "A source is dead or has made no progress lately"}},
    )
    def healthz() -> Response:
        try:
            sources = health()
        except Exception as error:
            log.exception("health check failed")
            return IndentedJSONResponse({"status": "unhealthy", "error": str(error), "sources": []}, 503)
        status, body = health_report(sources, time.time(), stale_after)
        body["version"] = version
        # Alert delivery is reported, not judged: a dead webhook must not get the daemon restarted.
        alerts: dict[str, dict[str, int]] = {}
        for (sink, state), count in store.outbox_counts().items():
            alerts.setdefault(sink, {})[state] = count
        body["alerts"] = alerts
        return IndentedJSONResponse(body, status)

    app.include_router(protected)
    return app


def _safe_health(health: Callable[[], list[SourceHealth]]) -> list[SourceHealth]:
    """Sources for /metrics; a failing health callback costs the source series, not the scrape."""
    try:
        return health()
    except Exception:
        log.exception("health check failed")
        return []
