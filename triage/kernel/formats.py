"""Every kernel-log form a user has at hand, turned into `KernelRecord`s.

One parser reads them all, line by line, and detects the format of each line on
its own, so a file that mixes forms (a dmesg paste followed by a journal excerpt)
still parses: raw `/dev/kmsg` records, `dmesg` with its `-x`, `-r`, `-T`,
`--reltime` and `--time-format iso` stamps, the journalctl `short*` and `json`
modes, syslog `kern.log` lines and bare lines with no stamp at all. The journal
`export` format is binary-safe and needs bytes: `read_kernel_stream` detects it.

Bad input never raises: a line that cannot be read is skipped or kept as a bare
record, and `KernelParseStats` counts what happened. Memory stays bounded: lines
are capped at `MAX_LINE_BYTES`, a record at `MAX_CONTINUATION_LINES` lines.
"""

from __future__ import annotations

import json
import re
import statistics
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import BinaryIO

from ..model import KernelRecord

#: Longest line kept; the rest of a longer line is read and dropped (and counted).
MAX_LINE_BYTES = 64 * 1024
#: Most lines one record may gather from indented continuation lines.
MAX_CONTINUATION_LINES = 64
#: Most fields kept from one journal export entry.
MAX_EXPORT_FIELDS = 1024
#: Most offsets `boot_time_from` looks at (the first ones of the latest boot).
MAX_BOOT_SAMPLES = 100_000

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
_JOURNAL_FIELDS_KEPT = {
    "_KERNEL_SUBSYSTEM": "SUBSYSTEM",
    "_KERNEL_DEVICE": "DEVICE",
    "_UDEV_SYSNAME": "_UDEV_SYSNAME",
    "_HOSTNAME": "_HOSTNAME",
    "SYSLOG_FACILITY": "SYSLOG_FACILITY",
    "_TRANSPORT": "_TRANSPORT",
    "__CURSOR": "__CURSOR",
    "__MONOTONIC_TIMESTAMP": "__MONOTONIC_TIMESTAMP",
}


@dataclass(slots=True)
class KernelParseStats:
    """What the parser saw, so skipped input is visible instead of silently lost."""

    #: Text lines (or journal export entries) read.
    lines: int = 0
    #: KernelRecords produced.
    records: int = 0
    #: Lines and journal entries of other programs (systemd, python, ...), skipped.
    other_programs: int = 0
    #: Lines that looked like a known format but could not be read (broken JSON, ...).
    unparsed: int = 0
    #: Lines or messages that were not valid UTF-8 (decoded with replacement characters).
    bad_encoding: int = 0
    #: Lines longer than MAX_LINE_BYTES, cut there.
    truncated: int = 0
    #: Indented lines joined to the record above them.
    continuation_lines: int = 0
    #: `/dev/kmsg` ` KEY=value` lines taken into a record's fields.
    kmsg_fields: int = 0
    #: Empty lines and journalctl markers (`-- Boot ... --`, `-- No entries --`).
    blank: int = 0


# ---------------------------------------------------------------------------
# Stamps: each regex reads one form of line start; `rest` is what follows.

# /dev/kmsg: prio,seq,usec[,flags[,more...]];message (older kernels had no flags).
_KMSG = re.compile(r"(?P<prio>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20})(?:,(?P<more>[^;]*))?;(?P<message>.*)", re.S)
_KMSG_FIELD = re.compile(r" (?P<key>[A-Z0-9_]{1,64})=(?P<value>.*)", re.S)
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
# dmesg -x: "kern  :err   : " before the stamp.
_DMESG_X = re.compile(
    r"(?P<fac>[a-z]{2,8}[0-7]?)\s*:(?P<lvl>emerg|alert|crit|err|warn|notice|info|debug)\s*: ?(?P<rest>.*)", re.S
)
# dmesg -r and console output: "<3>" before the stamp.
_RAW_PRIO = re.compile(r"<(?P<prio>\d{1,4})>(?P<rest>.*)", re.S)
# dmesg: "[ 1234.567890] ", also with dmesg -d's "< 0.000123>" delta.
_MONOTONIC = re.compile(r"\[\s*(?P<sec>\d{1,12}\.\d{1,9})(?:\s*<\s*[\d.]+>)?\] ?(?P<rest>.*)", re.S)
# dmesg --reltime: "[  +0.000388] " deltas after a "[Nov19 10:33] " header.
_DELTA = re.compile(r"\[\s*\+\s*(?P<sec>\d{1,12}\.\d{1,9})\] ?(?P<rest>.*)", re.S)
_RELTIME_HEADER = re.compile(
    r"\[(?P<mon>[A-Z][a-z]{2}) ?(?P<day>\d{1,2}) (?P<h>\d{2}):(?P<m>\d{2})\] ?(?P<rest>.*)", re.S
)
# dmesg -T in the C locale: "[Fri Jul 10 20:23:53 2026] ".
_CTIME = re.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
    r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2}) (?P<year>\d{4})\] ?(?P<rest>.*)",
    re.S,
)
# dmesg -T in another locale ("[Di, 12. Aug 2025, 00:08:06] "): a year and a time of day inside.
_CTIME_FOREIGN = re.compile(r"\[(?P<stamp>(?=[^\]\[]*\b(?:19|20)\d\d\b)[^\]\[]{8,48}?)\] ?(?P<rest>.*)", re.S)
_TIME_OF_DAY = re.compile(r"(?<!\d)(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})(?!\d)")
_DAY_NUMBER = re.compile(r"(?<![\d:])(?P<day>\d{1,2})(?![\d:])")
# ISO 8601 / RFC 3339: dmesg --time-format iso, journalctl -o short-iso(-precise), rsyslog.
_ISO = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:[.,](?P<frac>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})? (?P<rest>.*)",
    re.S,
)
# BSD syslog / journalctl -o short / short-precise: "Aug 23 23:38:11[.123456] ".
_BSD = re.compile(
    r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(?P<day>\d{1,2}) "
    r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))? (?P<rest>.*)",
    re.S,
)
# journalctl -o short-full: "Mon 2026-11-30 12:17:11 CET ".
_FULL = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<date>\d{4}-\d{2}-\d{2}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
    r"(?:\.(?P<frac>\d{1,9}))? (?P<tz>[A-Za-z]{1,6}|[+-]\d{2}:?\d{2}) (?P<rest>.*)",
    re.S,
)
# journalctl -o short-unix: "1796037530.964991 ".
_UNIX = re.compile(r"(?P<sec>\d{9,11}\.\d{1,9}) (?P<rest>.*)", re.S)
# What follows the stamp in journal and syslog lines: "host ident[pid]: message".
_SYSLOG_TAG = re.compile(r"(?P<host>[^\s:\[\]]+) (?P<ident>[^\s\[\]]+?)(?:\[(?P<pid>\d+)\])?: ?(?P<message>.*)", re.S)
# journalctl markers between entries.
_JOURNAL_MARKER = re.compile(r"-- (?:.*) --")
_BOOT_MARKER = re.compile(r"-- Boot (?P<boot>[0-9a-f]{32}) --")


@dataclass(slots=True)
class _Stamp:
    """What the line start told: clocks, priority, host, and whether the line is the kernel's."""

    message: str
    monotonic: float | None = None
    wall: float | None = None
    relative: float | None = None
    priority: int | None = None
    host: str | None = None
    #: True for journal/syslog lines of another program: skip them.
    other_program: bool = False
    #: The relative clock this line sets ("delta", "header") when it is dmesg --reltime.
    reltime: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


def _seconds(whole: str, frac: str | None) -> float:
    return int(whole) + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _local_epoch(year: int, month: int, day: int, hour: int, minute: int, second: float) -> float | None:
    """Epoch seconds of a local wall time (the TZ of this process), None when impossible."""
    try:
        whole = time.mktime((year, month, day, hour, minute, int(second), 0, 0, -1))
    except (OverflowError, ValueError, OSError):
        return None
    return whole + (second - int(second))


def _zoned_epoch(date: str, hour: int, minute: int, second: float, zone: str | None) -> float | None:
    """Epoch seconds of an ISO date and time; no zone means local time."""
    try:
        year, month, day = (int(part) for part in date.split("-"))
        if zone is None or not (zone == "Z" or zone[0] in "+-" or zone.upper() in ("UTC", "GMT")):
            return _local_epoch(year, month, day, hour, minute, second)
        if zone == "Z" or zone.upper() in ("UTC", "GMT"):
            offset = timedelta(0)
        else:
            digits = zone[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            offset = -offset if zone[0] == "-" else offset
        stamp = datetime(year, month, day, hour, minute, int(second), tzinfo=timezone(offset))
        return stamp.timestamp() + (second - int(second))
    except (ValueError, OverflowError, OSError):
        return None


def decode_kmsg_escapes(text: str) -> tuple[str, bool]:
    """Undo /dev/kmsg's `\\xNN` escapes; the second value is False when the bytes were not UTF-8."""
    if "\\x" not in text:
        return text, True
    raw = bytearray()
    position = 0
    for match in _KMSG_ESCAPE.finditer(text):
        raw += text[position : match.start()].encode("utf-8", "surrogatepass")
        raw.append(int(match.group(1), 16))
        position = match.end()
    raw += text[position:].encode("utf-8", "surrogatepass")
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), False


class _LineParser:
    """The per-input state of `parse_kernel_lines`: one pending record and the clocks seen."""

    def __init__(self, origin: str, reference_year: int | None, stats: KernelParseStats) -> None:
        self.origin = origin
        self.stats = stats
        self.year = reference_year if reference_year is not None else time.localtime().tm_year
        self.last_month: int | None = None
        self.pending: KernelRecord | None = None
        self.pending_kind = ""
        self.pending_indent = 0
        self.skipping_continuation = False
        self.reltime: float | None = None
        self.kernel_hosts: set[str] = set()
        self.boot_id: str | None = None
        self.index = 0
        self.last_local: tuple[tuple[int, ...], float | None] = ((), None)

    def local_epoch(self, year: int, month: int, day: int, hour: int, minute: int, second: float) -> float | None:
        """`_local_epoch`, remembering the last whole second: consecutive lines mostly share it."""
        key = (year, month, day, hour, minute, int(second))
        if key != self.last_local[0]:
            self.last_local = (key, _local_epoch(year, month, day, hour, minute, int(second)))
        whole = self.last_local[1]
        return None if whole is None else whole + (second - int(second))

    # -- records --------------------------------------------------------------

    def emit(self) -> Iterator[KernelRecord]:
        """The pending record, now complete."""
        if self.pending is not None:
            record = self.pending
            self.pending = None
            record.index = self.index
            self.index += 1
            self.stats.records += 1
            yield record

    def start(self, record: KernelRecord, kind: str, indent: int) -> Iterator[KernelRecord]:
        yield from self.emit()
        self.pending = record
        self.pending_kind = kind
        self.pending_indent = indent
        self.skipping_continuation = False

    def new_record(self, stamp: _Stamp, raw: str) -> KernelRecord:
        fields = dict(stamp.fields)
        if stamp.host:
            fields["_HOSTNAME"] = stamp.host
        return KernelRecord(
            message=stamp.message,
            raw=[raw],
            index=-1,
            monotonic=stamp.monotonic,
            wall=stamp.wall,
            relative=stamp.relative,
            priority=stamp.priority,
            boot_id=self.boot_id,
            fields=fields,
            origin=self.origin,
        )

    # -- lines ----------------------------------------------------------------

    def feed(self, line: str) -> Iterator[KernelRecord]:
        self.stats.lines += 1
        if len(line) > MAX_LINE_BYTES:
            line = line[:MAX_LINE_BYTES]
            self.stats.truncated += 1
        line = line.removesuffix("\n").removesuffix("\r")
        if line.startswith("\x1e"):  # journalctl -o json-seq
            line = line[1:]
        if not line.strip():
            self.stats.blank += 1
            return
        if line.startswith("{"):
            yield from self.emit()
            yield from self.feed_json(line)
            return
        if _JOURNAL_MARKER.fullmatch(line):
            boot = _BOOT_MARKER.fullmatch(line)
            if boot:
                self.boot_id = boot.group("boot")
            self.stats.blank += 1
            return
        kmsg = _KMSG.fullmatch(line)
        if kmsg:
            yield from self.start(self.kmsg_record(kmsg, line), "kmsg", 0)
            return
        indent = len(line) - len(line.lstrip())
        if indent and self.pending_kind == "kmsg" and self.pending is not None:
            kmsg_field = _KMSG_FIELD.fullmatch(line)
            if kmsg_field:
                self.pending.fields[kmsg_field.group("key")] = kmsg_field.group("value")
                self.pending.raw.append(line)
                self.stats.kmsg_fields += 1
                return
        stamp = self.read_stamp(line[indent:])
        if stamp is None and indent:
            if self.skipping_continuation:
                self.stats.other_programs += 1
                return
            if self.can_continue(indent):
                assert self.pending is not None
                self.pending.message += "\n" + line.strip()
                self.pending.raw.append(line)
                self.stats.continuation_lines += 1
                return
        if stamp is None:
            stamp = _Stamp(message=line[indent:])
        if stamp.other_program:
            yield from self.emit()
            self.pending_kind = ""
            self.skipping_continuation = True
            self.stats.other_programs += 1
            return
        yield from self.start(self.new_record(stamp, line), "text", indent)

    def can_continue(self, indent: int) -> bool:
        pending = self.pending
        return (
            pending is not None
            and self.pending_kind == "text"
            and indent > self.pending_indent
            and len(pending.raw) < MAX_CONTINUATION_LINES
            and len(pending.message) < MAX_LINE_BYTES
        )

    def kmsg_record(self, match: re.Match[str], line: str) -> KernelRecord:
        message, clean = decode_kmsg_escapes(match.group("message"))
        if not clean:
            self.stats.bad_encoding += 1
        prio = int(match.group("prio"))
        fields = {"SYSLOG_FACILITY": str(prio >> 3)}
        more = (match.group("more") or "").split(",")
        if more[0] and more[0] != "-":
            fields["flags"] = more[0]
        for extra in more[1:]:
            key, sep, value = extra.partition("=")
            if sep and key:
                fields[key] = value
        return KernelRecord(
            message=message,
            raw=[line],
            index=-1,
            monotonic=int(match.group("usec")) / 1e6,
            seq=int(match.group("seq")),
            priority=prio & 7,
            boot_id=self.boot_id,
            fields=fields,
            origin=self.origin,
        )

    def feed_json(self, line: str) -> Iterator[KernelRecord]:
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            self.stats.unparsed += 1
            return
        if not isinstance(entry, dict):
            self.stats.unparsed += 1
            return
        record = journal_entry_record(entry, self.origin, self.stats)
        if record is not None:
            self.pending = record
            self.pending_kind = "json"
            yield from self.emit()
        self.pending_kind = ""

    # -- stamps ---------------------------------------------------------------

    def read_stamp(self, text: str) -> _Stamp | None:
        """The stamp that starts `text`, with any dmesg -x / -r prefix; None for a bare line."""
        priority: int | None = None
        fields: dict[str, str] = {}
        decoded = _DMESG_X.fullmatch(text)
        if decoded and decoded.group("lvl") in _LEVELS:
            priority = _LEVELS[decoded.group("lvl")]
            fields["facility"] = decoded.group("fac")
            text = decoded.group("rest")
        else:
            raw = _RAW_PRIO.fullmatch(text)
            if raw:
                priority = int(raw.group("prio")) & 7
                text = raw.group("rest")
        stamp = self.stamped(text)
        if stamp is None:
            if priority is None:
                return None
            stamp = _Stamp(message=text)  # dmesg -x -t: a level but no time
        if priority is not None:
            stamp.priority = priority
        stamp.fields.update(fields)
        return stamp

    def stamped(self, text: str) -> _Stamp | None:
        if not text:
            return None
        first = text[0]
        if first == "[":
            return self.bracketed(text)
        if first.isdigit():
            iso = _ISO.fullmatch(text)
            if iso:
                wall = _zoned_epoch(
                    iso.group("date"),
                    int(iso.group("h")),
                    int(iso.group("m")),
                    _seconds(iso.group("s"), iso.group("frac")),
                    iso.group("tz"),
                )
                return self.after_stamp(iso.group("rest"), wall=wall, optional_host=True)
            unix = _UNIX.fullmatch(text)
            if unix:
                tagged = self.after_stamp(unix.group("rest"), wall=float(unix.group("sec")), optional_host=True)
                return tagged if tagged.host or tagged.other_program else None
            return None
        bsd = _BSD.fullmatch(text)
        if bsd:
            month = _MONTHS[bsd.group("mon")]
            year = self.year_for(month)
            second = _seconds(bsd.group("s"), bsd.group("frac"))
            wall = self.local_epoch(
                year, month, int(bsd.group("day")), int(bsd.group("h")), int(bsd.group("m")), second
            )
            return self.after_stamp(bsd.group("rest"), wall=wall, optional_host=False)
        full = _FULL.fullmatch(text)
        if full:
            second = _seconds(full.group("s"), full.group("frac"))
            wall = _zoned_epoch(
                full.group("date"), int(full.group("h")), int(full.group("m")), second, full.group("tz")
            )
            return self.after_stamp(full.group("rest"), wall=wall, optional_host=False)
        return None

    def bracketed(self, text: str) -> _Stamp | None:
        """dmesg stamps in brackets: monotonic, --reltime, -T in any locale."""
        mono = _MONOTONIC.fullmatch(text)
        if mono:
            return self.after_stamp(mono.group("rest"), monotonic=float(mono.group("sec")), optional_host=True)
        delta = _DELTA.fullmatch(text)
        if delta:
            self.reltime = (self.reltime or 0.0) + float(delta.group("sec"))
            return _Stamp(message=delta.group("rest"), relative=self.reltime, reltime="delta")
        header = _RELTIME_HEADER.fullmatch(text)
        if header and header.group("mon") in _MONTHS:
            base = (int(header.group("day")) * 24 + int(header.group("h"))) * 3600.0 + int(header.group("m")) * 60
            self.reltime = max(base, self.reltime) if self.reltime is not None else base
            return _Stamp(message=header.group("rest"), relative=self.reltime, reltime="header")
        ctime = _CTIME.fullmatch(text)
        if ctime and ctime.group("mon") in _MONTHS:
            wall = self.local_epoch(
                int(ctime.group("year")),
                _MONTHS[ctime.group("mon")],
                int(ctime.group("day")),
                int(ctime.group("h")),
                int(ctime.group("m")),
                int(ctime.group("s")),
            )
            return _Stamp(message=ctime.group("rest"), wall=wall)
        foreign = _CTIME_FOREIGN.fullmatch(text)
        if foreign:
            relative = foreign_relative(foreign.group("stamp"))
            if relative is not None:
                return _Stamp(message=foreign.group("rest"), relative=relative)
        return None

    def after_stamp(
        self,
        rest: str,
        *,
        monotonic: float | None = None,
        wall: float | None = None,
        optional_host: bool,
    ) -> _Stamp:
        """Split `host ident[pid]: ` off journal and syslog lines; keep kernel ones.

        After a bracketed or ISO stamp the host is optional (dmesg has none), so a
        `host ident: ` reading is only taken for `kernel`, for an `ident[pid]`, or
        for a host already seen with `kernel`: a dmesg message like `usb 1-1: ...`
        stays a kernel message.
        """
        no_host = rest.startswith("kernel: ")  # journalctl --no-hostname
        tag = _SYSLOG_TAG.fullmatch("- " + rest if no_host else rest)
        if tag is None:
            if optional_host:
                return _Stamp(message=rest, monotonic=monotonic, wall=wall)
            return _Stamp(message=rest, monotonic=monotonic, wall=wall, other_program=True)
        host, ident = tag.group("host"), tag.group("ident")
        if ident == "kernel" and tag.group("pid") is None:
            if not no_host:
                self.kernel_hosts.add(host)
            message = tag.group("message")
            kernel_stamp = _MONOTONIC.fullmatch(message)  # kern.log: "kernel: [  123.456789] msg"
            if kernel_stamp and monotonic is None:
                monotonic = float(kernel_stamp.group("sec"))
                message = kernel_stamp.group("rest")
            return _Stamp(message=message, monotonic=monotonic, wall=wall, host=None if no_host else host)
        if not optional_host or tag.group("pid") is not None or host in self.kernel_hosts:
            return _Stamp(message=rest, other_program=True)
        return _Stamp(message=rest, monotonic=monotonic, wall=wall)

    def year_for(self, month: int) -> int:
        """The year of a syslog date that has none: the reference year, moved on at New Year."""
        if self.last_month is not None and month < self.last_month - 6:
            self.year += 1
        elif self.last_month is not None and month > self.last_month + 6:
            self.year -= 1
        self.last_month = month
        return self.year


def foreign_relative(stamp: str) -> float | None:
    """Seconds from a `dmesg -T` stamp in a locale we cannot read: time of day plus day of month.

    The day is taken only when exactly one 1-2 digit number stands apart from the
    time (German `Di, 12. Aug 2025, 00:08:06` gives 12); ordering across a month
    end is then lost, but order and spacing within a day survive.
    """
    clock = _TIME_OF_DAY.search(stamp)
    if clock is None:
        return None
    seconds = int(clock.group("h")) * 3600.0 + int(clock.group("m")) * 60 + int(clock.group("s"))
    outside = stamp[: clock.start()] + " " + stamp[clock.end() :]
    days = _DAY_NUMBER.findall(outside)
    if len(days) == 1:
        seconds += int(days[0]) * 86400
    return seconds


# ---------------------------------------------------------------------------
# Journal entries (json and export modes share this).


def _journal_value(value: object) -> str | None:
    """A journal field value as text: a string, or a byte list (non-UTF-8 data), first of repeats."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value:
        if all(isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 256 for item in value):
            return bytes(value).decode("utf-8", "replace")
        first = value[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list) and all(isinstance(item, int) and 0 <= item < 256 for item in first):
            return bytes(first).decode("utf-8", "replace")
    return None


def _usec(value: str | None) -> float | None:
    if value is None or not value.isdigit() or len(value) > 20:
        return None
    return int(value) / 1e6


def _int_or_none(value: str | None) -> int | None:
    if value is None or not value.isdigit() or len(value) > 6:
        return None
    return int(value)


def _is_kernel_entry(entry: Mapping[str, object]) -> bool:
    return (
        _journal_value(entry.get("_TRANSPORT")) == "kernel"
        or _journal_value(entry.get("SYSLOG_IDENTIFIER")) == "kernel"
    )


def journal_entry_record(entry: Mapping[str, object], origin: str, stats: KernelParseStats) -> KernelRecord | None:
    """The KernelRecord of one journal entry, None (counted) for other programs' entries.

    A /dev/kmsg record written from user space keeps `_TRANSPORT=kernel` but
    journald splits its `ident:` off MESSAGE; it is put back so the message reads
    as dmesg shows it. `raw` holds the message's lines (the JSON or export entry
    itself is no line a person reads).
    """
    if not _is_kernel_entry(entry):
        stats.other_programs += 1
        return None
    raw_message = entry.get("MESSAGE")
    message = _journal_value(raw_message)
    if message is None:
        stats.unparsed += 1
        return None
    if "\ufffd" in message and not (isinstance(raw_message, str) and "\ufffd" in raw_message):
        stats.bad_encoding += 1
    ident = _journal_value(entry.get("SYSLOG_IDENTIFIER"))
    if ident and ident != "kernel":
        pid = _journal_value(entry.get("SYSLOG_PID"))
        message = f"{ident}[{pid}]: {message}" if pid else f"{ident}: {message}"
    source = _usec(_journal_value(entry.get("_SOURCE_MONOTONIC_TIMESTAMP")))
    received = _usec(_journal_value(entry.get("__MONOTONIC_TIMESTAMP")))
    fields: dict[str, str] = {}
    for key, kept in _JOURNAL_FIELDS_KEPT.items():
        value = _journal_value(entry.get(key))
        if value is not None:
            fields[kept] = value
    priority = _int_or_none(_journal_value(entry.get("PRIORITY")))
    message = message.removesuffix("\n")
    return KernelRecord(
        message=message,
        raw=message.split("\n"),
        index=-1,
        monotonic=source if source is not None else received,
        wall=_usec(_journal_value(entry.get("__REALTIME_TIMESTAMP"))),
        priority=priority & 7 if priority is not None else None,
        boot_id=_journal_value(entry.get("_BOOT_ID")),
        fields=fields,
        origin=origin,
    )


def _export_entries(reader: _ByteReader, stats: KernelParseStats) -> Iterator[dict[str, bytes]]:
    """Entries of a journal export stream (systemd JOURNAL_EXPORT_FORMATS), bounded in memory."""
    entry: dict[str, bytes] = {}
    while True:
        line = reader.readline(MAX_LINE_BYTES + 1)
        if not line:
            break
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE_BYTES:
                stats.truncated += 1
                reader.skip_line()
            else:
                break  # the stream ended inside a field
        line = line.rstrip(b"\n")
        if not line:
            if entry:
                yield entry
            entry = {}
            continue
        key, sep, value = line.partition(b"=")
        if not sep:  # binary field: KEY, then little-endian 64-bit size, data, newline
            size_bytes = reader.read(8)
            if len(size_bytes) < 8:
                stats.unparsed += 1  # the stream ended inside the entry: drop it
                return
            (size,) = struct.unpack("<Q", size_bytes)
            value = reader.read(min(size, MAX_LINE_BYTES))
            if size > MAX_LINE_BYTES:
                stats.truncated += 1
                reader.discard(size - MAX_LINE_BYTES)
            if reader.read(1) != b"\n":
                stats.unparsed += 1
                return
        if len(entry) < MAX_EXPORT_FIELDS:
            name = key.decode("utf-8", "replace")
            entry.setdefault(name, value)  # a repeated field: the first one
    if entry:
        yield entry


def parse_journal_export(
    stream: BinaryIO, origin: str = "", *, stats: KernelParseStats | None = None
) -> Iterator[KernelRecord]:
    """Kernel records of a `journalctl -o export` stream; other programs' entries skipped and counted."""
    yield from _parse_export(_ByteReader(stream), origin, stats if stats is not None else KernelParseStats())


def _parse_export(reader: _ByteReader, origin: str, stats: KernelParseStats) -> Iterator[KernelRecord]:
    index = 0
    for entry in _export_entries(reader, stats):
        stats.lines += 1
        record = journal_entry_record(entry, origin, stats)
        if record is not None:
            record.index = index
            index += 1
            stats.records += 1
            yield record


# ---------------------------------------------------------------------------
# Streams.


class _ByteReader:
    """A binary stream with some bytes already read put back in front, read in bounded pieces."""

    def __init__(self, stream: BinaryIO, head: bytes = b"") -> None:
        self.stream = stream
        self.head = head

    def readline(self, limit: int) -> bytes:
        if self.head:
            cut = self.head.find(b"\n", 0, limit)
            end = cut + 1 if cut >= 0 else min(len(self.head), limit)
            line, self.head = self.head[:end], self.head[end:]
            if line.endswith(b"\n") or len(line) >= limit:
                return line
            return line + self.stream.readline(limit - len(line))
        return self.stream.readline(limit)

    def read(self, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            if self.head:
                take = self.head[: size - len(out)]
                self.head = self.head[len(take) :]
                out += take
                continue
            chunk = self.stream.read(size - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def discard(self, size: int) -> None:
        while size > 0:
            chunk = self.read(min(size, MAX_LINE_BYTES))
            if not chunk:
                return
            size -= len(chunk)

    def skip_line(self) -> None:
        """Drop the rest of an over-long line, piece by piece."""
        while True:
            piece = self.readline(MAX_LINE_BYTES)
            if not piece or piece.endswith(b"\n"):
                return


_EXPORT_START = re.compile(rb"[A-Z_][A-Z0-9_]*=")


def _text_lines(reader: _ByteReader, stats: KernelParseStats) -> Iterator[str]:
    """Decoded lines of a stream, each cut at MAX_LINE_BYTES (the rest of the line dropped)."""
    while True:
        line = reader.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            stats.truncated += 1
            reader.skip_line()
            line = line[:MAX_LINE_BYTES]
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            stats.bad_encoding += 1
            yield line.decode("utf-8", "replace")


def read_kernel_stream(
    stream: BinaryIO,
    origin: str = "",
    *,
    reference_year: int | None = None,
    stats: KernelParseStats | None = None,
) -> Iterator[KernelRecord]:
    """Kernel records from any kernel-log stream: journal export detected by its first line, else text."""
    stats = stats if stats is not None else KernelParseStats()
    reader = _ByteReader(stream)
    head = b""
    while True:  # the first non-empty line decides
        line = reader.readline(MAX_LINE_BYTES + 1)
        head += line
        if not line or line.strip():
            break
        if len(head) > MAX_LINE_BYTES:
            break
    reader = _ByteReader(stream, head)
    if _EXPORT_START.match(head.lstrip(b"\n")):
        yield from _parse_export(reader, origin, stats)
        return
    yield from parse_kernel_lines(_text_lines(reader, stats), origin, reference_year=reference_year, stats=stats)


def parse_kernel_lines(
    lines: Iterable[str],
    origin: str = "",
    *,
    reference_year: int | None = None,
    stats: KernelParseStats | None = None,
) -> Iterator[KernelRecord]:
    """Kernel records from text lines of any form, detected line by line.

    `reference_year` dates syslog lines that carry no year (`Apr 12 00:54:42`);
    without it, the current year. Wall times without a zone are read in the
    local time zone of this process.
    """
    parser = _LineParser(origin, reference_year, stats if stats is not None else KernelParseStats())
    for item in lines:
        text = item.removesuffix("\n")
        if "\n" in text:  # a chunk of several lines
            for line in text.split("\n"):
                yield from parser.feed(line)
        else:
            yield from parser.feed(text)
    yield from parser.emit()


# ---------------------------------------------------------------------------
# Clocks.


def boot_time_from(records: Iterable[KernelRecord]) -> float | None:
    """Epoch seconds of boot: the median of wall minus monotonic over records that carry both.

    Journal records use journald's own receive stamps (`__MONOTONIC_TIMESTAMP`),
    taken together with the wall clock, since journald may read /dev/kmsg late;
    other records (kern.log with `[ 123.4]` stamps) use the kernel's stamp. Only
    the latest boot seen counts, and only its first MAX_BOOT_SAMPLES records.
    """
    samples: dict[str | None, list[float]] = {}
    latest: str | None = None
    for record in records:
        if record.wall is None:
            continue
        received = _usec(record.fields.get("__MONOTONIC_TIMESTAMP"))
        monotonic = received if received is not None else record.monotonic
        if monotonic is None:
            continue
        latest = record.boot_id
        boot_samples = samples.setdefault(record.boot_id, [])
        if len(boot_samples) < MAX_BOOT_SAMPLES:
            boot_samples.append(record.wall - monotonic)
    offsets = samples.get(latest)
    return statistics.median(offsets) if offsets else None
