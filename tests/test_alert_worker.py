"""The alert delivery worker against real HTTP receivers on loopback, with a fake clock."""

from __future__ import annotations

import datetime
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.receiver import Answer, Receiver
from triage.alerts.responses import Delivered, Permanent, Retry
from triage.alerts.worker import AlertWorker, send, send_test
from triage.config import AlertsConfig, SinkConfig
from triage.store import Commit, OutboxItem, Store

T0 = 1_764_500_000.0
TOKEN = "T0KEN-abcdef0123456789"
SECRET = "SEC-very-secret-value"


@pytest.fixture
def rx() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "triage.db")
    yield s
    s.close()


def sink(rx: Receiver, kind: str = "generic", name: str = "hook", **extra: Any) -> SinkConfig:
    return SinkConfig(name=name, kind=kind, url=f"{rx.url}/hook/{TOKEN}?access_token={TOKEN}", **extra)


def worker(store: Store, *sinks: SinkConfig, **extra: Any) -> AlertWorker:
    alerts = AlertsConfig(node="node-1", sinks=sinks, **extra)
    return AlertWorker(store, alerts, base_url="http://triage:8080", node="node-1", rng=random.Random(7))


def document(number: int) -> dict[str, Any]:
    return {
        "id": f"inc-{number:04d}",
        "level": "driver" if number % 2 else "code",
        "category": "xid" if number % 2 else "oom",
        "title": f"incident {number}",
        "devices": ["GPU0"],
        "evidence": [f"line {number}"],
        "hint": "check it",
        "fingerprint": f"fp{number}",
    }


def queue(store: Store, *numbers: int, sink: str = "hook", kind: str = "new", due: float = T0) -> None:
    store.commit(Commit(alerts=[OutboxItem(sink, f"inc-{n:04d}", kind, document(n), due=due) for n in numbers]))


def states(store: Store) -> list[tuple[str, str, int]]:
    return [(a.incident_id, a.state, a.attempts) for a in store.alerts()]


def test_a_queued_new_is_delivered_once(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    w = worker(store, sink(rx))
    assert w.run_once(T0) == 1
    assert w.run_once(T0 + 100) == 0
    assert len(rx.requests) == 1
    request = rx.requests[0]
    assert request.path == f"/hook/{TOKEN}" and request.body["kind"] == "new"
    assert request.body["incident"]["id"] == "inc-0001" and request.body["node"] == "node-1"
    assert states(store) == [("inc-0001", "delivered", 0)]
    health = w.health()["sinks"]["hook"]
    assert (health["delivered"], health["pending"], health["failed"]) == (1, 0, 0)


def test_500_then_200_is_retried_with_backoff_and_delivered_once(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    rx.answer(Answer(500, b"boom"))
    w = worker(store, sink(rx))
    assert w.run_once(T0) == 1
    [row] = store.alerts()
    assert row.state == "pending" and row.attempts == 1 and row.due is not None and T0 <= row.due <= T0 + 1.0
    assert row.last_error is not None and "HTTP 500" in row.last_error
    # Within the digest window nothing new goes out; after it, the retry does.
    assert w.run_once(T0 + 11) == 1
    assert w.run_once(T0 + 30) == 0
    assert len(rx.requests) == 2
    assert states(store) == [("inc-0001", "delivered", 1)]


def test_429_retry_after_is_honoured(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    rx.answer(Answer(429, {"message": "slow down"}, {"Retry-After": "120"}))
    w = worker(store, sink(rx))
    w.run_once(T0)
    [row] = store.alerts()
    assert row.due == T0 + 120 and row.state == "pending"
    assert w.run_once(T0 + 119) == 0
    assert w.run_once(T0 + 120) == 1
    assert states(store) == [("inc-0001", "delivered", 1)]


def test_404_fails_for_good_and_is_never_retried(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    rx.default = Answer(404, b"no_such_hook")
    w = worker(store, sink(rx))
    assert w.run_once(T0) == 1
    assert states(store) == [("inc-0001", "failed", 1)]
    assert w.run_once(T0 + 1000) == 0
    assert len(rx.requests) == 1
    health = w.health()["sinks"]["hook"]
    assert health["failed"] == 1 and "HTTP 404" in health["permanent_failures"][0]["error"]


def test_feishu_in_body_signature_error_fails(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    rx.default = Answer(
        200, {"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}
    )
    w = worker(store, sink(rx, "feishu", secret=SECRET))
    w.run_once(T0)
    assert states(store) == [("inc-0001", "failed", 1)]
    body = rx.requests[0].body
    assert body["timestamp"] == str(int(T0)) and body["sign"]


def test_dingtalk_rate_limit_code_is_retried_and_signed_at_each_attempt(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    rx.answer(Answer(200, {"errcode": 130101, "errmsg": "send too fast"}))
    rx.default = Answer(200, {"errcode": 0, "errmsg": "ok"})
    w = worker(store, sink(rx, "dingtalk", secret=SECRET))
    w.run_once(T0)
    [row] = store.alerts()
    assert row.state == "pending" and row.due == T0 + 60
    w.run_once(T0 + 60)
    assert states(store) == [("inc-0001", "delivered", 1)]
    stamps = [r.query["timestamp"][0] for r in rx.requests]
    assert stamps == [str(int(T0 * 1000)), str(int((T0 + 60) * 1000))]


def test_a_burst_of_50_becomes_one_digest(store: Store, rx: Receiver) -> None:
    queue(store, *range(1, 51))
    w = worker(store, sink(rx))
    assert w.run_once(T0) == 1
    assert len(rx.requests) == 1
    body = rx.requests[0].body
    assert body["kind"] == "digest" and body["total"] == 50
    assert all(state == "delivered" for _, state, _ in states(store))


def test_a_storm_gives_a_bounded_number_of_messages(store: Store, rx: Receiver) -> None:
    w = worker(store, sink(rx))
    # 1000 incidents within 10 s, the worker passing every 0.5 s.
    for step in range(20):
        now = T0 + step * 0.5
        queue(store, *range(step * 50, step * 50 + 50), due=now)
        w.run_once(now)
    for step in range(20, 60):
        w.run_once(T0 + step * 0.5)
    assert len(rx.requests) <= 3
    assert sum(r.body.get("total", 1) for r in rx.requests) == 1000
    assert all(state == "delivered" for _, state, _ in states(store))


def test_a_stopped_receiver_is_retried_then_delivered(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    w = worker(store, sink(rx))
    rx.stop()
    assert w.run_once(T0) == 1
    [row] = store.alerts()
    assert row.state == "pending" and row.attempts == 1 and row.last_error and "network error" in row.last_error
    assert w.run_once(T0 + 11) == 1  # still down
    rx.start()
    w.run_once(T0 + 30)
    assert states(store) == [("inc-0001", "delivered", 2)]
    assert len(rx.requests) == 1


def test_a_restarted_worker_sends_nothing_again(store: Store, rx: Receiver, tmp_path: Path) -> None:
    queue(store, 1, 2)
    queue(store, 3)
    worker(store, sink(rx)).run_once(T0)
    assert len(rx.requests) == 1
    store.close()
    again = Store(tmp_path / "triage.db")
    try:
        assert worker(again, sink(rx)).run_once(T0 + 1000) == 0
    finally:
        again.close()
    assert len(rx.requests) == 1


def test_alertmanager_gets_every_alert_on_every_url(store: Store) -> None:
    one, two = Receiver(), Receiver()
    try:
        am = SinkConfig(name="am", kind="alertmanager", urls=(one.url, two.url))
        queue(store, 1, 2, sink="am")
        two.answer(Answer(503, b"unavailable"))
        w = worker(store, am)
        assert w.run_once(T0) == 2
        assert [r.path for r in one.requests] == ["/api/v2/alerts"]
        assert {a["labels"]["fingerprint"] for a in one.requests[0].body} == {"fp1", "fp2"}
        assert all(state == "pending" for _, state, _ in states(store))
        # The retry goes only to the one that did not accept.
        assert w.run_once(T0 + 400) == 1
        assert len(one.requests) == 1 and len(two.requests) == 2
        assert {a["labels"]["fingerprint"] for a in two.requests[1].body} == {"fp1", "fp2"}
        assert all(state == "delivered" for _, state, _ in states(store))
    finally:
        one.stop()
        two.stop()


def test_update_waits_for_the_update_interval(store: Store, rx: Receiver) -> None:
    queue(store, 1)
    w = worker(store, sink(rx))
    w.run_once(T0)
    queue(store, 1, kind="update", due=T0 + 1)
    assert w.run_once(T0 + 1) == 0
    assert w.run_once(T0 + 61) == 1
    assert rx.requests[-1].body["kind"] == "update"


def test_the_rate_limit_holds_back_updates(store: Store, rx: Receiver) -> None:
    queue(store, *range(1, 11), kind="resolved")
    w = worker(store, sink(rx, rate_per_minute=6.0))
    assert w.run_once(T0) == 5  # the burst
    assert w.run_once(T0 + 1) == 0
    assert w.run_once(T0 + 10) == 1  # 6 a minute: one token per 10 s


def test_secrets_never_show_in_health_or_stored_errors(store: Store, rx: Receiver) -> None:
    queue(store, 1, 2, sink="hook")
    # The receiver echoes the URL and the secret back: they must still not be stored.
    rx.default = Answer(500, f"bad {rx.url}/hook/{TOKEN}?access_token={TOKEN} secret {SECRET}".encode())
    w = worker(store, sink(rx, "feishu", secret=SECRET))
    w.run_once(T0)
    text = json.dumps(w.health()) + json.dumps([a.last_error for a in store.alerts()])
    assert TOKEN not in text and SECRET not in text
    assert "***" in text


def test_send_reports_refused_connections_as_status_0(rx: Receiver) -> None:
    from triage.alerts.formats import Request

    url = rx.url + "/x"
    rx.stop()
    status, _, body = send(Request(url, {"a": 1}), timeout=2)
    assert status == 0 and b"network error" in body


def test_send_test_posts_a_marked_test_message(rx: Receiver) -> None:
    outcome = send_test(sink(rx, "slack"), node="node-1", base_url="http://triage:8080", now=T0)
    assert outcome == Delivered()
    assert rx.requests[0].body["text"].startswith("[TEST]")
    rx.default = Answer(404, b"no_service")
    failed = send_test(sink(rx, "slack"), node="node-1", base_url="http://triage:8080", now=T0)
    assert isinstance(failed, Permanent) and TOKEN not in failed.reason
    rx.stop()
    assert isinstance(send_test(sink(rx, "slack"), node="n", base_url="http://x", now=T0), Retry)


def test_alertmanager_firing_alerts_are_reposted_then_resolved(store: Store, rx: Receiver) -> None:
    from triage.store import StoredIncident

    doc = document(3) | {"level": "driver", "category": "gpu_reset"}
    store.commit(Commit(incidents=[StoredIncident("inc-0003", "driver", "gpu_reset", "fp3", T0, T0, T0, T0, doc)]))
    am = SinkConfig(name="am", kind="alertmanager", urls=(rx.url,))
    w = worker(store, am, alertmanager_repeat=60.0, resolve_after=300.0)
    assert w.run_once(T0 + 1) == 1  # nothing queued: the repeat round posts what is open
    assert w.run_once(T0 + 30) == 0  # not yet a minute
    assert w.run_once(T0 + 62) == 1
    firing = [a for r in rx.requests for a in r.body]
    assert {a["labels"]["category"] for a in firing} == {"gpu_reset"}
    assert all(a["endsAt"] > a["startsAt"] for a in firing)
    rx.requests.clear()
    assert w.run_once(T0 + 400) == 1  # quiet for longer than resolve_after: resolved, once
    (resolved,) = [a for r in rx.requests for a in r.body]
    assert resolved["labels"]["fingerprint"] == "fp3"
    ends = datetime.datetime.fromisoformat(resolved["endsAt"].replace("Z", "+00:00")).timestamp()
    assert abs(ends - (T0 + 400)) < 1  # resolved: ends now
    rx.requests.clear()
    assert w.run_once(T0 + 470) == 0 and rx.requests == []


def test_alertmanager_resolves_the_old_label_set_of_a_relabelled_incident(store: Store, rx: Receiver) -> None:
    from triage.store import StoredIncident

    code = document(4) | {"level": "code", "category": "unclassified", "fingerprint": "fp-code"}
    queue(store, 4, sink="am")
    store.commit(Commit(alerts=[OutboxItem("am", "inc-0004", "update", code, due=T0)]))  # the posted label set
    am = SinkConfig(name="am", kind="alertmanager", urls=(rx.url,))
    w = worker(store, am, alertmanager_repeat=60.0, resolve_after=300.0)
    w.run_once(T0 + 1)
    driver = code | {"level": "driver", "category": "gpu_reset", "fingerprint": "fp-driver"}
    store.commit(
        Commit(incidents=[StoredIncident("inc-0004", "driver", "gpu_reset", "fp-driver", T0, T0, T0, T0 + 2, driver)])
    )
    rx.requests.clear()
    w.run_once(T0 + 62)
    posted = [(a["labels"]["category"], a["endsAt"]) for r in rx.requests for a in r.body]
    ends = {category: datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() for category, at in posted}
    assert set(ends) == {"gpu_reset", "unclassified"}
    assert abs(ends["unclassified"] - (T0 + 62)) < 1  # the old label set: resolved now
    assert ends["gpu_reset"] > T0 + 62 + 60  # the new one: firing
