"""What a receiver's answer means for the outbox: delivered, retry (when), or give up. Pure functions.

Relied on:
- HTTP 429 with `Retry-After` as delta-seconds or an HTTP-date (RFC 9110 §10.2.3); Discord also
  answers 429 with a JSON body whose `retry_after` is seconds as a float
  (https://discord.com/developers/docs/topics/rate-limits#exceeding-a-rate-limit).
- Slack answers 400 invalid_payload, 403 action_prohibited, 404 channel_not_found, 410 channel_is_archived.
- Feishu/Lark, DingTalk and WeCom answer HTTP 200 with a code in the body:
  Feishu `{"code": 0}` (older bots `{"StatusCode": 0}`); 11232 frequency limited; 19021 sign match fail or
  timestamp not within one hour, 19022 IP not allowed, 19024 keyword not found, 9499 bad request.
  DingTalk `{"errcode": 0}`; 130101 send too fast (20 a minute; the robot is throttled for a while);
  310000 sign / keyword / IP check failed; 300001 invalid token; 400102 robot stopped.
  WeCom `{"errcode": 0}`; 45009 API frequency out of limit (20 a minute); 93000 invalid webhook URL;
  93004 robot disabled; 40008 invalid message type; 40058 invalid parameter.
"""

from __future__ import annotations

import email.utils
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Delivered:
    """The receiver took the message."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again: after `after_seconds` when the receiver said so, else when the worker's backoff says."""

    after_seconds: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class Permanent:
    """Never retry this message: the URL, signature or payload is wrong; shown in /healthz and /metrics."""

    reason: str


Outcome = Delivered | Retry | Permanent

#: In-body codes that mean "too fast, try later", with the wait when the platform implies one.
RATE_LIMIT_CODES: dict[str, dict[int, float | None]] = {
    "feishu": {11232: None},
    "dingtalk": {130101: 60.0},
    "wecom": {45009: 60.0},
}
#: Known permanent in-body codes, for a clearer reason (any other non-zero code is permanent too).
PERMANENT_CODES: dict[str, dict[int, str]] = {
    "feishu": {
        19021: "signature mismatch or timestamp more than an hour off",
        19022: "IP not allowed",
        19024: "keyword not found",
        9499: "bad request",
    },
    "dingtalk": {310000: "signature, keyword or IP check failed", 300001: "invalid token", 400102: "robot stopped"},
    "wecom": {93000: "invalid webhook URL", 93004: "robot disabled", 40008: "invalid message type"},
}
#: Answers shorter than this are quoted in reasons.
QUOTE_CHARS = 200
MAX_RETRY_AFTER = 3600.0


def _quote(body: bytes) -> str:
    text = body[:QUOTE_CHARS].decode("utf-8", errors="replace").strip()
    return text.replace("\n", " ")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` value: delta-seconds or an HTTP-date; None when unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER)


def _body_code(kind: str, body: bytes) -> Outcome:
    """A 2xx answer from a platform that puts its verdict in the body."""
    document = _json(body)
    if not isinstance(document, dict):
        return Permanent(f"{kind}: HTTP 2xx with an unreadable answer: {_quote(body)!r}")
    key = "code" if kind == "feishu" else "errcode"
    code = document.get(key)
    if code is None and kind == "feishu":
        code = document.get("StatusCode")
    if code is None:
        return Permanent(f"{kind}: answer without {key}: {_quote(body)!r}")
    try:
        number = int(code)
    except (TypeError, ValueError):
        return Permanent(f"{kind}: {key} {code!r} is not a number")
    if number == 0:
        return Delivered()
    text = str(document.get("msg") or document.get("errmsg") or document.get("StatusMessage") or "")[:QUOTE_CHARS]
    if number in RATE_LIMIT_CODES.get(kind, {}):
        return Retry(RATE_LIMIT_CODES[kind][number], f"{kind}: rate limited ({key} {number}: {text})")
    known = PERMANENT_CODES.get(kind, {}).get(number)
    detail = f"{known}; " if known else ""
    return Permanent(f"{kind}: {detail}{key} {number}: {text}")


def interpret(kind: str, status: int, headers: Mapping[str, str], body: bytes, now: float) -> Outcome:
    """What answer (`status`, `headers`, `body`) at time `now` from a sink of kind `kind` means."""
    lower = {k.lower(): v for k, v in headers.items()}
    if 200 <= status < 300:
        if kind in ("feishu", "dingtalk", "wecom"):
            return _body_code(kind, body)
        return Delivered()
    if status == 429:
        waits = [retry_after(lower.get("retry-after"), now)]
        document = _json(body)
        if isinstance(document, dict) and isinstance(document.get("retry_after"), int | float):
            waits.append(min(max(0.0, float(document["retry_after"])), MAX_RETRY_AFTER))
        known = [w for w in waits if w is not None]
        return Retry(max(known) if known else None, f"HTTP 429 rate limited: {_quote(body)!r}")
    if status == 408 or status >= 500:
        return Retry(retry_after(lower.get("retry-after"), now), f"HTTP {status}: {_quote(body)!r}")
    if kind in ("feishu", "dingtalk", "wecom"):
        verdict = _body_code(kind, body)
        if isinstance(verdict, Retry):
            return verdict
    return Permanent(f"HTTP {status}: {_quote(body)!r}")


def backoff(attempt: int, *, base: float = 1.0, cap: float = 300.0, rng: random.Random) -> float:
    """Seconds before retry number `attempt` (0 first): full jitter, uniform in [0, min(cap, base * 2**attempt)]."""
    ceiling = cap if attempt >= 64 else min(cap, base * (2.0 ** max(0, attempt)))
    return rng.uniform(0.0, ceiling)
