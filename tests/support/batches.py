"""A sink that keeps the batches a source hands over, and waits for what a test expects."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from triage.model import KernelEvent, KernelRecord
from triage.sources import Batch


class Collector:
    """Thread-safe list of batches; `wait_for` polls a condition on them."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self._lock = threading.Lock()
        #: Cleared to make the source's thread wait inside the sink (a slow store).
        self.open = threading.Event()
        self.open.set()

    def __call__(self, batch: Batch) -> None:
        self.open.wait()
        with self._lock:
            self.batches.append(batch)

    def snapshot(self) -> list[Batch]:
        with self._lock:
            return list(self.batches)

    def events(self, marker: str = "") -> list[KernelEvent]:
        return [
            event
            for batch in self.snapshot()
            for event in batch.events
            if any(marker in record.message for record in event.records)
        ]

    def records(self, marker: str) -> list[KernelRecord]:
        """Records holding `marker`, over all events, in the order handed over."""
        return [record for event in self.events(marker) for record in event.records if marker in record.message]

    def position(self, key: str) -> Any:
        """The last position handed over for `key`."""
        for batch in reversed(self.snapshot()):
            if key in batch.positions:
                return batch.positions[key]
        return None

    def wait_for(self, condition: Callable[[], bool], timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.02)
        return condition()
