"""The kernel side of triage: kernel logs in any form -> records -> fault events.

`formats` reads every form a user has at hand (/dev/kmsg, dmesg variants,
journalctl modes, kern.log, bare lines) into `KernelRecord`s; `events` groups the
records of one fault and folds repeats into `KernelEvent`s. Both are pure.
"""

from .events import KernelEventBuilder, build_events
from .formats import (
    KernelParseStats,
    boot_time_from,
    parse_journal_export,
    parse_kernel_lines,
    read_kernel_stream,
)

__all__ = [
    "KernelEventBuilder",
    "KernelParseStats",
    "boot_time_from",
    "build_events",
    "parse_journal_export",
    "parse_kernel_lines",
    "read_kernel_stream",
]
