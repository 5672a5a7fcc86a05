"""Real journals for tests: a private systemd-journald, and journal files written by systemd-journal-remote.

A private journald: there is no systemd as PID 1 here, and the system journald
(if any) must not be touched. journald runs in a mount namespace of its own
(`unshare -m`) with a tmpfs on /run, so its sockets, its kernel-seqnum file and
its journal live apart from the host's; the test's directory is bind-mounted on
its /run/log/journal, so the test reads what it writes. Run as the system
instance, journald reads /dev/kmsg itself: records written there arrive with
`_TRANSPORT=kernel`, as on a real node. (A `--namespace` journald does not read
/dev/kmsg.)

Journal files: `systemd-journal-remote -o FILE -` turns export-format input into
a real journal file, keeping `_BOOT_ID`, `__REALTIME_TIMESTAMP` and
`__MONOTONIC_TIMESTAMP`: the way to have the journal of a boot that is over.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

JOURNALD = "/lib/systemd/systemd-journald"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"

Fields = Mapping[str, str | bytes]


def export_entry(fields: Fields) -> bytes:
    """One entry of the journal export format; values with newlines or control bytes in the binary form."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode() if isinstance(value, str) else value
        if b"\n" in data or any(byte < 0x20 and byte != 0x09 for byte in data):
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out + b"\n")


def kernel_entry(
    boot_id: str,
    usec: int,
    message: str,
    *,
    wall_usec: int,
    delay_usec: int = 0,
    transport: str = "kernel",
    priority: int = 3,
) -> dict[str, str]:
    """A kernel record as journald stores it: the kernel's stamp, and journald's receive stamps `delay_usec` later."""
    return {
        "__REALTIME_TIMESTAMP": str(wall_usec + delay_usec),
        "__MONOTONIC_TIMESTAMP": str(usec + delay_usec),
        "_BOOT_ID": boot_id,
        "_TRANSPORT": transport,
        "_SOURCE_MONOTONIC_TIMESTAMP": str(usec),
        "PRIORITY": str(priority),
        "SYSLOG_FACILITY": "0" if transport == "kernel" else "1",
        "SYSLOG_IDENTIFIER": "kernel" if transport == "kernel" else "python",
        "_HOSTNAME": "node",
        "MESSAGE": message,
    }


def journal_remote_unusable() -> str | None:
    if not os.access(JOURNAL_REMOTE, os.X_OK):
        return f"{JOURNAL_REMOTE} is missing (Debian package systemd-journal-remote)"
    return None


def write_journal(path: Path, entries: Iterable[Fields]) -> None:
    """Append entries to the journal file `path` (created when missing), as journald would store them."""
    data = b"".join(export_entry(entry) for entry in entries)
    done = subprocess.run([JOURNAL_REMOTE, "-o", str(path), "-"], input=data, capture_output=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"systemd-journal-remote failed: {done.stderr.decode(errors='replace')}")


class JournalWriter:
    """A systemd-journal-remote that stays up and appends each entry as it is given (a live journal file)."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [JOURNAL_REMOTE, "-o", str(path), "-"], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def write(self, *entries: Fields) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"".join(export_entry(entry) for entry in entries))
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class PrivateJournald:
    """A running private journald: `directory` is what Reader(path=...) opens."""

    process: subprocess.Popen[bytes]
    directory: Path
    log: Path

    def journal_files(self) -> list[Path]:
        return sorted(self.directory.glob("*/*.journal"))


def journald_unusable() -> str | None:
    if os.geteuid() != 0:
        return "a private systemd-journald needs root (mount namespace, /dev/kmsg)"
    for tool in (JOURNALD, shutil.which("unshare")):
        if not tool or not os.access(tool, os.X_OK):
            return f"{tool or 'unshare'} is missing"
    if not os.path.isfile("/etc/machine-id"):
        return "no /etc/machine-id: journald names its journal directory after it"
    done = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if done.returncode != 0:
        return f"no mount namespace here (unshare -m: {done.stderr.decode(errors='replace').strip()})"
    return None


_START = """
set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/log/journal /run/systemd/journal
mount --bind "$1/journal" /run/log/journal
if [ -d /var/log/journal ]; then mount --bind "$1/var" /var/log/journal; fi
# An empty machine-id (container images ship one) gets a made-up one, for journald only.
if [ ! -s /etc/machine-id ]; then cat /proc/sys/kernel/random/uuid | tr -d - > "$1/machine-id"; mount --bind "$1/machine-id" /etc/machine-id; fi
exec {journald}
"""


@contextmanager
def private_journald(timeout: float = 8.0) -> Iterator[PrivateJournald]:
    """Start journald in its own mount namespace; stop it (by pid) and remove its files at the end."""
    root = Path(tempfile.mkdtemp(prefix="triage-journald-"))
    (root / "journal").mkdir()
    (root / "var").mkdir()
    log = root / "journald.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                _START.format(journald=JOURNALD),
                "sh",
                str(root),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    journald = PrivateJournald(process, root / "journal", log)
    try:
        deadline = time.monotonic() + timeout
        while not journald.journal_files():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private journald did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield journald
    finally:
        _stop(process)
        shutil.rmtree(root, ignore_errors=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
