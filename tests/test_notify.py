"""sd_notify: the datagrams arrive, as systemd would read them, on a socket the test owns."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from triage import notify


def receive(sock: socket.socket) -> str:
    sock.settimeout(2)
    data, _ = sock.recvfrom(4096)
    return data.decode()


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket at a path, named by $NOTIFY_SOCKET, as systemd sets it up."""
    address = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        monkeypatch.setenv("NOTIFY_SOCKET", str(address))
        yield sock


def test_states_arrive_on_a_path_socket(path_socket: socket.socket) -> None:
    assert notify.notify("READY=1") is True
    assert receive(path_socket) == "READY=1"
    assert notify.watchdog() is True
    assert receive(path_socket) == "WATCHDOG=1"
    assert notify.status("reading\n3 logs") is True
    assert receive(path_socket) == "STATUS=reading 3 logs"
    assert notify.ready("listening on 127.0.0.1:8750") is True
    assert receive(path_socket) == "READY=1\nSTATUS=listening on 127.0.0.1:8750"
    assert notify.stopping() is True
    assert receive(path_socket) == "STOPPING=1"
    assert notify.reloading() is True
    first, second = receive(path_socket).split("\n")
    assert first == "RELOADING=1" and second.startswith("MONOTONIC_USEC=") and int(second.split("=")[1]) > 0


def test_states_arrive_on_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"triage-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.notify("READY=1") is True
        assert receive(sock) == "READY=1"
        assert notify.watchdog() is True
        assert receive(sock) == "WATCHDOG=1"


def test_sender_is_this_process(path_socket: socket.socket) -> None:
    """systemd attributes a message to the sender's pid (NotifyAccess=main): it must be ours."""
    path_socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    assert notify.notify("WATCHDOG=1")
    path_socket.settimeout(2)
    data, ancillary, _, _ = path_socket.recvmsg(4096, socket.CMSG_SPACE(12))
    assert data == b"WATCHDOG=1"
    credentials = [item for item in ancillary if item[:2] == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)]
    assert int.from_bytes(credentials[0][2][:4], "little") == os.getpid()


def test_no_socket_is_a_quiet_no(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False
    assert notify.watchdog() is False
    for value in ["", "@", "relative/path", "vsock:2:1234", str(tmp_path / "absent.sock")]:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
        assert notify.notify("READY=1") is False, value


def test_explicit_environment() -> None:
    assert notify.notify("READY=1", environ={}) is False


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "1500000"}, 1.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({"WATCHDOG_USEC": "\u00b2"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    assert notify.watchdog_interval(environ, pid=4242) == expected


def test_watchdog_interval_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert notify.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert notify.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert notify.watchdog_interval() is None
