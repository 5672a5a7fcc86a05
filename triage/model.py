"""The records that flow through the pipeline: sources -> parsers -> correlator.

Plain dataclasses with no behaviour beyond small derived views, so every stage
can be tested with values built by hand. Times are epoch seconds (UTC floats);
kernel records also keep their monotonic stamp so the clock step can convert
them once, at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TimeSource = Literal["stamp", "last_stamp", "mtime", "read", "kernel", "none"]


@dataclass(slots=True)
class KernelRecord:
    """One kernel-log record as an input gave it, before any rule looked at it."""

    message: str
    #: The lines as read (a dmesg record continued on indented lines has several).
    raw: list[str]
    #: Position in its input, to keep order when no clock is known.
    index: int
    #: Seconds since boot, the kernel's own stamp, when the format carries it.
    monotonic: float | None = None
    #: Epoch seconds when the format carries a wall clock (journal, syslog, dmesg -T).
    wall: float | None = None
    #: Seconds from an origin that only this input knows (dmesg --reltime deltas, a
    #: dmesg -T stamp in a locale that cannot be read): orders and spaces records
    #: within the input, never compared with another clock.
    relative: float | None = None
    #: /dev/kmsg sequence number.
    seq: int | None = None
    #: syslog priority 0..7 when known.
    priority: int | None = None
    boot_id: str | None = None
    #: /dev/kmsg ` KEY=value` continuation lines and journal fields worth keeping.
    fields: dict[str, str] = field(default_factory=dict)
    #: Where the record came from (a file name, `kmsg`, `journal`).
    origin: str = ""


@dataclass(slots=True)
class KernelEvent:
    """A kernel fault: one matched record plus the continuation lines of the same fault."""

    rule_id: str
    category: str
    title: str
    records: list[KernelRecord]
    #: What to do, from the rule that named the event.
    hint: str = ""
    #: Other rule ids whose lines were folded into this event (status lines of a fault).
    detail_rules: list[str] = field(default_factory=list)
    device: str | None = None
    pid: int | None = None
    process: str | None = None
    address: str | None = None
    #: How many identical faults were folded into this one.
    count: int = 1
    #: The kernel's "N callbacks suppressed" that preceded this event.
    suppressed: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    #: Wall time once the clock step has converted it (epoch seconds).
    time: float | None = None

    @property
    def first(self) -> KernelRecord:
        return self.records[0]

    @property
    def monotonic(self) -> float | None:
        return self.records[0].monotonic

    @property
    def index(self) -> int:
        return self.records[0].index

    @property
    def lines(self) -> list[str]:
        return [line for record in self.records for line in record.raw]


@dataclass(slots=True)
class Frame:
    """One frame of a Python traceback."""

    file: str
    line: int | None
    function: str


@dataclass(slots=True)
class ProgramLine:
    """One line of a training log, with the prefix torchrun put on it taken apart."""

    text: str
    #: The line as read, prefix included.
    raw: str
    number: int
    origin: str = ""
    rank: int | None = None
    local_rank: int | None = None
    #: The host a launcher (pdsh, a multi-node tail) put in front of the line.
    host: str | None = None
    time: float | None = None
    time_source: TimeSource = "none"


@dataclass(slots=True)
class ProgramFailure:
    """A failure the program printed: a traceback, a C++ abort or a fatal line."""

    #: "traceback", "cpp_exception", "fatal_line", "child_failed" or "log_line".
    kind: str
    #: The lines as read, prefixes kept.
    lines: list[str]
    #: The lines with torchrun prefixes stripped, joined with newlines: what rules match.
    text: str
    origin: str = ""
    line_number: int = 0
    exception_type: str | None = None
    #: The final exception message, or the fatal line itself.
    message: str = ""
    frames: list[Frame] = field(default_factory=list)
    #: Earlier exceptions of a chain, "Type: message", oldest first.
    chain: list[str] = field(default_factory=list)
    #: Lines printed just before the failure, for rules that need context (dtype hints).
    context: list[str] = field(default_factory=list)
    time: float | None = None
    time_source: TimeSource = "none"
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    #: ROCr "GPU node-N".
    gpu_node: int | None = None
    device: str | None = None
    address: str | None = None
    #: Filled by classification.
    rule_id: str | None = None
    category: str = "unclassified"
    title: str = ""
    hint: str = ""
    #: A follow-on (an abort, a torchrun summary) only names an incident when nothing else does.
    follow_on: bool = False
    fields: dict[str, str] = field(default_factory=dict)
    #: How many identical failures (ranks, repeats) were folded into this one.
    count: int = 1
    ranks: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Incident:
    """What the person on call reads: one failure, its label and why."""

    id: str
    level: str
    category: str
    title: str
    hint: str
    first_seen: float | None
    last_seen: float | None
    count: int
    fingerprint: str
    evidence: list[str]
    kernel_events: list[KernelEvent] = field(default_factory=list)
    program_failures: list[ProgramFailure] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    #: "aligned" when kernel and program clocks were aligned, "one_window" when not.
    clock: str = "aligned"
    #: Every input event and failure this incident holds, repeats included (not rendered):
    #: how a live caller knows which of its evidence the incident owns.
    members: list[KernelEvent | ProgramFailure] = field(default_factory=list)
