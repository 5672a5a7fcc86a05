"""The alert delivery worker: drains the store's outbox into the configured sinks, politely.

`AlertWorker.run_once(now)` is one pass over every sink; `start()` runs it every
`PASS_INTERVAL` seconds on a thread and `stop()` lets the pass in flight finish. Each pass, per sink:

1. A token bucket of `sink.per_minute` messages a minute (burst `min(5, per_minute)`, at least 1)
   allows a message; with no token left the sink waits for the next pass (nothing is marked).
2. `new` alerts (kind "new") go out at most once per `alerts.digest_window` seconds per sink: when
   no new-alert message was sent in the last window, every due `new` item (up to `DIGEST_LIMIT`) is
   sent at once, as the incident's own message when there is one, else as ONE digest
   (`formats.digest_for`); otherwise they wait for the window to end, piling up into the next
   digest. The first incident of a quiet spell therefore goes out at once, and a storm costs:

       new-alert messages per sink <= 1 + ceil(storm_seconds / digest_window)  (each <= DIGEST_LIMIT items)

   so 1000 incidents within 10 s with the default 10 s window give at most 3 messages per sink
   (one at once, one at +10 s, a last one at +20 s for what came in just after it), well inside
   every platform's rate limit. Updates and resolves go one by one through the same bucket; an
   `update` also waits until `alerts.update_interval` after the incident's last delivered alert
   (the store coalesces further updates into it while it waits).
3. Alertmanager sinks need no digest (Alertmanager groups alerts itself): all due items go in one
   `POST /api/v2/alerts` to EVERY URL of the sink; an item is delivered once each URL accepted it,
   and a retry posts only to the URLs that have not (remembered in memory: after a restart all
   are posted to again, which Alertmanager treats as the same alert).

A request is built at each attempt with the attempt's `now` (Feishu and DingTalk signatures
expire). An answer becomes `mark_delivered(seq, now, sent=item.document)`, `mark_retry(seq, now +
(Retry-After or backoff(attempts)), reason)` or `mark_failed(seq, reason)`; network errors (status 0
from `send`) are retried. Every reason is scrubbed of the sink's URLs, their tokens and its secret
before it is stored, logged or shown by `health()`.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import AlertsConfig, SinkConfig
from ..store import OutboxItem, Store
from .formats import Message, Request, build, digest_for, message_for, redact
from .responses import Delivered, Outcome, Permanent, Retry, backoff, interpret
from .routing import labels_for, sink_wants

log = logging.getLogger(__name__)

#: Seconds between passes of the worker's thread.
PASS_INTERVAL = 0.5
#: Most `new` items one digest (or one Alertmanager post) carries; the rest wait for the next one.
DIGEST_LIMIT = 1000
#: Most update/resolve items looked at per sink and pass.
BATCH_LIMIT = 100
#: Burst of the per-sink token bucket.
BURST = 5.0
#: Permanent failures health() lists per sink (the newest).
HEALTH_FAILURES = 10

Sender = Callable[..., tuple[int, dict[str, str], bytes]]


def send(request: Request, *, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """POST `request`; (status, headers, body). A network error (refused, timeout, DNS) is status 0
    with the error's text as the body: the worker retries it."""
    data = json.dumps(request.json, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "gpu-triage", **dict(request.headers)}
    http_request = urllib.request.Request(request.url, data=data, headers=headers, method=request.method)
    try:
        with urllib.request.urlopen(http_request, timeout=timeout) as answer:
            return answer.status, dict(answer.headers.items()), answer.read()
    except urllib.error.HTTPError as error:
        try:
            body = error.read()
        except OSError:
            body = b""
        return error.code, dict(error.headers.items()) if error.headers else {}, body
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return 0, {}, f"network error: {reason}".encode()


# -- secrets ---------------------------------------------------------------------------


def _secret_parts(sink: SinkConfig) -> list[str]:
    """Strings that must never be shown: the URLs, their path and query tokens, the secret."""
    parts: list[str] = []
    for url in sink.targets:
        if not url:
            continue
        parts.append(url)
        try:
            split = urllib.parse.urlsplit(url)
        except ValueError:
            continue
        parts.extend(piece for piece in split.path.split("/") if len(piece) >= 6)
        parts.extend(value for _, value in urllib.parse.parse_qsl(split.query) if len(value) >= 4)
        if split.password:
            parts.append(split.password)
    if sink.secret:
        parts.append(sink.secret)
    return sorted(set(parts), key=len, reverse=True)


def scrub(text: str, sink: SinkConfig) -> str:
    """`text` with the sink's URLs redacted and every token and secret of it replaced by ***."""
    for url in sink.targets:
        if url:
            text = text.replace(url, redact(url))
    for part in _secret_parts(sink):
        text = text.replace(part, "***")
    return text


# -- sending one message -----------------------------------------------------------------


def _combine(outcomes: Sequence[Outcome]) -> Outcome:
    """All delivered -> Delivered; any retry -> the longest retry; else the first permanent failure."""
    retries = [o for o in outcomes if isinstance(o, Retry)]
    if retries:
        waits = [r.after_seconds for r in retries if r.after_seconds is not None]
        return Retry(max(waits) if waits else None, "; ".join(r.reason for r in retries))
    failed = [o for o in outcomes if isinstance(o, Permanent)]
    return failed[0] if failed else Delivered()


def _attempt(sink: SinkConfig, request: Request, sender: Sender, now: float) -> Outcome:
    """One request, its answer read (status 0, a network error, is a Retry); the reason scrubbed."""
    try:
        status, headers, body = sender(request)
    except Exception as error:  # a sender must not kill the worker
        status, headers, body = 0, {}, f"send failed: {type(error).__name__}: {error}".encode()
    if status == 0:
        outcome: Outcome = Retry(None, body.decode("utf-8", errors="replace")[:200] or "network error")
    else:
        outcome = interpret(sink.kind, status, headers, body, now)
    target = redact(request.url)
    if isinstance(outcome, Retry):
        return Retry(outcome.after_seconds, scrub(f"{target}: {outcome.reason}", sink))
    if isinstance(outcome, Permanent):
        return Permanent(scrub(f"{target}: {outcome.reason}", sink))
    return outcome


TEST_DOCUMENT: dict[str, Any] = {
    "id": "test",
    "level": "code",
    "category": "test",
    "title": "Test alert from gpu-triage: nothing is wrong, please ignore",
    "devices": [],
    "evidence": ["This is a test message sent by `triage alert test`."],
    "hint": "If you can read this, the sink is configured correctly.",
    "fingerprint": "test",
    "count": 1,
}


def send_test(
    sink: SinkConfig,
    *,
    node: str,
    base_url: str,
    sender: Sender = send,
    now: float | None = None,
    labels: Mapping[str, str] | None = None,
) -> Outcome:
    """Send one clearly marked test message (kind "test") to every URL of `sink`; what it answered."""
    when = time.time() if now is None else now
    message = message_for(TEST_DOCUMENT, node=node, base_url=base_url, kind="test", labels=labels)
    outcomes = [
        _attempt(sink, build(sink.kind, message, url=url, secret=sink.secret or None, now=when), sender, when)
        for url in sink.targets
    ]
    return _combine(outcomes)


# -- the worker --------------------------------------------------------------------------


@dataclass
class _Bucket:
    """A token bucket: `rate` tokens a second up to `capacity`; starts full."""

    rate: float
    capacity: float
    tokens: float
    last: float | None = None

    def take(self, now: float) -> bool:
        if self.last is not None and now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        if self.last is None or now > self.last:
            self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _SinkState:
    bucket: _Bucket
    #: When the last new-alert message (single or digest) was sent; None: never (this process).
    last_new: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    #: Alertmanager: seq -> the target URLs that already accepted it.
    accepted: dict[int, set[str]] = field(default_factory=dict)
    #: Alertmanager: when firing alerts were last re-posted, and which incidents were firing.
    last_repeat: float | None = None
    firing: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Posted documents whose label set an outbox alert replaced: resolved at the next round.
    replaced: list[dict[str, Any]] = field(default_factory=list)


class AlertWorker:
    """Delivers the store's outbox to `alerts.sinks`; see the module docstring for the rules."""

    def __init__(
        self,
        store: Store,
        alerts: AlertsConfig,
        *,
        base_url: str,
        node: str,
        clock: Callable[[], float] = time.time,
        sender: Sender = send,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.alerts = alerts
        self.base_url = base_url
        self.node = node
        self.clock = clock
        self.sender = sender
        self.rng = rng if rng is not None else random.Random()
        self._states: dict[str, _SinkState] = {}
        for sink in alerts.sinks:
            per_minute = max(sink.per_minute, 1e-9)
            capacity = max(1.0, min(BURST, per_minute))
            self._states[sink.name] = _SinkState(_Bucket(per_minute / 60.0, capacity, capacity))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the thread ----------------------------------------------------------------

    def start(self) -> None:
        """Run a pass every PASS_INTERVAL seconds on a daemon thread (no-op when running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="alert-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread after the pass in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once(self.clock())
            except Exception:
                log.exception("alert worker: pass failed")
            self._stop.wait(PASS_INTERVAL)

    # -- one pass ------------------------------------------------------------------

    def run_once(self, now: float) -> int:
        """One pass over every sink at time `now`; how many HTTP requests it sent."""
        with self._lock:
            sent = 0
            for sink in self.alerts.sinks:
                sent += self._pass(sink, now)
            return sent

    def _message(self, item: OutboxItem) -> Message:
        return self._message_of(item.document, item.kind)

    def _pass(self, sink: SinkConfig, now: float) -> int:
        state = self._states[sink.name]
        if sink.kind == "alertmanager":
            return self._pass_alertmanager(sink, state, now)
        sent = 0
        due = self.store.due_alerts(sink.name, now, limit=DIGEST_LIMIT + BATCH_LIMIT)
        fresh = [item for item in due if item.kind == "new"][:DIGEST_LIMIT]
        others = [item for item in due if item.kind != "new"][:BATCH_LIMIT]
        window_open = state.last_new is None or now - state.last_new >= self.alerts.digest_window
        if fresh and window_open and state.bucket.take(now):
            if len(fresh) == 1:
                message = self._message(fresh[0])
            else:
                documents = [item.document for item in fresh]
                message = digest_for(documents, node=self.node, base_url=self.base_url, labels=self._labels())
            state.last_new = now
            sent += 1
            self._settle(sink, state, fresh, self._send(sink, message, sink.targets[0], now), now)
        for item in others:
            if item.kind == "update":
                last = self.store.last_delivered(sink.name, item.incident_id)
                if last is not None and now - last < self.alerts.update_interval:
                    continue
            if not state.bucket.take(now):
                break
            sent += 1
            self._settle(sink, state, [item], self._send(sink, self._message(item), sink.targets[0], now), now)
        return sent

    def _repeat_alertmanager(self, sink: SinkConfig, state: _SinkState, now: float) -> int:
        """Re-post every open incident as firing each `alertmanager_repeat` seconds (Alertmanager
        resolves what is not re-posted before its endsAt), and those that went quiet for
        `resolve_after` once as resolved. Best effort: a missed round is repeated next round."""
        if state.last_repeat is not None and now - state.last_repeat < self.alerts.alertmanager_repeat:
            return 0
        state.last_repeat = now
        # Open: changed by the daemon within resolve_after (not by its evidence's own time: an
        # old log read today is news today).
        recent, _ = self.store.incidents(updated_since=now - self.alerts.resolve_after, limit=1000)
        open_documents = {i.id: i.document for i in recent if sink_wants(sink, i.document)}
        messages = [self._message_of(document, "update") for document in open_documents.values()]
        # Alertmanager knows an alert by its labels: an incident that went quiet, or whose level
        # or category changed since it was posted, has its old label set resolved.
        messages += [
            self._message_of(document, "resolved")
            for incident_id, document in state.firing.items()
            if incident_id not in open_documents or _identity(open_documents[incident_id]) != _identity(document)
        ]
        messages += [self._message_of(document, "resolved") for document in state.replaced]
        state.replaced = []
        state.firing = open_documents
        if not messages:
            return 0
        for url in sink.targets:
            alerts: list[Any] = []
            target = url
            for message in messages:
                request = build(sink.kind, message, url=url, secret=sink.secret or None, now=now)
                alerts.extend(request.json)
                target = request.url
            outcome = _attempt(sink, Request(target, alerts), self.sender, now)
            if not isinstance(outcome, Delivered):
                state.last_error, state.last_error_at = scrub(str(getattr(outcome, "reason", "")), sink), now
        return len(sink.targets)

    def _message_of(self, document: dict[str, Any], kind: str) -> Message:
        return message_for(
            document, node=self.node, base_url=self.base_url, kind=kind, labels=labels_for(document, self.alerts)
        )

    def _pass_alertmanager(self, sink: SinkConfig, state: _SinkState, now: float) -> int:
        due = self.store.due_alerts(sink.name, now, limit=DIGEST_LIMIT)
        if not due:
            return self._repeat_alertmanager(sink, state, now)
        if not state.bucket.take(now):
            return 0
        sent = 0
        outcomes: dict[str, Outcome] = {}
        for url in sink.targets:
            items = [item for item in due if url not in state.accepted.get(_seq(item), set())]
            if not items:
                continue
            alerts: list[Any] = []
            target = url
            for item in items:
                request = build(sink.kind, self._message(item), url=url, secret=sink.secret or None, now=now)
                alerts.extend(request.json)
                target = request.url
            sent += 1
            request = Request(target, alerts)
            outcome = _attempt(sink, request, self.sender, now)
            outcomes[url] = outcome
            if isinstance(outcome, Delivered):
                for item in items:
                    state.accepted.setdefault(_seq(item), set()).add(url)
        for item in due:
            seq = _seq(item)
            done = state.accepted.get(seq, set())
            pending = [outcomes[url] for url in sink.targets if url not in done and url in outcomes]
            outcome = _combine(pending) if pending else Delivered()
            if not isinstance(outcome, Retry):
                state.accepted.pop(seq, None)
            if isinstance(outcome, Delivered) and item.kind != "resolved":
                previous = state.firing.get(item.incident_id)
                if previous is not None and _identity(previous) != _identity(item.document):
                    state.replaced.append(previous)  # resolved at the next repeat round
                state.firing[item.incident_id] = item.document
            self._settle(sink, state, [item], outcome, now)
        return sent

    def _labels(self) -> dict[str, str]:
        labels = dict(self.alerts.labels)
        labels["node"] = self.node
        return labels

    def _send(self, sink: SinkConfig, message: Message, url: str, now: float) -> Outcome:
        request = build(sink.kind, message, url=url, secret=sink.secret or None, now=now)
        return _attempt(sink, request, self.sender, now)

    def _settle(
        self, sink: SinkConfig, state: _SinkState, items: list[OutboxItem], outcome: Outcome, now: float
    ) -> None:
        """Write `outcome` for each of `items` to the store."""
        if isinstance(outcome, Delivered):
            for item in items:
                self.store.mark_delivered(_seq(item), now, sent=item.document)
            return
        reason = scrub(outcome.reason, sink)
        state.last_error, state.last_error_at = reason, now
        if isinstance(outcome, Retry):
            for item in items:
                wait = outcome.after_seconds
                if wait is None:
                    wait = backoff(item.attempts, rng=self.rng)
                self.store.mark_retry(_seq(item), now + wait, reason)
            log.warning("alert sink %s: %d alert(s) will be retried: %s", sink.name, len(items), reason)
        else:
            for item in items:
                self.store.mark_failed(_seq(item), reason)
            log.error("alert sink %s: %d alert(s) failed for good: %s", sink.name, len(items), reason)

    # -- health --------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Per sink: kind, redacted targets, delivered/pending/failed counts, the last error and the
        newest permanent failures (all redacted)."""
        counts = self.store.outbox_counts()
        sinks: dict[str, Any] = {}
        for sink in self.alerts.sinks:
            state = self._states[sink.name]
            failed_rows = [row for row in self.store.alerts(sink=sink.name) if row.state == "failed"]
            failures = [
                {
                    "seq": row.seq,
                    "incident_id": row.incident_id,
                    "kind": row.kind,
                    "error": scrub(row.last_error or "", sink),
                }
                for row in failed_rows[-HEALTH_FAILURES:]
            ]
            sinks[sink.name] = {
                "kind": sink.kind,
                "targets": [redact(url) for url in sink.targets if url],
                "delivered": counts.get((sink.name, "delivered"), 0),
                "pending": counts.get((sink.name, "pending"), 0),
                "failed": counts.get((sink.name, "failed"), 0),
                "last_error": scrub(state.last_error, sink) if state.last_error else None,
                "last_error_at": state.last_error_at,
                "permanent_failures": failures,
            }
        return {"sinks": sinks, "ok": all(s["failed"] == 0 for s in sinks.values())}


def _identity(document: dict[str, Any]) -> tuple[Any, ...]:
    """What an Alertmanager alert of this incident is known by (its varying labels)."""
    return (document.get("level"), document.get("category"), document.get("fingerprint"))


def _seq(item: OutboxItem) -> int:
    if item.seq is None:
        raise ValueError("an outbox item read from the store has a seq")
    return item.seq


__all__ = ["DIGEST_LIMIT", "PASS_INTERVAL", "AlertWorker", "scrub", "send", "send_test"]
