"""Clocks: kernel monotonic stamps to wall time, and whether two logs share a clock.

Converted once, at the edge: every kernel event gets `time` (epoch seconds) when
its record carries a wall clock or when the boot time is known; the correlator
only ever compares `time`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .model import KernelEvent, KernelRecord, ProgramFailure


def record_time(record: KernelRecord, boot_time: float | None) -> float | None:
    if record.wall is not None:
        return record.wall
    if record.monotonic is not None and boot_time is not None:
        return boot_time + record.monotonic
    return None


def apply_kernel_clock(events: Iterable[KernelEvent], boot_time: float | None) -> None:
    """Set each event's wall time from its first record."""
    for event in events:
        event.time = record_time(event.first, boot_time)


def order_key(event: KernelEvent) -> tuple[int, float]:
    """A key that orders events of one input even without a wall clock."""
    if event.time is not None:
        return (0, event.time)
    record = event.first
    if record.monotonic is not None:
        return (1, record.monotonic)
    if record.relative is not None:
        return (2, record.relative)
    return (3, float(record.index))


@dataclass(frozen=True, slots=True)
class Alignment:
    """Whether kernel and program times can be compared, and if not, why."""

    aligned: bool
    reason: str = ""


def alignment(events: Sequence[KernelEvent], failures: Sequence[ProgramFailure]) -> Alignment:
    """Kernel and program evidence are compared by time only when both have a wall clock."""
    if not events or not failures:
        return Alignment(True)
    if not any(event.time is not None for event in events):
        return Alignment(
            False,
            "the kernel log has no wall clock (monotonic stamps without a boot time, or a dmesg -T locale "
            "that cannot be read; pass --boot-time)",
        )
    if not any(failure.time is not None for failure in failures):
        return Alignment(False, "the training log has no time stamps")
    return Alignment(True)
