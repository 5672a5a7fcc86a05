"""The HTTP API over a real uvicorn server on loopback, with a Store filled from real scans.

The incidents are what the engine makes of the repository's real logs (the example
page fault, the CUDA fixtures), committed through `Store.commit` as the daemon does,
plus older copies so that pagination has pages to turn.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from triage.api import BadQuery, create_app, format_metrics, health_report, parse_time
from triage.engine import Engine
from triage.model import Incident
from triage.render import event_to_dict, failure_to_dict, format_text, incident_to_dict, iso
from triage.scan import scan
from triage.sources import SourceHealth
from triage.store import Commit, EvidenceRow, LabelChange, Store, StoredIncident
from triage.taxonomy import CATEGORIES, level_of

DATA = Path(__file__).parent / "data"
COPIES = 230
COPY_BASE = 1_700_000_000.0
RECENT = 1_750_000_000.0  # every real incident is after this, every copy before
VERSION = "0.1.0-test"
TOKEN = "s3cret-T0ken_for.tests~"


# -- the data ---------------------------------------------------------------------


def real_incidents(engine: Engine) -> list[Incident]:
    """What `triage scan` finds in the repository's real logs: driver- and code-level, several categories."""
    cuda = DATA / "cuda"
    runs: list[tuple[list[str], list[str]]] = [([str(DATA / "example/kern.log")], [str(DATA / "example/train.log")])]
    for kernel in sorted(cuda.glob("*.kernel.txt")):
        runs.append(([str(kernel)], [str(kernel).replace(".kernel.txt", ".log")]))
    for log_file in sorted(cuda.glob("*.log")):
        if not Path(str(log_file).replace(".log", ".kernel.txt")).exists():
            runs.append(([], [str(log_file)]))
    found: list[Incident] = []
    for kernels, logs in runs:
        found.extend(scan(engine, kernels, logs).incidents)
    assert len({i.id for i in found}) == len(found)
    return found


def stored(incident: Incident, document: dict[str, Any], *, incident_id: str, seen: float | None) -> StoredIncident:
    return StoredIncident(
        id=incident_id,
        level=incident.level,
        category=incident.category,
        fingerprint=incident.fingerprint,
        first_seen=incident.first_seen if seen is None else seen,
        last_seen=incident.last_seen if seen is None else seen,
        created=RECENT,
        updated=RECENT,
        document=document,
    )


@dataclass
class World:
    store: Store
    real: list[Incident]
    example: Incident
    sources: list[SourceHealth] = field(default_factory=list)

    def health(self) -> list[SourceHealth]:
        return list(self.sources)


def fill(store: Store, real: list[Incident]) -> None:
    commit = Commit()
    for incident in real:
        commit.incidents.append(stored(incident, incident_to_dict(incident), incident_id=incident.id, seen=None))
        for n, event in enumerate(incident.kernel_events):
            commit.evidence.append(
                EvidenceRow(f"{incident.id}:k{n}", incident.id, "kernel", event.time, event_to_dict(event))
            )
        for n, failure in enumerate(incident.program_failures):
            commit.evidence.append(
                EvidenceRow(f"{incident.id}:p{n}", incident.id, "program", failure.time, failure_to_dict(failure))
            )
    # Older copies, three to a timestamp, so that pages end inside runs of equal times.
    for n in range(COPIES):
        source = real[n % len(real)]
        copy_id = f"copy-{n:04d}"
        seen = COPY_BASE + (n // 3) * 60
        document = incident_to_dict(source) | {"id": copy_id, "first_seen": iso(seen), "last_seen": iso(seen)}
        commit.incidents.append(stored(source, document, incident_id=copy_id, seen=seen))
    store.commit(commit)
    example = real[0]  # the bundled example: a page fault in both logs
    store.commit(
        Commit(
            changes=[
                LabelChange(example.id, RECENT + 1, "level", "code", "driver"),
                LabelChange(example.id, RECENT + 1, "category", "illegal_memory_access", "vm_page_fault"),
            ]
        )
    )


def healthy(name: str, **overrides: Any) -> SourceHealth:
    now = time.time()
    values: dict[str, Any] = {
        "name": name,
        "alive": True,
        "last_record": now - 3,
        "last_progress": now,
        "lag": 0.25,
        "records": 1234,
        "skipped": 2,
        "lost": 1,
    }
    values.update(overrides)
    return SourceHealth(**values)


# -- the server -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` under a real uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


def fetch(base: str, path: str, *, token: str | None = None, headers: dict[str, str] | None = None) -> Reply:
    """GET like curl does (Accept: */*), any status returned rather than raised."""
    sent = {"User-Agent": "curl/8.5.0", "Accept": "*/*", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + path, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def query(**params: Any) -> str:
    return "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> World:
    store = Store(tmp_path_factory.mktemp("state") / "triage.db")
    real = real_incidents(engine)
    fill(store, real)
    return World(store, real, real[0], [healthy("kmsg"), healthy("file:/var/log/training/rank0.log")])


@pytest.fixture(scope="module")
def api(world: World) -> Iterator[str]:
    with serving(create_app(world.store, health=world.health, token=None, version=VERSION)) as base:
        yield base


Get = Callable[..., Reply]


@pytest.fixture
def get(api: str) -> Get:
    def run(path: str, **kwargs: Any) -> Reply:
        return fetch(api, path, **kwargs)

    return run


# -- /incidents -------------------------------------------------------------------


def test_incidents_print_indented_json_for_curl(get: Get) -> None:
    reply = get("/incidents")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.text.startswith('{\n  "incidents": [\n    {\n      "id": ')
    assert reply.text.endswith("}\n")
    page = reply.json()
    assert len(page["incidents"]) == 100 and page["next_cursor"]


def test_documents_are_the_scan_json(get: Get, world: World) -> None:
    """The API serves the incident JSON of `triage scan --format json`, byte for byte once parsed."""
    page = get("/incidents" + query(since=RECENT, limit=1000)).json()
    assert page["next_cursor"] is None
    by_id = {document["id"]: document for document in page["incidents"]}
    assert by_id == {i.id: json.loads(json.dumps(incident_to_dict(i))) for i in world.real}


def test_newest_first(get: Get) -> None:
    documents = get("/incidents" + query(limit=1000)).json()["incidents"]
    assert len(documents) == len(set(d["id"] for d in documents)) == COPIES + 16
    seen = [d["last_seen"] or "" for d in documents]
    assert seen == sorted(seen, reverse=True)
    assert documents[-1]["id"].startswith("copy-")


@pytest.mark.parametrize("limit", [1, 7, 50, 100, 1000])
def test_pages_follow_the_cursor_without_gaps_or_repeats(get: Get, world: World, limit: int) -> None:
    expected, _ = world.store.incidents(limit=1000)
    ids: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        page = get("/incidents" + query(limit=limit, cursor=cursor)).json()
        assert len(page["incidents"]) <= limit
        ids += [d["id"] for d in page["incidents"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert ids == [i.id for i in expected]
    assert len(ids) == COPIES + len(world.real)


def test_pages_with_filters(get: Get, world: World) -> None:
    ids: list[str] = []
    cursor = None
    while True:
        page = get("/incidents" + query(level="code", limit=9, cursor=cursor)).json()
        assert all(d["level"] == "code" for d in page["incidents"])
        ids += [d["id"] for d in page["incidents"]]
        if (cursor := page["next_cursor"]) is None:
            break
    expected, _ = world.store.incidents(level="code", limit=1000)
    assert ids == [i.id for i in expected] and len(set(ids)) == len(ids)


def test_level_and_category_filters(get: Get, world: World) -> None:
    driver = get("/incidents" + query(level="driver", limit=1000)).json()["incidents"]
    assert driver and all(d["level"] == "driver" for d in driver)
    code = get("/incidents" + query(level="code", limit=1000)).json()["incidents"]
    assert code and all(d["level"] == "code" for d in code)
    assert len(driver) + len(code) == COPIES + len(world.real)
    faults = get("/incidents" + query(category="vm_page_fault", since=RECENT)).json()["incidents"]
    assert sorted(d["id"] for d in faults) == sorted(i.id for i in world.real if i.category == "vm_page_fault")
    assert get("/incidents" + query(category="gpu_lost")).json() == {"incidents": [], "next_cursor": None}
    none = get("/incidents" + query(level="code", category="vm_page_fault")).json()["incidents"]
    assert none == []


def test_time_filters_take_iso_and_epoch(get: Get) -> None:
    start, end = COPY_BASE + 60, COPY_BASE + 5 * 60  # copies 3..17 (three per minute)
    as_epoch = get("/incidents" + query(since=start, until=end, limit=1000)).json()["incidents"]
    assert sorted(d["id"] for d in as_epoch) == [f"copy-{n:04d}" for n in range(3, 18)]
    iso_start, iso_end = "2023-11-14T22:14:20Z", "2023-11-14T22:18:20+00:00"
    assert parse_time("since", iso_start) == start and parse_time("until", iso_end) == end
    as_iso = get("/incidents" + query(since=iso_start, until=iso_end, limit=1000)).json()["incidents"]
    assert as_iso == as_epoch
    millis = get("/incidents" + query(since="2023-11-14T22:14:20.000Z", until=str(end))).json()["incidents"]
    assert millis == as_epoch


def test_text_format_is_the_scan_table(get: Get, world: World) -> None:
    reply = get("/incidents" + query(since=RECENT, format="text", limit=1000))
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain")
    order, _ = world.store.incidents(since=RECENT, limit=1000)
    by_id = {i.id: i for i in world.real}
    assert reply.text == format_text([by_id[s.id] for s in order], width=100)
    assert "DRIVER vm_page_fault  amdgpu GPU VM page fault" in reply.text
    assert "\033[" not in reply.text


def test_text_format_says_how_to_get_the_next_page(get: Get) -> None:
    reply = get("/incidents" + query(format="text", limit=2))
    cursor = get("/incidents" + query(limit=2)).json()["next_cursor"]
    assert reply.text.startswith("2 incident(s): ")
    assert reply.text.endswith(f"More incidents: add cursor={cursor} to the query.\n")
    assert get("/incidents" + query(format="text", category="gpu_lost")).text == "No incidents found.\n"


# -- /incidents/{id} ----------------------------------------------------------------


def test_one_incident_has_evidence_raw_lines_and_changes(get: Get, world: World) -> None:
    example = world.example
    reply = get(f"/incidents/{example.id}")
    assert reply.status == 200
    document = reply.json()
    assert document["id"] == example.id and document["level"] == "driver"
    assert document["kernel_events"][0]["lines"] == event_to_dict(example.kernel_events[0])["lines"]
    assert any("Memory access fault by GPU node-2" in line for line in document["program_failures"][0]["lines"])
    at = iso(RECENT + 1)
    assert document["changes"] == [
        {"at": at, "field": "level", "from": "code", "to": "driver"},
        {"at": at, "field": "category", "from": "illegal_memory_access", "to": "vm_page_fault"},
    ]
    assert reply.text.startswith('{\n  "id": ') and reply.text.endswith("\n")


def test_unknown_incident_is_404_with_a_message(get: Get) -> None:
    for name in ["nope", "inc-000000000000", "%00", "a%20b", "x" * 200]:
        reply = get(f"/incidents/{name}")
        assert reply.status == 404, name
        assert "no incident" in reply.json()["detail"]
    assert get("/incidents/" + "x" * 201).status == 422


# -- /events -------------------------------------------------------------------------


def test_events_kinds_and_limit(get: Get, world: World) -> None:
    events = get("/events" + query(limit=1000)).json()["events"]
    kernel = sum(len(i.kernel_events) for i in world.real)
    program = sum(len(i.program_failures) for i in world.real)
    assert len(events) == kernel + program
    only_kernel = get("/events" + query(kind="kernel", limit=1000)).json()["events"]
    assert len(only_kernel) == kernel and all(e["kind"] == "kernel" for e in only_kernel)
    assert {e["incident_id"] for e in only_kernel} == {i.id for i in world.real if i.kernel_events}
    only_program = get("/events" + query(kind="program")).json()["events"]
    assert len(only_program) == program and all(e["kind"] == "program" for e in only_program)
    assert {e["evidence"]["kind"] for e in only_program} >= {"traceback", "child_failed"}  # the failure's own kind
    assert all(e["evidence"]["lines"] and e["time"] == e["evidence"]["time"] for e in events)
    assert len(get("/events" + query(limit=3)).json()["events"]) == 3
    assert get("/events" + query(since=time.time() + 3600)).json() == {"events": []}
    assert len(get("/events" + query(since="2000-01-01", limit=1000)).json()["events"]) == kernel + program


# -- bad input ---------------------------------------------------------------------

BAD = [
    ("/incidents?since=abc", 400, "since"),
    ("/incidents?since=", 400, "since"),
    ("/incidents?until=2024-13-01", 400, "until"),
    ("/incidents?until=nan", 400, "until"),
    ("/incidents?since=inf", 400, "since"),
    ("/incidents?since=1e400", 400, "since"),
    ("/incidents?since=99999-01-01", 400, "since"),
    ("/incidents?since=%00", 400, "since"),
    ("/incidents?since=2024-01-02&until=2024-01-01", 400, "since"),
    ("/incidents?level=gpu", 422, "level"),
    ("/incidents?level=DRIVER", 422, "level"),
    ("/incidents?category=nope", 400, "category"),
    ("/incidents?category=", 400, "category"),
    ("/incidents?limit=0", 422, "limit"),
    ("/incidents?limit=-1", 422, "limit"),
    ("/incidents?limit=5000", 422, "limit"),
    ("/incidents?limit=abc", 422, "limit"),
    ("/incidents?limit=1.5", 422, "limit"),
    ("/incidents?limit=99999999999999999999999999", 422, "limit"),
    ("/incidents?cursor=garbage", 400, "cursor"),
    ("/incidents?cursor=", 400, "cursor"),
    ("/incidents?cursor=%00%ff", 400, "cursor"),
    ("/incidents?cursor=WzEsMiwzXQ", 400, "cursor"),  # [1,2,3]
    ("/incidents?cursor=eyJhIjoxfQ", 400, "cursor"),  # {"a":1}
    ("/incidents?cursor=WyJ4IiwieSJd", 400, "cursor"),  # ["x","y"]
    ("/incidents?format=xml", 422, "format"),
    ("/events?kind=foo", 422, "kind"),
    ("/events?limit=0", 422, "limit"),
    ("/events?since=yesterday", 400, "since"),
    ("/nowhere", 404, "Not Found"),
]


@pytest.mark.parametrize(("path", "status", "named"), BAD)
def test_bad_parameters_get_a_4xx_with_a_message(get: Get, path: str, status: int, named: str) -> None:
    reply = get(path)
    assert reply.status == status, reply.text
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and named in detail
    assert reply.text.endswith("\n")


def test_parse_time_unit() -> None:
    assert parse_time("since", None) is None
    assert parse_time("since", "1700000000") == 1_700_000_000.0
    assert parse_time("since", "1700000000.5") == 1_700_000_000.5
    assert parse_time("since", "2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("since", "2023-11-14T23:13:20+01:00") == 1_700_000_000.0
    with pytest.raises(BadQuery, match=r'since: expected an ISO 8601 time .* got "soon"'):
        parse_time("since", "soon")


def test_a_genuine_bug_is_a_logged_json_500(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Store):
        def incidents(self, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

    with serving(create_app(Broken(tmp_path / "db"), health=list, token=None, version=VERSION)) as base:
        with caplog.at_level(logging.ERROR, logger="triage.api"):
            reply = fetch(base, "/incidents")
        assert reply.status == 500
        assert reply.json() == {"detail": "internal error; the daemon's log has the details"}
        assert "RuntimeError: a bug" in caplog.text
        assert fetch(base, "/events").status == 200  # and it keeps serving


# -- /healthz ------------------------------------------------------------------------


def test_healthz_200_when_all_sources_progress(get: Get, world: World) -> None:
    reply = get("/healthz")
    assert reply.status == 200
    body = reply.json()
    assert body["status"] == "ok" and body["version"] == VERSION
    kmsg = body["sources"][0]
    assert set(kmsg) >= {"name", "alive", "last_record", "last_progress", "lag", "records", "skipped", "lost", "error"}
    assert kmsg["name"] == "kmsg" and kmsg["alive"] is True and kmsg["records"] == 1234
    assert kmsg["last_record"].endswith("Z") and kmsg["lag"] == 0.25


@pytest.mark.parametrize(
    "broken",
    [
        {"alive": False, "error": "/dev/kmsg: Permission denied"},
        {"last_progress": 1_000.0},
        {"last_progress": None},
    ],
)
def test_healthz_503_when_a_source_is_dead_or_stalled(get: Get, world: World, broken: dict[str, Any]) -> None:
    world.sources.append(healthy("journal", **broken))
    try:
        reply = get("/healthz")
    finally:
        world.sources.pop()
    assert reply.status == 503
    body = reply.json()
    assert body["status"] == "unhealthy"
    assert [s["ok"] for s in body["sources"]] == [True, True, False]
    assert body["sources"][2]["error"] == broken.get("error")


def test_health_report_stale_after() -> None:
    source = healthy("kmsg", last_progress=100.0)
    assert health_report([source], now=129.0, stale_after=30.0)[0] == 200
    assert health_report([source], now=131.0, stale_after=30.0)[0] == 503
    assert health_report([], now=131.0, stale_after=30.0)[0] == 200


# -- /metrics ------------------------------------------------------------------------


def test_metrics_parse_as_prometheus_text(get: Get, world: World) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    reply = get("/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {family.name: family for family in parser.text_string_to_metric_families(reply.text)}
    incidents = {(s.labels["level"], s.labels["category"]): s.value for s in families["triage_incidents"].samples}
    assert families["triage_incidents"].type == "gauge"
    assert {category for _, category in incidents} == set(CATEGORIES)
    expected = world.store.label_counts()
    for category in CATEGORIES:
        key = (level_of(category), category)
        assert incidents[key] == expected.get(key, 0)
    assert incidents[("driver", "gpu_lost")] == 0
    assert sum(incidents.values()) == COPIES + len(world.real)
    records = families["triage_source_records"]  # the parser drops _total from a counter's family name
    assert records.type == "counter"
    assert {s.labels["source"]: s.value for s in records.samples if s.name.endswith("_total")} == {
        "kmsg": 1234,
        "file:/var/log/training/rank0.log": 1234,
    }
    for name in ("triage_source_skipped", "triage_source_lost"):
        assert families[name].type == "counter"
    assert [s.value for s in families["triage_source_up"].samples] == [1, 1]
    assert [s.value for s in families["triage_source_lag_seconds"].samples] == [0.25, 0.25]
    assert families["triage_build_info"].samples[0].labels == {"version": VERSION}
    for name in families:
        assert f"# HELP {name}" in reply.text


def test_metrics_escape_label_values() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    odd = 'file:/logs/a "quoted"\\name\nnext.log'
    text = format_metrics({}, [healthy(odd, lag=None)], "1.0")
    families = {family.name: family for family in parser.text_string_to_metric_families(text)}
    assert families["triage_source_up"].samples[0].labels["source"] == odd
    assert families["triage_source_lag_seconds"].samples == []


# -- OpenAPI ----------------------------------------------------------------------------


def test_openapi_and_docs(get: Get) -> None:
    spec = get("/openapi.json").json()
    assert {"/incidents", "/incidents/{incident_id}", "/events", "/healthz", "/metrics"} <= set(spec["paths"])
    assert spec["info"]["version"] == VERSION
    docs = get("/docs")
    assert docs.status == 200 and "swagger" in docs.text.lower()


def test_schemathesis_finds_no_server_error(api: str, tmp_path: Path) -> None:
    """Property-based requests generated from /openapi.json: nothing may answer 500."""
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    if st is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [
            st,
            "run",
            f"{api}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "40",
            "--phases",
            "examples,coverage,fuzzing",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # its cache (.schemathesis/) stays out of the repository
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


# -- the token -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(world: World) -> Iterator[str]:
    with serving(create_app(world.store, health=world.health, token=TOKEN, version=VERSION)) as base:
        yield base


@pytest.mark.parametrize("path", ["/incidents", "/incidents/nope", "/events", "/metrics", "/x"])
def test_token_required_when_set(guarded: str, path: str) -> None:
    for headers in [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer \u00e9t\u00e9".encode().decode("latin-1")},
    ]:
        reply = fetch(guarded, path, headers=headers)
        assert reply.status == 401, (path, headers)
        assert reply.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in reply.text and TOKEN[:8] not in reply.text
    allowed = fetch(guarded, path, token=TOKEN)
    assert allowed.status == (404 if path in ("/incidents/nope", "/x") else 200)
    assert fetch(guarded, path, headers={"Authorization": f"bearer {TOKEN}"}).status == allowed.status


@pytest.mark.parametrize("path", ["/healthz", "/docs", "/openapi.json"])
def test_health_and_the_api_description_need_no_token(guarded: str, path: str) -> None:
    """Liveness for the fleet's checks, and the OpenAPI page for a browser: no incident data in either."""
    reply = fetch(guarded, path)
    assert reply.status == 200 and TOKEN not in reply.text


def test_token_documented_in_openapi(guarded: str, caplog: pytest.LogCaptureFixture) -> None:
    spec = fetch(guarded, "/openapi.json", token=TOKEN).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert TOKEN not in json.dumps(spec)


def test_alert_delivery_is_reported_in_healthz_and_metrics_without_failing_health(tmp_path: Path) -> None:
    from triage.store import Commit, OutboxItem

    store = Store(tmp_path / "triage.db")
    store.commit(
        Commit(
            alerts=[
                OutboxItem(sink="chat", incident_id="inc-1", kind="new", document={"id": "inc-1"}),
                OutboxItem(sink="chat", incident_id="inc-2", kind="new", document={"id": "inc-2"}),
            ]
        )
    )
    failed = store.due_alerts("chat", time.time() + 1)[0]
    store.mark_failed(failed.seq or 0, "404 from https://hooks.example/***")
    app = create_app(store, health=lambda: [], token=None, version=VERSION)
    with serving(app) as base:
        health = fetch(base, "/healthz")
        assert health.status == 200
        assert health.json()["alerts"] == {"chat": {"failed": 1, "pending": 1}}
        metrics = fetch(base, "/metrics").text
    assert 'triage_alerts{sink="chat",state="failed"} 1' in metrics
    assert 'triage_alerts{sink="chat",state="pending"} 1' in metrics
