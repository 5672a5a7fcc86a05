"""The correlator: kernel events and program failures in, labelled incidents out.

Pure functions. The rules it follows are TAXONOMY.md's:
- failures of one crash (eight ranks, a traceback and the abort after it, the
  torchrun summary) are one incident, and so is a storm of one kernel fault;
- a symptom (illegal memory access, collective timeout, unclassified HIP error) is
  explained by a driver-level kernel fault in its window, the window depending on
  the symptom (a collective waits its whole timeout);
- a self-explaining failure (OOM, missing operator, dtype, arch, import) keeps its
  label unless the kernel fault is tied to it by pid;
- a page fault of another process (a compositor, a game) does not relabel a
  training failure; a reset of the GPU does;
- every incident says in words why it has its label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import regex

from . import taxonomy
from .clock import order_key
from .fingerprint import digest, failure_fingerprint, incident_fingerprint
from .model import Incident, KernelEvent, ProgramFailure

#: Failures closer than this (seconds) belong to one crash.
CRASH_GAP = 60.0
#: An aftermath (an abort, torchrun's summary) this long after a crash is still that crash.
FOLLOW_ON_GAP = 600.0
#: A collective timeout fires its timeout after the failure that stalled it; this much slack on top.
COLLECTIVE_SLACK = 30.0
#: A collective's timeout when the message does not say (PyTorch's NCCL default).
DEFAULT_COLLECTIVE_TIMEOUT = 1800.0
#: The same failure again within this long is the same incident, grown.
REPEAT_GAP = 3600.0
#: Kernel faults of one GPU closer than this form one kernel-only incident.
KERNEL_GAP = 300.0
#: Kernel lines may be printed a little after the program reported the failure.
KERNEL_AFTER = 30.0

#: How long before a symptom a driver fault still explains it.
SYMPTOM_WINDOW = {
    "illegal_memory_access": 30.0,
    "device_assert": 60.0,
    "unclassified": 120.0,
}
#: Runtime-reported hardware conditions (ROCr "HW Exception", ECC) take kernel evidence this far back.
DRIVER_WINDOW = 120.0
#: Driver categories that affect the whole GPU, whoever was running on it.
DEVICE_WIDE = frozenset({"gpu_lost", "ras_error", "gpu_reset", "gpu_hang", "link_error", "firmware_error"})

_TRAINING_PROCESS = regex.compile(
    r"^(python[\d.]*|pt_main_thread|pt_autograd.*|torchrun|deepspeed|accelerate|llamafactory.*|ray::.*|"
    r"vllm.*|VLLM.*|ipython\d*|pt_.*|trainer.*)$",
    regex.IGNORECASE,
)
_OTHER_PROCESS = regex.compile(
    r"^(xorg|x|gnome-shel.*|gnome-shell|kwin.*|plasmashell|sway|mutter|weston|hyprland|firefox.*|chrome.*|"
    r"chromium.*|steam.*|.*\.exe|quakechamp.*|blender.*|kodi.*|mpv|vlc|obs.*|systemd.*|plymouth.*)$",
    regex.IGNORECASE,
)


@dataclass(slots=True)
class _Crash:
    """Program failures of one crash, distinct ones kept, repeats counted."""

    #: One representative per distinct failure: a copy, so counting never touches the input.
    failures: list[ProgramFailure] = field(default_factory=list)
    fingerprints: dict[str, ProgramFailure] = field(default_factory=dict)
    #: Every input failure, repeats included (what a live caller keys its evidence by).
    members: list[ProgramFailure] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    origin: str = ""
    events: list[tuple[KernelEvent, str]] = field(default_factory=list)

    def add(self, failure: ProgramFailure) -> None:
        self.members.append(failure)
        key = failure_fingerprint(failure)
        same = self.fingerprints.get(key)
        if same is not None:
            same.count += failure.count
            for rank in _ranks(failure):
                if rank not in same.ranks:
                    same.ranks.append(rank)
        else:
            representative = replace(failure, ranks=_ranks(failure), fields=dict(failure.fields))
            self.fingerprints[key] = representative
            self.failures.append(representative)
        if failure.time is not None:
            self.first = failure.time if self.first is None else min(self.first, failure.time)
            self.last = failure.time if self.last is None else max(self.last, failure.time)
        if not self.origin:
            self.origin = failure.origin

    @property
    def naming_failure(self) -> ProgramFailure:
        """The failure that names the crash: not an aftermath, a cause rather than a symptom,
        and of those the first observed (torchrun's "root cause" is the first failure too)."""
        primary = [f for f in self.failures if not f.follow_on] or self.failures
        causes = [f for f in primary if f.category not in taxonomy.SYMPTOM_CATEGORIES] or primary
        return min(
            causes,
            key=lambda f: (
                f.time if f.time is not None else float("inf"),
                f.line_number,
                taxonomy.category_rank(f.category),
            ),
        )

    @property
    def pids(self) -> set[int]:
        return {f.pid for f in self.failures if f.pid is not None}


def _ranks(failure: ProgramFailure) -> list[int]:
    ranks = list(failure.ranks)
    if failure.rank is not None and failure.rank not in ranks:
        ranks.append(failure.rank)
    return ranks


def _failure_order(failure: ProgramFailure) -> tuple[bool, float, str, int]:
    return (failure.time is None, failure.time or 0.0, failure.origin, failure.line_number)


def collective_timeout(failure: ProgramFailure) -> float:
    """Seconds the collective waited before it failed (from `Timeout(ms)=`), else the default."""
    timeout = failure.fields.get("timeout_ms", "")
    return int(timeout) / 1000.0 if timeout.isdigit() else DEFAULT_COLLECTIVE_TIMEOUT


def _same_crash(crash: _Crash, failure: ProgramFailure, one_window: bool) -> bool:
    if one_window:
        return True
    if failure.time is None or crash.last is None:
        return failure.origin == crash.origin
    gap = failure.time - crash.last
    if gap <= CRASH_GAP:
        return True
    if failure.follow_on and gap <= FOLLOW_ON_GAP:
        return True
    if failure.category == "collective_failure" and gap <= collective_timeout(failure) + COLLECTIVE_SLACK:
        return True  # the other ranks time out waiting for the one that failed
    return gap <= REPEAT_GAP and failure_fingerprint(failure) in crash.fingerprints


def group_failures(failures: Sequence[ProgramFailure], one_window: bool = False) -> list[_Crash]:
    crashes: list[_Crash] = []
    for failure in sorted(failures, key=_failure_order):
        target = next((c for c in reversed(crashes[-8:]) if _same_crash(c, failure, one_window)), None)
        if target is None:
            target = _Crash()
            crashes.append(target)
        target.add(failure)
    return crashes


def _window_before(crash: _Crash) -> float:
    """How far before the crash a kernel fault may be its cause."""
    naming = crash.naming_failure
    if taxonomy.level_of(naming.category) == "driver":
        return DRIVER_WINDOW
    if naming.category == "collective_failure":
        collectives = [f for f in crash.failures if f.category == "collective_failure"]
        return max(collective_timeout(f) for f in collectives) + COLLECTIVE_SLACK
    return SYMPTOM_WINDOW.get(naming.category, 0.0)


def _process_kind(process: str | None) -> str:
    if not process:
        return "unknown"
    name = process.split(":", 1)[0].strip()
    if _TRAINING_PROCESS.match(name):
        return "training"
    if _OTHER_PROCESS.match(name):
        return "other"
    return "unknown"


def _page(address: str) -> int | None:
    try:
        return int(address, 16) >> 12
    except ValueError:
        return None


def fault_pages(event: KernelEvent) -> set[int]:
    """The 4 KiB pages a kernel fault names (byte addresses, or gmc v6-v8's page numbers)."""
    pages = {_page(a) for a in [event.address or "", *event.fields.get("addresses", "").split(",")] if a}
    if event.fields.get("page", "").isdigit():
        pages.add(int(event.fields["page"]))
    return {page for page in pages if page}


def _same_address(event: KernelEvent, crash: _Crash) -> str | None:
    pages = fault_pages(event)
    for failure in crash.failures:
        page = _page(failure.address) if failure.address else None
        if page and page in pages:
            return f"same fault address {failure.address}"
    return None


def _relation(event: KernelEvent, crash: _Crash) -> str | None:
    """Why the event belongs to the crash ("same pid", "same GPU window", ...), or None."""
    pids = crash.pids
    if event.pid is not None and event.pid in pids:
        return f"same pid {event.pid}"
    same_address = _same_address(event, crash)
    if same_address:
        return same_address
    naming = crash.naming_failure
    symptom = naming.category in taxonomy.SYMPTOM_CATEGORIES or taxonomy.level_of(naming.category) == "driver"
    if not symptom:
        if event.category == naming.category and event.pid is None:
            return "same failure seen by the kernel"
        return None
    if event.category in DEVICE_WIDE:
        return "a fault of the whole GPU"
    if event.pid is not None and pids:
        return None  # a fault of a pid that is not the training process
    if _process_kind(event.process) == "other":
        return None
    if event.process:
        return f"process {event.process}"
    return "no process named"


def _distance(event: KernelEvent, crash: _Crash, one_window: bool) -> float | None:
    """Seconds from the fault to the crash's first failure if inside its window, else None."""
    if one_window:
        return 0.0
    if event.time is None or crash.first is None or crash.last is None:
        return None
    if event.time < crash.first - _window_before(crash) or event.time > crash.last + KERNEL_AFTER:
        return None
    return crash.first - event.time


def link_events(crashes: Sequence[_Crash], events: Sequence[KernelEvent], one_window: bool) -> list[KernelEvent]:
    """Attach kernel events to the crash they explain; return the rest."""
    unlinked: list[KernelEvent] = []
    for event in events:
        best: tuple[float, _Crash, str] | None = None
        for crash in crashes:
            distance = _distance(event, crash, one_window)
            if distance is None:
                continue
            reason = _relation(event, crash)
            if reason is None:
                continue
            if best is None or abs(distance) < abs(best[0]):
                best = (distance, crash, reason)
        if best is None:
            unlinked.append(event)
        else:
            best[1].events.append((event, best[2]))
    return unlinked


def group_kernel_events(events: Sequence[KernelEvent], one_window: bool = False) -> list[list[KernelEvent]]:
    """Kernel-only incidents: faults of one GPU close in time, device-less lines
    joining the burst they are printed in."""
    groups: list[list[KernelEvent]] = []
    last_key: dict[int, tuple[int, float]] = {}
    for event in sorted(events, key=order_key):
        key = order_key(event)
        target: list[KernelEvent] | None = None
        for group in reversed(groups[-8:]):
            devices = {e.device for e in group if e.device}
            if event.device and devices and event.device not in devices:
                continue
            previous = last_key[id(group)]
            if one_window or (previous[0] == key[0] and key[1] - previous[1] <= KERNEL_GAP):
                target = group
                break
            if key[0] == 3 and previous[0] == 3:
                target = group  # no clock at all: adjacent records of one input
                break
        if target is None:
            target = []
            groups.append(target)
        target.append(event)
        last_key[id(target)] = key
    return groups


# -- building incidents ------------------------------------------------------


def _seconds(value: float) -> str:
    value = abs(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def describe_event(event: KernelEvent) -> str:
    where = f" on {event.device}" if event.device else ""
    who = ""
    if event.process or event.pid is not None:
        who = f" ({event.process or 'process'}{f' pid {event.pid}' if event.pid is not None else ''})"
    times = f", {event.count} times" if event.count > 1 else ""
    suppressed = f", {event.suppressed} more suppressed by the kernel" if event.suppressed else ""
    return f"kernel: {event.title}{where}{who}{times}{suppressed} [{event.rule_id}]"


def describe_failure(failure: ProgramFailure) -> str:
    # The first line of the message that says something (torchrun's summary starts with a row of '=').
    message = next((line.strip() for line in failure.message.splitlines() if line.strip(" =-:")), "")
    subject = message or (failure.text.splitlines()[-1] if failure.text else failure.title)
    if failure.exception_type and message and not message.startswith(failure.exception_type):
        subject = f"{failure.exception_type}: {message}"
    subject = subject.strip()
    if len(subject) > 160:
        subject = subject[:157] + "..."
    ranks = sorted(set(failure.ranks))
    who = ""
    if len(ranks) > 1:
        who = f" on {len(ranks)} ranks ({_span(ranks)})"
    elif ranks:
        who = f" on rank {ranks[0]}"
    times = f", {failure.count} times" if failure.count > 1 else ""
    where = f" at {failure.origin}:{failure.line_number}" if failure.origin else f" at line {failure.line_number}"
    rule = f" [{failure.rule_id}]" if failure.rule_id else ""
    return f"program: {subject}{who}{times}{where}{rule}"


def _span(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(rank) for rank in ranks[:16]) + ("..." if len(ranks) > 16 else "")


def _span_times(values: list[float | None]) -> tuple[float | None, float | None]:
    known = [value for value in values if value is not None]
    return (min(known), max(known)) if known else (None, None)


def _incident_from_crash(crash: _Crash, one_window: bool, clock_note: str) -> Incident:
    naming = crash.naming_failure
    events = [event for event, _ in crash.events]
    driver_failures = [f for f in crash.failures if taxonomy.level_of(f.category) == "driver"]
    driver_events = [e for e in events if taxonomy.level_of(e.category) == "driver"]
    driver_categories = [e.category for e in driver_events] + [f.category for f in driver_failures]
    evidence: list[str] = []
    naming_event: KernelEvent | None = None
    naming_failure: ProgramFailure | None = naming
    if driver_categories:
        category = taxonomy.leading_category(driver_categories)
        naming_event = next((e for e in driver_events if e.category == category), None)
        if naming_event is not None:
            title, hint = naming_event.title, _hint_of_event(naming_event)
            reason = f"label: driver, because the kernel reported {category} in the window of the program's failure"
            if naming.category in taxonomy.SYMPTOM_CATEGORIES:
                reason += f" (the {naming.category} the program saw is its symptom)"
        else:
            naming_failure = next(f for f in driver_failures if f.category == category)
            title, hint = naming_failure.title, naming_failure.hint
            reason = f"label: driver, because the GPU runtime itself reported {category} in the program's output"
    else:
        category = naming.category
        title, hint = naming.title, naming.hint
        reason = f"label: code, because the program failed with {category}"
        reason += (
            " and no driver-level kernel fault explains it"
            if crash.events
            else " and the kernel log shows no GPU fault"
        )
    level = taxonomy.level_of(category)
    evidence.append(reason)
    for event, relation in sorted(crash.events, key=lambda pair: order_key(pair[0])):
        evidence.append(f"{describe_event(event)}{_when(event, crash, one_window)}; linked by {relation}")
    for failure in crash.failures:
        evidence.append(describe_failure(failure))
    if one_window and clock_note:
        evidence.append(f"clock: {clock_note}; kernel and program logs were correlated as one window")
    times = [f.time for f in crash.failures] + [e.time for e in events]
    first_seen, last_seen = _span_times(times)
    fingerprint = incident_fingerprint(category, naming_failure, naming_event)
    ranks = sorted({rank for f in crash.failures for rank in f.ranks})
    pids = sorted({f.pid for f in crash.failures if f.pid is not None} | {e.pid for e in events if e.pid is not None})
    devices = sorted({e.device for e in events if e.device} | {f.device for f in crash.failures if f.device})
    return Incident(
        id=digest(fingerprint, first_seen, naming.origin, naming.line_number, length=12),
        level=level,
        category=category,
        title=title,
        hint=hint,
        first_seen=first_seen,
        last_seen=last_seen,
        count=sum(f.count for f in crash.failures if not f.follow_on) or sum(f.count for f in crash.failures),
        fingerprint=fingerprint,
        evidence=evidence,
        kernel_events=sorted(events, key=order_key),
        program_failures=list(crash.failures),
        members=[*events, *crash.members],
        ranks=ranks,
        pids=pids,
        devices=devices,
        clock="one_window" if one_window else "aligned",
    )


def _when(event: KernelEvent, crash: _Crash, one_window: bool) -> str:
    if one_window or event.time is None or crash.first is None:
        return ""
    delta = crash.first - event.time
    if abs(delta) < 0.0005:
        return ", at the time of the failure"
    return f", {_seconds(delta)} {'before' if delta > 0 else 'after'} the program's failure"


def _hint_of_event(event: KernelEvent) -> str:
    return event.hint or event.title


def _incident_from_events(events: list[KernelEvent], one_window: bool) -> Incident:
    categories = [e.category for e in events]
    category = taxonomy.leading_category(categories)
    primary = [e for e in events if e.category == category]
    naming = min(primary, key=order_key)
    level = taxonomy.level_of(category)
    evidence = [
        f"label: {level}, because the kernel reported {category}"
        + (" with no program failure in its window" if level == "driver" else " (a code-level kernel message)")
    ]
    start = min(events, key=order_key)
    for event in sorted(events, key=order_key):
        offset = ""
        if event is not start and event.time is not None and start.time is not None:
            offset = f", {_seconds(event.time - start.time)} after the first"
        evidence.append(describe_event(event) + offset)
    first_seen, last_seen = _span_times([e.time for e in events])
    fingerprint = incident_fingerprint(category, None, naming)
    return Incident(
        id=digest(fingerprint, first_seen, naming.first.origin, naming.index, length=12),
        level=level,
        category=category,
        title=naming.title,
        hint=_hint_of_event(naming),
        first_seen=first_seen,
        last_seen=last_seen,
        count=sum(e.count for e in primary),
        fingerprint=fingerprint,
        evidence=evidence,
        kernel_events=sorted(events, key=order_key),
        members=list(events),
        pids=sorted({e.pid for e in events if e.pid is not None}),
        devices=sorted({e.device for e in events if e.device}),
        clock="one_window" if one_window else "aligned",
    )


def importance(incident: Incident) -> tuple[int, float, int]:
    """Sort key, most important first: driver before code, then newest first."""
    newest = incident.last_seen if incident.last_seen is not None else float("-inf")
    return (0 if incident.level == "driver" else 1, -newest, taxonomy.category_rank(incident.category))


def correlate(
    events: Sequence[KernelEvent],
    failures: Sequence[ProgramFailure],
    *,
    one_window: bool = False,
    clock_note: str = "",
) -> list[Incident]:
    """Incidents, most important first, from events whose `time` is set and failures."""
    crashes = group_failures(failures, one_window)
    unlinked = link_events(crashes, sorted(events, key=order_key), one_window)
    incidents = [_incident_from_crash(crash, one_window, clock_note) for crash in crashes]
    incidents += [_incident_from_events(group, one_window) for group in group_kernel_events(unlinked, one_window)]
    return sorted(incidents, key=importance)
