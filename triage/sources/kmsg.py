"""/dev/kmsg: the kernel's ring buffer, read live, one record per read.

Each read() returns exactly one record `prio,seq,usec,flags;message` (plus
` KEY=value` lines); the existing kmsg parser reads it. The position is (boot
id, sequence number): after a restart in the same boot the ring is read from
its oldest record and what was already handled is skipped; the records that
rotated out of the ring meanwhile are counted as lost. A new boot starts from
the beginning of its ring. A reader that falls behind gets EPIPE (the kernel
overwrote records it had not read); that is counted from the sequence gap and
reading goes on.

Records written from user space (`echo '<3>amdgpu ...' > /dev/kmsg`) carry a
user facility: they are kept like the kernel's own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Any

from ..kernel.formats import KernelParseStats, parse_kernel_lines
from ..model import KernelRecord
from . import Sink, SourceHealth, StoppableThread
from .kernel import KernelDedupe, KernelFeed, current_boot_id, normalise_boot_id, usec_of

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger(__name__)

#: Larger than any record (the kernel caps one at about 8 KiB with its dictionary).
READ_SIZE = 16 * 1024
#: Longest wait for input, so health progress and stop stay responsive.
MAX_WAIT = 1.0


def kmsg_boot_time() -> float:
    """Epoch seconds of boot for kmsg stamps: printk's clock stops in suspend, like CLOCK_MONOTONIC."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def seq_gap(last_seq: int | None, seq: int) -> int:
    """Records missing between the last sequence number handled and this one."""
    return 0 if last_seq is None else max(0, seq - last_seq - 1)


class KmsgSource:
    """Reads /dev/kmsg in a thread and hands the sink batches of KernelEvents."""

    def __init__(
        self,
        engine: Engine,
        *,
        position: dict[str, Any] | None = None,
        path: str = "/dev/kmsg",
        boot_id: str | None = None,
        idle_flush: float = 0.3,
        dedupe: KernelDedupe | None = None,
        name: str = "kmsg",
    ) -> None:
        self.engine = engine
        self.name = name
        self.path = path
        self.boot_id = normalise_boot_id(boot_id) if boot_id else current_boot_id()
        self.position = position
        self.idle_flush = idle_flush
        self.dedupe = dedupe
        self.stats = KernelParseStats()
        self._fd: int | None = None
        self._wake: tuple[int, int] | None = None
        self._thread: StoppableThread | None = None
        self._feed: KernelFeed | None = None
        self._last_seq = self._resume_seq(position)
        self._index = 0

    def _resume_seq(self, position: dict[str, Any] | None) -> int | None:
        """The last sequence number handled in this boot, or None to read the whole ring."""
        if not isinstance(position, dict):
            return None
        boot, seq = position.get("boot_id"), position.get("seq")
        if not isinstance(boot, str) or not isinstance(seq, int):
            return None
        return seq if normalise_boot_id(boot) == self.boot_id else None

    # -- Source -------------------------------------------------------------------

    def start(self, sink: Sink) -> None:
        """Open /dev/kmsg (OSError when it cannot be: no CAP_SYSLOG, no such device) and start reading."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # The oldest record still in the ring (a fresh open starts there too; a stand-in
        # for the device may not seek).
        with contextlib.suppress(OSError):
            os.lseek(fd, 0, os.SEEK_SET)
        self._fd = fd
        self._wake = os.pipe()
        self._feed = KernelFeed(
            self.engine,
            sink,
            name=self.name,
            key="kmsg",
            idle_flush=self.idle_flush,
            dedupe=self.dedupe,
            boot_time=kmsg_boot_time,
        )
        self._feed.health.detail.update(boot_id=self.boot_id, overruns=0)
        self._thread = StoppableThread(f"triage-{self.name}", self._run)
        self._thread.start()

    def stop(self) -> None:
        """Wake the thread, let it hand over what it holds, and close the device."""
        if self._thread is None:
            return
        self._thread.stopping.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        self._thread.stop()
        if not self._thread.is_alive():
            self._close()
        self._thread = None

    def health(self) -> SourceHealth:
        if self._feed is None:
            return SourceHealth(name=self.name, alive=False, error="not started")
        health = self._feed.snapshot()
        health.alive = health.alive and self._thread is not None and self._thread.is_alive()
        health.detail["parse"] = {"bad_encoding": self.stats.bad_encoding, "kmsg_fields": self.stats.kmsg_fields}
        return health

    # -- the thread -----------------------------------------------------------------

    def _run(self, stopping: threading.Event) -> None:
        feed = self._feed
        assert feed is not None
        try:
            self._read_loop(stopping, feed)
            feed.flush()
        except Exception as error:  # the daemon reports it in /healthz
            feed.fail(error)

    def _read_loop(self, stopping: threading.Event, feed: KernelFeed) -> None:
        assert self._fd is not None and self._wake is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while not stopping.is_set():
            data = self._read_one(feed)
            now = time.time()
            feed.progress(now)
            if data is not None:
                self._handle(data, now, feed)
                feed.flush_if_due(now)
                continue
            feed.flush_if_due(now)
            due = feed.due_in(now)
            wait = MAX_WAIT if due is None else min(due, MAX_WAIT)
            poller.poll(max(1, int(wait * 1000)))

    def _read_one(self, feed: KernelFeed) -> bytes | None:
        """One record, or None when there is none now."""
        assert self._fd is not None
        try:
            return os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise
            # The ring overwrote records before we read them; the next read returns
            # the oldest one left, and the sequence gap says how many were lost.
            feed.count("overruns")
            return b""

    def _handle(self, data: bytes, now: float, feed: KernelFeed) -> None:
        if not data:
            return
        record = self._parse(data)
        if record is None or record.seq is None:
            feed.count("skipped")
            return
        if self._last_seq is not None and record.seq <= self._last_seq:
            return  # handled before the restart
        lost = seq_gap(self._last_seq, record.seq)
        if lost:
            feed.count("lost", lost)
        self._last_seq = record.seq
        boot_time = kmsg_boot_time()
        wall = None if record.monotonic is None else boot_time + record.monotonic
        position = {"boot_id": self.boot_id, "seq": record.seq, "usec": usec_of(record)}
        feed.take(record, position, wall, now)

    def _parse(self, data: bytes) -> KernelRecord | None:
        """The existing kmsg parser on one record (kmsg escapes every non-ASCII byte: plain text)."""
        text = data.decode("utf-8", "replace")
        records = list(parse_kernel_lines([text], self.name, stats=self.stats))
        if len(records) != 1:
            return None
        record = records[0]
        record.boot_id = self.boot_id
        record.index = self._index
        self._index += 1
        return record

    def _close(self) -> None:
        for fd in (self._fd, *(self._wake or ())):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd, self._wake = None, None
