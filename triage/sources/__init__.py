"""Sources: every byte that comes from outside, and every position that must survive a restart.

A source runs in its own thread, turns what it reads into evidence with the
engine's pure parsers (kernel records -> KernelEvents, log bytes -> ProgramFailures)
and hands the daemon `Batch`es. Each batch carries the position that is safe once
the batch is stored: the daemon writes the evidence and the position in one
transaction, so a restart neither loses nor repeats a record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..model import KernelEvent, ProgramFailure


@dataclass(slots=True)
class Batch:
    """Evidence from one source, and where that source stands once it is stored."""

    source: str
    events: list[KernelEvent] = field(default_factory=list)
    failures: list[ProgramFailure] = field(default_factory=list)
    #: Position key (e.g. "kmsg", "journal", "file:/var/log/train/rank0.log") -> JSON-able
    #: position, or None to forget it (a deleted file).
    positions: dict[str, Any] = field(default_factory=dict)


Sink = Callable[[Batch], None]


@dataclass(slots=True)
class SourceHealth:
    """What /healthz and /metrics say about a source."""

    name: str
    alive: bool = True
    #: Wall time (epoch s) of the newest record read, as the record dates it.
    last_record: float | None = None
    #: time.time() when the source last read or checked its input (progress, even when idle).
    last_progress: float | None = None
    #: Seconds between the newest record's own time and when it was read.
    lag: float | None = None
    records: int = 0
    skipped: int = 0
    lost: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    name: str

    def start(self, sink: Sink) -> None:
        """Open the input (raise OSError when it cannot be) and start the reading thread."""

    def stop(self) -> None:
        """Ask the thread to finish and wait for it (a few seconds at most)."""

    def health(self) -> SourceHealth: ...


class Clock(Protocol):
    def __call__(self) -> float: ...


def now() -> float:
    return time.time()


class StoppableThread(threading.Thread):
    """A daemon thread with a stop event, for sources to subclass or compose."""

    def __init__(self, name: str, target: Callable[[threading.Event], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self._target_fn = target

    def run(self) -> None:
        self._target_fn(self.stopping)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
