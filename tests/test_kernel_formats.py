"""Kernel-log forms -> KernelRecords, on real output.

The fixtures under tests/data/kernel are what dmesg, journald/journalctl,
systemd-journal-remote and rsyslog printed for one set of /dev/kmsg records
(tests/data/kernel/README.md says how); the corpus cases are kernel logs users
posted. Every form must give the same kernel messages with the clocks it carries,
and nothing from other programs.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.kernel.formats import (
    MAX_LINE_BYTES,
    KernelParseStats,
    boot_time_from,
    decode_kmsg_escapes,
    parse_journal_export,
    parse_kernel_lines,
    read_kernel_stream,
)
from triage.model import KernelRecord

DATA = Path(__file__).resolve().parent / "data" / "kernel"
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus" / "cases.jsonl"

#: 2026-11-30 12:23:56 in Berlin (CET, +01:00), when the first fixture record was logged.
FIRST_WALL = datetime(2026, 11, 30, 11, 23, 56, tzinfo=UTC).timestamp()
FIRST_MONOTONIC = 925.227735
PAGE_FAULT = "amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)"
FALLEN_OFF = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands."
)
XID_79 = "NVRM: Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus."
#: Kernel messages every form of the fixture carries, in this order (whitespace collapsed).
KEY_MESSAGES = [
    "triage-capture: begin",
    "gmc_v9_0_process_interrupt: 41 callbacks suppressed",
    PAGE_FAULT,
    "amdgpu 0000:c2:00.0: amdgpu: Process python pid 5578 thread python pid 5578",
    "amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031",
    "amdgpu 0000:0d:00.0: [gfxhub] page fault (src_id:0 ring:24 vmid:4 pasid:10)",
    "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
    XID_79,
    "amdgpu 0000:c3:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32774)",
    "amdgpu 0000:c3:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
]
#: Lines other programs logged between the kernel records: never kernel records.
OTHER_PROGRAMS = ("RuntimeError: HIP error", "worker 0 failed", "not a kernel line", "capture done", "Journal stopped")


@pytest.fixture
def berlin() -> Iterator[None]:
    """The time zone the fixtures were printed in, for forms whose stamps carry no zone."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def read_fixture(name: str, stats: KernelParseStats | None = None, year: int = 2026) -> list[KernelRecord]:
    with open(DATA / name, "rb") as stream:
        return list(read_kernel_stream(stream, name, reference_year=year, stats=stats))


def corpus_lines(case_prefix: str) -> list[str]:
    if not CORPUS.exists():
        pytest.skip("corpus not present (../shared/corpus/cases.jsonl)")
    with open(CORPUS, encoding="utf-8") as corpus:
        for line in corpus:
            case = json.loads(line)
            if case["id"].startswith(case_prefix):
                return str(case["kernel_log"]).split("\n")
    pytest.fail(f"no corpus case {case_prefix}")


def squashed(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def by_message(records: list[KernelRecord], message: str) -> KernelRecord:
    for record in records:
        if record.message == message:
            return record
    raise AssertionError(f"no record {message!r} in {[record.message for record in records]}")


def assert_kernel_messages(records: list[KernelRecord]) -> None:
    """The fixture's key kernel messages, in order, and nothing of other programs."""
    messages = [squashed(record.message) for record in records]
    positions = [messages.index(squashed(message)) for message in KEY_MESSAGES]
    assert positions == sorted(positions)
    for record in records:
        assert not any(other in record.message for other in OTHER_PROGRAMS), record.message
    assert [record.index for record in records] == list(range(len(records)))


# ---------------------------------------------------------------------------
# /dev/kmsg


def test_kmsg_records_read_from_the_device() -> None:
    stats = KernelParseStats()
    records = read_fixture("kmsg.bin", stats)
    assert len(records) == 26  # one boot record with fields, then the 25 written
    assert_kernel_messages(records)
    begin = by_message(records, "triage-capture: begin")
    assert begin.monotonic == FIRST_MONOTONIC
    assert begin.seq is not None and begin.seq > 0
    assert begin.priority == 6 and begin.fields["SYSLOG_FACILITY"] == "1"  # user space writes get LOG_USER
    seqs = [record.seq for record in records]
    assert seqs == sorted(seqs)


def test_kmsg_continuation_lines_become_fields() -> None:
    stats = KernelParseStats()
    records = read_fixture("kmsg.bin", stats)
    virtio = records[0]
    assert virtio.message == "virtio_blk virtio1: [vda] new size: 536870912 512-byte logical blocks (275 GB/256 GiB)"
    assert virtio.fields["SUBSYSTEM"] == "virtio"
    assert virtio.fields["DEVICE"] == "+virtio:virtio1"
    assert virtio.fields["SYSLOG_FACILITY"] == "0" and virtio.priority == 5
    assert len(virtio.raw) == 3
    assert stats.kmsg_fields == 2


def test_kmsg_escapes_are_decoded() -> None:
    stats = KernelParseStats()
    records = read_fixture("kmsg.bin", stats)
    assert by_message(records, FALLEN_OFF).raw[0].count("\\x0a") == 2
    escaped = next(record for record in records if "non-ASCII" in record.message)
    assert escaped.message == "triage-capture: non-ASCII é, backslash \\, bad byte \ufffd, control \x01 end"
    assert stats.bad_encoding == 1
    assert decode_kmsg_escapes("a\\x5cb\\x0ac") == ("a\\b\nc", True)


def test_kmsg_record_with_caller_id_and_no_flags() -> None:
    """Kernels with CONFIG_PRINTK_CALLER add `caller=`; the first kernels had no flags field."""
    records = list(parse_kernel_lines(["6,339,5140900,-,caller=T1;NET: Registered protocol family 10", "5,0,0;Linux"]))
    assert records[0].fields["caller"] == "T1" and records[0].seq == 339 and records[0].monotonic == 5.1409
    assert records[1].message == "Linux" and records[1].seq == 0


# ---------------------------------------------------------------------------
# dmesg


def test_dmesg_monotonic_stamps_and_multiline_record() -> None:
    records = read_fixture("dmesg.txt")
    assert_kernel_messages(records)
    assert records[0].monotonic == FIRST_MONOTONIC and records[0].wall is None
    fallen = by_message(records, FALLEN_OFF)
    assert len(fallen.raw) == 3 and fallen.raw[1].startswith("               NVRM:")
    tab = next(record for record in records if "Faulty UTCL2" in record.message)
    assert tab.message == "amdgpu 0000:c2:00.0: amdgpu: \t Faulty UTCL2 client ID: TCP (0x8)"


def test_dmesg_x_decodes_facility_and_level() -> None:
    records = read_fixture("dmesg-x.txt")
    assert_kernel_messages(records)
    assert by_message(records, PAGE_FAULT).priority == 3
    assert by_message(records, "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!").priority == 4
    assert records[0].priority == 6 and records[0].fields["facility"] == "user"
    assert records[0].monotonic == FIRST_MONOTONIC
    assert len(by_message(records, FALLEN_OFF).raw) == 3


def test_dmesg_raw_priority_prefix() -> None:
    records = read_fixture("dmesg-raw.txt")
    assert_kernel_messages(records)
    assert by_message(records, PAGE_FAULT).priority == 3
    assert records[0].monotonic == FIRST_MONOTONIC


def test_dmesg_ctime_is_local_wall_time(berlin: None) -> None:
    records = read_fixture("dmesg-T.txt")
    assert_kernel_messages(records)
    assert records[0].wall == FIRST_WALL
    assert records[0].monotonic is None and records[0].relative is None
    assert len(by_message(records, FALLEN_OFF).raw) == 3


def test_dmesg_ctime_from_the_corpus(berlin: None) -> None:
    records = list(parse_kernel_lines(corpus_lines("lemonade122")))
    assert records[0].message == "amdgpu 0000:c4:00.0: MES failed to respond to msg=REMOVE_QUEUE"
    assert records[0].wall == datetime(2026, 7, 10, 18, 23, 53, tzinfo=UTC).timestamp()  # CEST
    assert records[-1].wall is not None and records[-1].wall - records[0].wall == 4


def test_dmesg_ctime_in_a_foreign_locale_keeps_order_not_wall() -> None:
    """German `dmesg -T` ([Di, 12. Aug 2025, 00:08:06]): no wall clock, but day and time of day."""
    records = list(parse_kernel_lines(corpus_lines("rocm5151")))
    assert len(records) == 9
    assert all(record.wall is None for record in records)
    assert {record.relative for record in records} == {12 * 86400 + 8 * 60 + 6.0}
    assert (
        records[0].message == "amdgpu 0000:c3:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32810)"
    )
    french = list(parse_kernel_lines(["[mar. 12 août 2025 00:08:07] amdgpu: x"]))
    assert french[0].relative == 12 * 86400 + 8 * 60 + 7.0 and french[0].message == "amdgpu: x"


def test_dmesg_reltime_deltas_accumulate() -> None:
    records = read_fixture("dmesg-reltime.txt")
    assert_kernel_messages(records)
    assert all(record.relative is not None for record in records)
    relatives = [record.relative or 0.0 for record in records]
    assert relatives == sorted(relatives)
    assert relatives[1] - relatives[0] == pytest.approx(0.002387)
    header = next(record for record in records if record.raw[0].startswith("[Nov30 12:24]"))
    assert header.relative == (30 * 24 + 12) * 3600 + 24 * 60


def test_dmesg_reltime_from_the_corpus() -> None:
    records = list(parse_kernel_lines(corpus_lines("rocm2429")))
    base = (19 * 24 + 10) * 3600.0 + 33 * 60
    assert records[0].relative == base
    assert records[1].relative == pytest.approx(base + 0.000388)
    assert records[1].message == "amdgpu: failed to remove hardware queue from MES, doorbell=0x1002"
    deltas_only = list(parse_kernel_lines(corpus_lines("returnn1486")))  # an excerpt with no header
    assert deltas_only[0].relative == pytest.approx(0.000316)
    assert deltas_only[0].message == "pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0"


def test_dmesg_iso_time_format() -> None:
    records = read_fixture("dmesg-iso.txt")
    assert_kernel_messages(records)
    assert records[0].wall == pytest.approx(FIRST_WALL + 0.227735)
    assert len(by_message(records, FALLEN_OFF).raw) == 3


def test_dmesg_continuation_lines_from_the_corpus() -> None:
    nvsentinel = list(parse_kernel_lines(corpus_lines("nvidia-nvsentinel155")))
    assert len(nvsentinel) == 3
    assert nvsentinel[0].message == (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands."
    )
    assert nvsentinel[0].monotonic == 1843.308145 and len(nvsentinel[0].raw) == 3
    xid = list(parse_kernel_lines(corpus_lines("quadrants589")))  # bare lines, no stamps at all
    assert len(xid) == 2
    assert xid[0].message.splitlines()[1:] == [
        "MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x70a2_c8000000.",
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    ]


def test_bare_lines_keep_order_only() -> None:
    records = list(parse_kernel_lines(corpus_lines("rocm5999"), "paste.txt"))
    assert len(records) == 19
    assert [record.index for record in records] == list(range(19))
    assert all(record.monotonic is None and record.wall is None and record.relative is None for record in records)
    assert (
        records[3].message
        == "amdgpu 0000:04:00.0: amdgpu:  Process gnome-shell pid 2743 thread gnome-shel:cs0 pid 2775"
    )
    assert records[0].origin == "paste.txt"


def test_dmesg_messages_that_look_like_syslog_tags_stay_kernel_messages() -> None:
    lines = [
        "[    2.1] usb 1-1: new high-speed USB device number 2",
        "[    2.2] systemd[1]: Detected virtualization kvm.",
    ]
    records = list(parse_kernel_lines(lines))
    assert [record.message for record in records] == [line.split("] ", 1)[1] for line in lines]


# ---------------------------------------------------------------------------
# journalctl text modes


def test_journal_short_skips_other_programs(berlin: None) -> None:
    stats = KernelParseStats()
    records = read_fixture("journal-short.txt", stats)
    assert_kernel_messages(records)
    assert records[0].wall == FIRST_WALL and records[0].fields["_HOSTNAME"] == "vm"
    # python, torchrun, kernel-lookalike, 2x triage-capture, journald's "Journal stopped", and its
    # "Received client request" line, which went through /dev/kmsg (the json form knows, the text cannot)
    assert stats.other_programs == 7
    assert len(by_message(records, FALLEN_OFF).raw) == 3


def test_journal_short_from_the_corpus() -> None:
    records = list(parse_kernel_lines(corpus_lines("pt75642"), reference_year=2024))
    assert len(records) == 12
    assert records[3].message == "amdgpu 0000:2f:00.0: amdgpu: GPU reset begin!"
    assert records[0].message.startswith("[drm:amdgpu_dm_atomic_commit_tail [amdgpu]] *ERROR*")
    assert time.localtime(records[0].wall or 0).tm_year == 2024
    faults = list(parse_kernel_lines(corpus_lines("cachyos960"), reference_year=2025))
    assert faults[0].message == "amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031"


def test_journal_without_hostname() -> None:
    """`journalctl -k --no-hostname` and `-o short-monotonic --no-hostname`."""
    lines = [
        "Nov 30 12:23:56 kernel: amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "Nov 30 12:23:57 python[12]: RuntimeError: HIP error",
        "[  925.227735] kernel: triage-capture: begin",
    ]
    stats = KernelParseStats()
    records = list(parse_kernel_lines(lines, reference_year=2026, stats=stats))
    assert [record.message for record in records] == [
        "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "triage-capture: begin",
    ]
    assert "_HOSTNAME" not in records[0].fields and records[1].monotonic == FIRST_MONOTONIC
    assert stats.other_programs == 1


def test_journal_short_year_moves_on_at_new_year() -> None:
    lines = ["Dec 31 23:59:59 h kernel: a", "Jan  1 00:00:01 h kernel: b"]
    first, second = parse_kernel_lines(lines, reference_year=2025)
    assert first.wall is not None and second.wall is not None
    assert second.wall - first.wall == 2


def test_journal_short_iso(berlin: None) -> None:
    records = read_fixture("journal-short-iso.txt")
    assert_kernel_messages(records)
    assert records[0].wall == FIRST_WALL


def test_journal_short_precise(berlin: None) -> None:
    records = read_fixture("journal-short-precise.txt")
    assert_kernel_messages(records)
    assert records[0].wall == pytest.approx(FIRST_WALL + 0.261359)


def test_journal_short_monotonic() -> None:
    stats = KernelParseStats()
    records = read_fixture("journal-short-monotonic.txt", stats)
    assert_kernel_messages(records)
    assert records[0].monotonic == FIRST_MONOTONIC
    assert stats.other_programs == 7


def test_journal_short_full(berlin: None) -> None:
    records = read_fixture("journal-short-full.txt")
    assert_kernel_messages(records)
    assert records[0].wall == FIRST_WALL


def test_journal_markers_are_skipped_and_name_the_boot() -> None:
    lines = [
        "-- Boot 0123456789abcdef0123456789abcdef --",
        "Nov 30 12:23:56 vm kernel: amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "-- No entries --",
    ]
    stats = KernelParseStats()
    records = list(parse_kernel_lines(lines, reference_year=2026, stats=stats))
    assert len(records) == 1 and records[0].boot_id == "0123456789abcdef0123456789abcdef"
    assert stats.blank == 2


# ---------------------------------------------------------------------------
# journal json and export


def test_journal_json(berlin: None) -> None:
    stats = KernelParseStats()
    records = read_fixture("journal-json.json", stats)
    assert_kernel_messages(records)
    first = records[0]
    assert first.monotonic == FIRST_MONOTONIC  # _SOURCE_MONOTONIC_TIMESTAMP, the kernel's own stamp
    assert first.wall == 1796037836.261359  # __REALTIME_TIMESTAMP, when journald took it in
    assert first.boot_id == "c958f77ee03041dea561960089bcebc0" and first.priority == 6
    assert first.fields["__MONOTONIC_TIMESTAMP"] == "925236472"
    assert by_message(records, FALLEN_OFF).raw == FALLEN_OFF.split("\n")
    blob = next(record for record in records if "non-ASCII" in record.message)  # MESSAGE as a byte list
    assert blob.message == "triage-capture: non-ASCII é, backslash \\, bad byte \ufffd, control \x01 end"
    assert stats.other_programs == 6 and stats.bad_encoding == 1  # journald's kmsg lines are _TRANSPORT=kernel


def test_journal_json_seq_and_broken_lines() -> None:
    entry = {"_TRANSPORT": "kernel", "MESSAGE": "amdgpu: x", "__REALTIME_TIMESTAMP": "1000000"}
    stats = KernelParseStats()
    lines = ["\x1e" + json.dumps(entry), '{"MESSAGE": "cut', json.dumps({"_TRANSPORT": "kernel"})]
    records = list(parse_kernel_lines(lines, stats=stats))
    assert [record.message for record in records] == ["amdgpu: x"] and records[0].wall == 1.0
    assert stats.unparsed == 2


def test_journal_export_matches_json() -> None:
    stats = KernelParseStats()
    with open(DATA / "journal-export.export", "rb") as stream:
        exported = list(parse_journal_export(stream, "export", stats=stats))
    from_json = read_fixture("journal-json.json")

    def view(record: KernelRecord) -> tuple[object, ...]:
        return (record.message, record.monotonic, record.wall, record.priority, record.boot_id, record.fields)

    assert [view(record) for record in exported] == [view(record) for record in from_json]
    assert stats.other_programs == 6
    assert [view(record) for record in read_fixture("journal-export.export")] == [view(record) for record in exported]


def test_journal_export_binary_fields() -> None:
    """MESSAGE with a newline or invalid UTF-8 is a binary field: name, le64 size, bytes."""
    records = read_fixture("journal-export.export")
    assert by_message(records, FALLEN_OFF).monotonic is not None
    assert any("bad byte \ufffd" in record.message for record in records)


def test_journal_export_cut_short_or_oversized() -> None:
    big = b"x" * (MAX_LINE_BYTES + 10)
    stream = (
        b"_TRANSPORT=kernel\nMESSAGE\n" + len(big).to_bytes(8, "little") + big + b"\n\n_TRANSPORT=kernel\nMESSAGE\n\x05"
    )
    stats = KernelParseStats()
    records = list(parse_journal_export(io.BytesIO(stream), stats=stats))
    assert len(records) == 1 and len(records[0].message) == MAX_LINE_BYTES
    assert stats.truncated == 1 and stats.unparsed == 1


def test_journal_live_user_space_kmsg_records_read_as_dmesg_shows_them() -> None:
    """journald splits `ident:` off user-facility /dev/kmsg records: it is put back."""
    for name in ("journal-live.json", "journal-live.export"):
        records = read_fixture(name)
        assert_kernel_messages(records)
        assert by_message(records, XID_79).fields["SYSLOG_FACILITY"] == "1"
        assert any(record.message.startswith("systemd-journald[") for record in records)


# ---------------------------------------------------------------------------
# syslog kern.log


def test_kern_log_traditional_has_wall_and_monotonic(berlin: None) -> None:
    records = read_fixture("kern.log")
    assert records[0].wall == FIRST_WALL and records[0].monotonic == FIRST_MONOTONIC
    # rsyslog splits a multi-line record into lines with one stamp each
    assert [record.message for record in records if record.message.startswith("NVRM:")] == [
        *FALLEN_OFF.split("\n"),
        XID_79,
    ]
    assert all(record.fields["_HOSTNAME"] == "vm" for record in records)


def test_kern_log_rfc3339() -> None:
    records = read_fixture("kern-rfc3339.log")
    assert records[0].wall == pytest.approx(FIRST_WALL + 0.261499)
    assert records[0].monotonic == FIRST_MONOTONIC
    assert by_message(records, PAGE_FAULT).monotonic == 925.231257


# ---------------------------------------------------------------------------
# clocks


def test_boot_time_from_journal_and_kern_log() -> None:
    journal = boot_time_from(read_fixture("journal-json.json"))
    assert journal is not None
    expected = 1796037836.261359 - 925.236472  # realtime minus journald's own monotonic stamp
    assert journal == pytest.approx(expected, abs=0.01)
    syslog = boot_time_from(read_fixture("kern-rfc3339.log"))  # rsyslog's receive time minus the kernel's stamp
    assert syslog == pytest.approx(journal, abs=0.5)
    assert boot_time_from(read_fixture("dmesg.txt")) is None


# ---------------------------------------------------------------------------
# robustness


def test_mixed_forms_in_one_input(berlin: None) -> None:
    lines = [
        "[  501.631399] amdgpu 0000:67:00.0: VM_L2_PROTECTION_FAULT_STATUS:0xFFFFFFFF",
        "Nov 30 12:23:56 vm kernel: amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "Nov 30 12:23:57 vm python[12]: Traceback (most recent call last):",
        '    File "train.py", line 1',
        "11,345,363730041,-;NVRM: Xid (PCI:0000:0a:00): 79",
    ]
    stats = KernelParseStats()
    records = list(parse_kernel_lines(lines, reference_year=2026, stats=stats))
    assert [record.message for record in records] == [
        "amdgpu 0000:67:00.0: VM_L2_PROTECTION_FAULT_STATUS:0xFFFFFFFF",
        "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "NVRM: Xid (PCI:0000:0a:00): 79",
    ]
    assert stats.other_programs == 2  # the python line and its indented continuation


def test_crlf_and_chunks_of_several_lines() -> None:
    records = list(parse_kernel_lines(["[ 1.000000] a\r\n", "[ 2.000000] b\r\n[ 3.000000] c\r\n"]))
    assert [record.message for record in records] == ["a", "b", "c"]
    assert records[0].raw == ["[ 1.000000] a"]


class _Endless(io.RawIOBase):
    """A stream of `size` bytes of one long line, made as it is read (never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.left <= 0:
            return 0
        count = min(len(buffer), self.left)
        buffer[:count] = b"a" * count
        self.left -= count
        if self.left == 0:
            buffer[count - 1 : count] = b"\n"
        return count


def test_a_100_mb_line_is_cut_and_counted_in_bounded_memory() -> None:
    stats = KernelParseStats()
    stream = io.BufferedReader(_Endless(100 * 1024 * 1024), buffer_size=1 << 16)
    tracemalloc.start()
    records = list(read_kernel_stream(stream, stats=stats))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert stats.truncated == 1 and len(records) == 1
    assert len(records[0].message) == MAX_LINE_BYTES
    assert peak < 8 * MAX_LINE_BYTES


def test_invalid_utf8_is_replaced_and_counted() -> None:
    stats = KernelParseStats()
    records = list(read_kernel_stream(io.BytesIO(b"[ 1.0] amdgpu \xff\xfe x\n"), stats=stats))
    assert records[0].message == "amdgpu \ufffd\ufffd x" and stats.bad_encoding == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_no_bytes_make_read_kernel_stream_raise(data: bytes) -> None:
    for prefix in (b"", b"__CURSOR=x\n", b"6,1,2,-;"):
        stats = KernelParseStats()
        records = list(read_kernel_stream(io.BytesIO(prefix + data), stats=stats))
        assert stats.records == len(records)


_FORM_STARTS = [
    "",
    " ",
    "\t",
    "[  12.5] ",
    "[  +0.1] ",
    "[Nov19 10:33] ",
    "[Mon Nov 30 12:23:56 2026] ",
    "[Di, 12. Aug 2025, 00:08:06] ",
    "kern  :err   : ",
    "<3>",
    "Nov 30 12:23:56 vm kernel: ",
    "Nov 30 12:23:56 vm python[1]: ",
    "2026-11-30T12:23:56,5+01:00 ",
    "Mon 2026-11-30 12:23:56 CET vm kernel: ",
    "1796037836.261359 vm kernel: ",
    "6,1,2,-;",
    " SUBSYSTEM=",
    "{",
    '{"_TRANSPORT": "kernel", "MESSAGE": ',
    "-- Boot 0123456789abcdef0123456789abcdef --",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FORM_STARTS), st.text(alphabet=st.characters(), max_size=80)), max_size=30))
def test_no_text_makes_parse_kernel_lines_raise(parts: list[tuple[str, str]]) -> None:
    text = "".join(start + body + ("\r\n" if len(body) % 3 == 0 else "\n") for start, body in parts)
    stats = KernelParseStats()
    records = list(parse_kernel_lines(text.split("\n"), stats=stats))
    assert stats.records == len(records)
    records = list(parse_kernel_lines([text], stats=KernelParseStats()))
    assert all(record.message is not None for record in records)


def test_every_dmesg_form_of_a_real_h200_boot_agrees() -> None:
    """Another capture (tests/data/cuda: an H200 node with Xid 43 and 31): every form, the same records."""
    cuda = DATA.parent / "cuda"
    names = ["kernel-kmsg.txt", "kernel-dmesg.txt", "kernel-dmesg-x.txt", "kernel-dmesg-r.txt", "kernel-dmesg-T.txt"]
    if not all((cuda / name).exists() for name in names):
        pytest.skip("tests/data/cuda not present")
    forms = {}
    for name in names:
        with open(cuda / name, "rb") as stream:
            forms[name] = list(read_kernel_stream(stream, name))
    kmsg = forms.pop("kernel-kmsg.txt")
    xids = [record.message for record in kmsg if "NVRM: Xid" in record.message]
    assert len(xids) == 5
    for name, records in forms.items():
        assert [record.message for record in records] == [record.message for record in kmsg], name
    for name in ("kernel-dmesg.txt", "kernel-dmesg-x.txt", "kernel-dmesg-r.txt"):
        assert [record.monotonic for record in forms[name]] == [record.monotonic for record in kmsg], name
