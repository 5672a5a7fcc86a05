"""Alerts: what an incident says in each chat platform's shape, and how to read each platform's answer.

The pure half of the sinks of issue 4: `formats` builds the requests (no I/O) and `responses`
reads what a receiver answered; the delivery worker (outbox, rate limits, HTTP) uses both.
"""

from __future__ import annotations

from .formats import BUILDERS, Message, Request, build, digest_for, message_for, redact
from .responses import Delivered, Outcome, Permanent, Retry, backoff, interpret

__all__ = [
    "BUILDERS",
    "Delivered",
    "Message",
    "Outcome",
    "Permanent",
    "Request",
    "Retry",
    "backoff",
    "build",
    "digest_for",
    "interpret",
    "message_for",
    "redact",
]
