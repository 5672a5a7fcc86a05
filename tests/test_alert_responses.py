"""Reading receivers' answers: status codes, Retry-After (seconds and HTTP date), Discord's retry_after, in-body codes."""

from __future__ import annotations

import email.utils
import json
import random

import pytest

from triage.alerts.responses import Delivered, Permanent, Retry, backoff, interpret, retry_after

NOW = 1_800_000_000.0


def body(value: object) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize("kind", ["slack", "mattermost", "discord", "teams", "generic", "alertmanager"])
@pytest.mark.parametrize("status", [200, 202, 204])
def test_2xx_is_delivered(kind: str, status: int) -> None:
    assert interpret(kind, status, {}, b"ok", NOW) == Delivered()


def test_retry_after_seconds() -> None:
    outcome = interpret("slack", 429, {"Retry-After": "30"}, b"rate_limited", NOW)
    assert isinstance(outcome, Retry) and outcome.after_seconds == 30.0
    assert interpret("slack", 429, {"retry-after": " 2.5 "}, b"", NOW) == Retry(2.5, "HTTP 429 rate limited: ''")


def test_retry_after_http_date() -> None:
    date = email.utils.formatdate(NOW + 120, usegmt=True)
    outcome = interpret("teams", 429, {"Retry-After": date}, b"", NOW)
    assert isinstance(outcome, Retry) and outcome.after_seconds == pytest.approx(120.0)
    past = email.utils.formatdate(NOW - 50, usegmt=True)
    assert retry_after(past, NOW) == 0.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412480.0 - 7.0) == pytest.approx(7.0)


def test_retry_after_unreadable_or_absent_leaves_it_to_backoff() -> None:
    assert interpret("slack", 429, {"Retry-After": "soon"}, b"", NOW) == Retry(None, "HTTP 429 rate limited: ''")
    assert interpret("slack", 429, {}, b"", NOW).after_seconds is None  # type: ignore[union-attr]
    assert retry_after("nan", NOW) is None and retry_after("-5", NOW) == 0.0
    assert retry_after("99999999", NOW) == 3600.0


def test_discord_retry_after_in_body() -> None:
    answer = body({"message": "You are being rate limited.", "retry_after": 0.617, "global": False})
    outcome = interpret("discord", 429, {}, answer, NOW)
    assert isinstance(outcome, Retry) and outcome.after_seconds == pytest.approx(0.617)
    # Both present: the longer wait wins.
    both = interpret("discord", 429, {"Retry-After": "1"}, body({"retry_after": 3.25}), NOW)
    assert isinstance(both, Retry) and both.after_seconds == pytest.approx(3.25)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408])
def test_server_errors_and_timeouts_retry_with_backoff(status: int) -> None:
    outcome = interpret("slack", status, {}, b"upstream down", NOW)
    assert isinstance(outcome, Retry) and outcome.after_seconds is None and str(status) in outcome.reason
    assert interpret("slack", 503, {"Retry-After": "7"}, b"", NOW) == Retry(7.0, "HTTP 503: ''")


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (400, b"invalid_payload"),
        (401, b""),
        (403, b"action_prohibited"),
        (404, b"channel_not_found"),
        (410, b"channel_is_archived"),
    ],
)
def test_client_errors_are_permanent(status: int, answer: bytes) -> None:
    outcome = interpret("slack", status, {}, answer, NOW)
    assert isinstance(outcome, Permanent) and str(status) in outcome.reason and answer.decode() in outcome.reason


def test_reason_quotes_at_most_a_little_of_the_body() -> None:
    outcome = interpret("generic", 400, {}, b"x" * 1_000_000, NOW)
    assert isinstance(outcome, Permanent) and len(outcome.reason) < 300


def test_feishu_codes() -> None:
    assert interpret("feishu", 200, {}, body({"code": 0, "data": {}, "msg": "success"}), NOW) == Delivered()
    assert interpret("feishu", 200, {}, body({"StatusCode": 0, "StatusMessage": "success"}), NOW) == Delivered()
    limited = interpret("feishu", 200, {}, body({"code": 11232, "msg": "frequency limited"}), NOW)
    assert isinstance(limited, Retry) and "11232" in limited.reason
    for code in (19021, 19022, 19024, 9499, 12345):
        outcome = interpret("feishu", 200, {}, body({"code": code, "msg": "no"}), NOW)
        assert isinstance(outcome, Permanent) and str(code) in outcome.reason
    sign = interpret("feishu", 200, {}, body({"code": 19021, "msg": "sign match fail"}), NOW)
    assert isinstance(sign, Permanent) and "signature" in sign.reason
    assert isinstance(interpret("feishu", 200, {}, b"<html>", NOW), Permanent)
    # A non-2xx that carries a rate-limit code is retried too.
    assert isinstance(interpret("feishu", 400, {}, body({"code": 11232, "msg": "limited"}), NOW), Retry)


def test_dingtalk_codes() -> None:
    assert interpret("dingtalk", 200, {}, body({"errcode": 0, "errmsg": "ok"}), NOW) == Delivered()
    fast = interpret("dingtalk", 200, {}, body({"errcode": 130101, "errmsg": "send too fast"}), NOW)
    assert isinstance(fast, Retry) and fast.after_seconds == 60.0
    for code in (310000, 300001, 400102):
        assert isinstance(interpret("dingtalk", 200, {}, body({"errcode": code, "errmsg": "x"}), NOW), Permanent)
    keyword = interpret("dingtalk", 200, {}, body({"errcode": 310000, "errmsg": "keywords not in content"}), NOW)
    assert isinstance(keyword, Permanent) and "keywords not in content" in keyword.reason


def test_wecom_codes() -> None:
    assert interpret("wecom", 200, {}, body({"errcode": 0, "errmsg": "ok"}), NOW) == Delivered()
    limited = interpret("wecom", 200, {}, body({"errcode": 45009, "errmsg": "api freq out of limit"}), NOW)
    assert isinstance(limited, Retry) and limited.after_seconds == 60.0
    invalid = interpret("wecom", 200, {}, body({"errcode": 93000, "errmsg": "invalid webhook url"}), NOW)
    assert isinstance(invalid, Permanent) and "93000" in invalid.reason
    assert isinstance(interpret("wecom", 200, {}, body({"errmsg": "ok"}), NOW), Permanent)
    assert isinstance(interpret("wecom", 200, {}, body({"errcode": "abc"}), NOW), Permanent)


def test_backoff_full_jitter() -> None:
    rng = random.Random(4)
    for attempt in range(12):
        ceiling = min(300.0, 2.0**attempt)
        samples = [backoff(attempt, rng=rng) for _ in range(200)]
        assert all(0.0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8  # spread over the whole range, not a fixed delay
    assert all(backoff(10_000, rng=rng) <= 300.0 for _ in range(50))
    assert all(backoff(3, base=0.5, cap=2.0, rng=rng) <= 2.0 for _ in range(50))
    assert backoff(5, rng=random.Random(1)) == backoff(5, rng=random.Random(1))
