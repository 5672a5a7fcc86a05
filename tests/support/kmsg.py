"""Writing real records to /dev/kmsg (as root), and reading what the ring holds.

The kernel rate-limits /dev/kmsg writers to a burst of 10 records per 5 s, but
the limit belongs to the open file (`printk_devkmsg=ratelimit`): each record is
written through a file of its own, so a test never waits for the limit.
"""

from __future__ import annotations

import ctypes
import os
import uuid

KMSG = "/dev/kmsg"
#: klogctl(2) SYSLOG_ACTION_SIZE_BUFFER: the size of the kernel's log ring.
_SIZE_BUFFER = 10


def kmsg_unusable() -> str | None:
    """Why the real /dev/kmsg cannot be used by a test here, or None when it can."""
    if os.geteuid() != 0:
        return "writing /dev/kmsg needs root"
    try:
        with open("/proc/sys/kernel/printk_devkmsg", encoding="ascii") as handle:
            if handle.read().strip() == "off":
                return "printk_devkmsg=off: the kernel drops records written to /dev/kmsg"
    except OSError:
        pass
    for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY):
        try:
            os.close(os.open(KMSG, flags))
        except OSError as error:
            return f"/dev/kmsg cannot be opened here: {error}"
    return None


def new_marker() -> str:
    """A word no other record in the ring holds."""
    return f"triage-test-{uuid.uuid4().hex[:12]}"


def write_kmsg(*records: str | bytes) -> None:
    """Write each record (e.g. `<3>amdgpu ...`) as one kmsg record; the newline ends it."""
    for record in records:
        data = record.encode() if isinstance(record, str) else record
        fd = os.open(KMSG, os.O_WRONLY)
        try:
            os.write(fd, data.rstrip(b"\n") + b"\n")
        finally:
            os.close(fd)


def read_ring() -> list[bytes]:
    """Every record the ring holds now, oldest first."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    records: list[bytes] = []
    try:
        while True:
            try:
                records.append(os.read(fd, 16384))
            except BlockingIOError:
                return records
            except BrokenPipeError:
                continue
    finally:
        os.close(fd)


def seq_of(record: bytes) -> int:
    return int(record.split(b",", 2)[1])


def ring_bytes() -> int:
    """The size of the kernel's log ring (klogctl SYSLOG_ACTION_SIZE_BUFFER)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = libc.klogctl(_SIZE_BUFFER, None, 0)
    if size <= 0:
        raise OSError(ctypes.get_errno(), "klogctl(SYSLOG_ACTION_SIZE_BUFFER) failed")
    return int(size)
