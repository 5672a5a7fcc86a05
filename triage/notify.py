"""sd_notify(3) in a few lines: tell systemd the daemon is ready, alive, reloading or stopping.

Written out rather than taken from systemd-python so that the protocol is visible
and testable: one datagram of `KEY=VALUE` lines to the AF_UNIX socket named by
$NOTIFY_SOCKET (a path, or an abstract name starting with '@'). Outside systemd
there is no socket and every call is a cheap no-op that returns False.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("triage.notify")


def _address(value: str) -> str | bytes | None:
    """The socket address $NOTIFY_SOCKET names: a path, or an abstract name ('@' -> NUL)."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock: and other forms systemd may add: not ours to guess


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1", "STATUS=reading 3 logs") to systemd; False when not under it or on error."""
    env = os.environ if environ is None else environ
    target = env.get("NOTIFY_SOCKET", "")
    address = _address(target) if target else None
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sender:
            sender.sendto(state.encode("utf-8"), address)
        return True
    except OSError as error:
        log.debug("sd_notify to %s failed: %s", target, error)
        return False


def ready(status: str | None = None) -> bool:
    """Sources are open and the API listens: systemd may start what depends on triage."""
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def watchdog() -> bool:
    """Still alive: send only while every source makes progress, so a stuck daemon gets restarted."""
    return notify("WATCHDOG=1")


def reloading() -> bool:
    """SIGHUP received: config and patterns are being reloaded; send ready() when done."""
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def stopping() -> bool:
    """SIGTERM received: flushing and shutting down."""
    return notify("STOPPING=1")


def status(text: str) -> bool:
    """A one-line state for `systemctl status` (newlines would start a new key)."""
    return notify("STATUS=" + " ".join(text.split()))


def watchdog_interval(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds systemd waits for WATCHDOG=1 ($WATCHDOG_USEC), when it is meant for this process.

    None when there is no watchdog, its value is not a positive integer, or $WATCHDOG_PID names
    another process (the variables leaked to a child). Ping at half this interval.
    """
    env = os.environ if environ is None else environ
    raw = env.get("WATCHDOG_USEC", "")
    if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner is not None and owner.strip() != str(os.getpid() if pid is None else pid):
        return None
    return int(raw) / 1_000_000
