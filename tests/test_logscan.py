"""The incremental program-log scanner: same failures however the bytes arrive."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.engine import Engine
from triage.logscan import MAX_LINE, ProgramLogScanner
from triage.model import ProgramFailure

LOG = (
    b"[INFO|2026-11-30 10:56:40,001] llamafactory.train: step 100 loss 1.23\n"
    b" 10%|#         | 10/100 [00:01<00:09, 9.1it/s]\r 20%|##        | 20/100 [00:02<00:08, 9.2it/s]\r"
    b"Traceback (most recent call last):\n"
    b'  File "/work/train.py", line 12, in <module>\n'
    b"    main()\n"
    b'  File "/work/train.py", line 8, in main\n'
    b"    loss.backward()\n"
    b"torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 7 has a total capacity of 287.98 GiB\n"
    b"{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
    b"Memory access fault by GPU node-2 (Agent handle: 0x580db0) on address 0x18000. "
    b"Reason: Page not present or supervisor privilege.\n"
    b"Aborted (core dumped)\n"
)


def summary(failures: list[ProgramFailure]) -> list[tuple[object, ...]]:
    return [(f.category, f.exception_type, f.message, f.line_number, f.time, tuple(f.lines)) for f in failures]


def scan_in_pieces(engine: Engine, data: bytes, cuts: list[int]) -> list[ProgramFailure]:
    scanner = ProgramLogScanner(engine.program_rules, origin="t.log", prefilter=engine.prefilter)
    failures: list[ProgramFailure] = []
    previous = 0
    for cut in [*sorted(cuts), len(data)]:
        failures += scanner.feed(data[previous:cut])
        previous = cut
    return failures + scanner.finish()


def test_whole_log(engine: Engine) -> None:
    failures = scan_in_pieces(engine, LOG, [])
    categories = [f.category for f in failures]
    assert "oom" in categories
    assert "illegal_memory_access" in categories
    oom = next(f for f in failures if f.category == "oom")
    assert oom.exception_type == "torch.OutOfMemoryError"
    assert oom.time == dt.datetime(2026, 11, 30, 10, 56, 40, 1000).timestamp()
    assert oom.time_source == "last_stamp"


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_every_byte_boundary_assembles_the_same(engine: Engine, newline: bytes) -> None:
    log = LOG.replace(b"\n", newline)
    expected = summary(scan_in_pieces(engine, log, []))
    for cut in range(1, len(log)):
        assert summary(scan_in_pieces(engine, log, [cut])) == expected, f"split at byte {cut}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(LOG) - 1), max_size=12, unique=True))
def test_any_chunking_assembles_the_same(engine: Engine, cuts: list[int]) -> None:
    assert summary(scan_in_pieces(engine, LOG, cuts)) == summary(scan_in_pieces(engine, LOG, []))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=5))
def test_no_bytes_make_the_scanner_raise(engine: Engine, data: bytes, cuts: list[int]) -> None:
    scan_in_pieces(engine, data, [c for c in cuts if c <= len(data)])


def test_crlf_and_bare_cr_lines(engine: Engine) -> None:
    crlf = LOG.replace(b"\n", b"\r\n")
    assert [f.category for f in scan_in_pieces(engine, crlf, [])] == [
        f.category for f in scan_in_pieces(engine, LOG, [])
    ]


def test_over_long_line_is_capped_and_what_follows_is_kept(engine: Engine) -> None:
    scanner = ProgramLogScanner(engine.program_rules, prefilter=engine.prefilter)
    junk = b"x" * (MAX_LINE * 3)
    failures = []
    for start in range(0, len(junk), 10000):
        failures += scanner.feed(junk[start : start + 10000])
    failures += scanner.feed(b"\n" + LOG)
    failures += scanner.finish()
    assert scanner.stats.long_lines == 1
    assert "oom" in [f.category for f in failures]
    assert len(scanner._carry) <= MAX_LINE


def test_stamp_far_before_a_traceback_is_found_in_skipped_text(engine: Engine) -> None:
    filler = b"".join(b"{'loss': 1.0, 'epoch': %d}\n" % i for i in range(200000))  # ~5 MB, no stamps
    data = b"2026-11-30 08:00:00,000 - INFO - start\n" + filler + LOG.split(b"\n", 1)[1]
    failures = scan_in_pieces(engine, data, list(range(1 << 20, len(data), 1 << 20)))
    oom = next(f for f in failures if f.category == "oom")
    assert oom.time == dt.datetime(2026, 11, 30, 8, 0, 0).timestamp()


def test_line_numbers_count_skipped_lines(engine: Engine) -> None:
    data = b"ok\n" * 1000 + b"RuntimeError: No HIP GPUs are available\n"
    failures = scan_in_pieces(engine, data, [1500])
    assert [(f.category, f.line_number) for f in failures] == [("device_unavailable", 1001)]


def test_python_prefilter_finds_what_hyperscan_finds(engine: Engine) -> None:
    from triage.logscan import build_prefilter

    data = LOG * 3 + b"ok\n" * 5000 + LOG
    results = []
    for name in ("python", engine.prefilter.engine):
        prefilter = build_prefilter(engine.program_rules, name)
        scanner = ProgramLogScanner(engine.program_rules, prefilter=prefilter)
        found = scanner.feed(data[:7000]) + scanner.feed(data[7000:]) + scanner.finish()
        results.append(summary(found))
    assert results[0] == results[1]
    assert len(results[0]) >= 4


def test_restart_from_safe_position_loses_and_repeats_nothing(engine: Engine) -> None:
    """A daemon killed after any byte resumes at safe_position(): the failures it had
    stored plus those of the resumed scan are exactly those of one uninterrupted scan."""
    expected = summary(scan_in_pieces(engine, LOG, []))
    for cut in range(1, len(LOG)):
        first = ProgramLogScanner(engine.program_rules, origin="t.log", prefilter=engine.prefilter)
        stored = first.feed(LOG[:cut])
        offset, line = first.safe_position()
        assert offset <= cut
        second = ProgramLogScanner(
            engine.program_rules, origin="t.log", prefilter=engine.prefilter, start_offset=offset, start_line=line
        )
        second.last_stamp = first.last_stamp  # the daemon keeps it with the position
        resumed = second.feed(LOG[offset:]) + second.finish()
        assert summary(stored + resumed) == expected, f"killed after byte {cut}"


def test_live_unstamped_lines_take_the_read_time_once_the_last_stamp_is_stale(engine: Engine) -> None:
    now = [1_800_000_000.0]
    scanner = ProgramLogScanner(engine.program_rules, prefilter=engine.prefilter, read_time=lambda: now[0])
    scanner.feed(b"2026-11-30 10:00:00,000 - INFO - step 1\n")
    burst = scanner.feed(b"RuntimeError: No HIP GPUs are available\nok\n")  # same burst: the stamp dates it
    now[0] += 3600  # an hour of silence, then the crash
    later = scanner.feed(b"RuntimeError: HIP error: invalid device function\nok\n") + scanner.finish()
    assert [(f.time_source, f.time) for f in burst] == [("last_stamp", dt.datetime(2026, 11, 30, 10, 0, 0).timestamp())]
    assert [(f.time_source, f.time) for f in later] == [("read", now[0])]
