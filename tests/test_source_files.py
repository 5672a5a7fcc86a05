"""The training-log file source against real files, the real inotify observer and a real logrotate.

Every test writes real files in a temporary directory the way a training job and logrotate
do, runs the source's own thread and watchdog observer, and checks what reached the sink:
each failure exactly once and whole, and positions that neither lose nor repeat a line.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.support.batches import Collector
from tests.support.files import (
    ROTATOR,
    failures,
    positions,
    read_child_output,
    rotate,
    split_lines,
    stored,
    summary,
    traceback,
    wait_read,
)
from triage.engine import Engine
from triage.sources import Batch
from triage.sources import files as files_module
from triage.sources.files import FileSource, GlobSet, WatchRoot, key_for

DTYPE = traceback("dtype_mismatch")  # 15 lines, RuntimeError, dtype_config
OOM = traceback("cpu_oom")  # 6 lines, RuntimeError, oom
HALF = traceback("not_implemented_half")  # 6 lines, NotImplementedError, missing_op
DTYPE_HEAD, DTYPE_REST = split_lines(DTYPE, 6)
WHOLE_DTYPE = ("RuntimeError", "dtype_config", 15)

Start = Callable[..., tuple[FileSource, Collector]]


def step(n: int) -> bytes:
    """A Trainer log line: it ends an exception message (a plain line would continue it)."""
    return b"{'loss': 1.25, 'grad_norm': 0.5, 'epoch': %d}\n" % n


@pytest.fixture
def start(engine: Engine) -> Iterator[Start]:
    """Start a FileSource on globs with a Collector sink; every source is stopped at the end."""
    sources: list[FileSource] = []

    def run(globs: list[str], collector: Collector | None = None, **options: Any) -> tuple[FileSource, Collector]:
        options.setdefault("first_start", True)
        options.setdefault("quiet_flush", 0.5)
        sink = collector or Collector()
        source = FileSource(engine, globs, **options)
        source.start(sink)
        sources.append(source)
        return source, sink

    yield run
    for source in sources:
        source.stop()


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as log:
        log.write(data)


def shape(collector: Collector) -> list[tuple[str | None, str, int]]:
    """(exception type, category, line count) per failure: a fragment has fewer lines."""
    return [(f.exception_type, f.category, len(f.lines)) for f in failures(collector)]


def rss() -> int:
    """Resident set size of this process, bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def count_at_least(collector: Collector, n: int) -> Callable[[], bool]:
    return lambda: len(failures(collector)) >= n


# -- live reading ------------------------------------------------------------------


def test_appended_traceback_reaches_the_sink_within_quiet_flush(tmp_path: Path, start: Start) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")], quiet_flush=0.5)
    written = time.time()
    append(log, DTYPE)  # the process died: nothing follows the traceback's last line
    assert sink.wait_for(count_at_least(sink, 1), timeout=5.0)
    latency = time.time() - written
    assert latency < 0.5 + 0.5, f"{latency:.2f} s from the last line written to the sink"
    (failure,) = failures(sink)
    assert (failure.exception_type, failure.category, len(failure.lines)) == WHOLE_DTYPE
    assert failure.origin == str(log) and failure.line_number == 1
    assert failure.time_source == "read" and failure.time is not None and abs(failure.time - written) < 2.0
    position = positions(sink)[key_for(str(log))]
    assert position["offset"] == len(DTYPE) and position["line"] == 15
    assert position["hash"] == hashlib.sha256(DTYPE[-4096:]).hexdigest()
    assert (position["dev"], position["inode"]) == (log.stat().st_dev, log.stat().st_ino)
    health = source.health()
    assert health.alive and health.records == len(DTYPE) and health.detail["records_unit"] == "bytes"
    assert health.detail["lines"] == 15 and health.skipped == 0 and health.lag == 0.0


@pytest.mark.parametrize("from_end", [True, False], ids=["from_end", "from_start"])
def test_existing_file_on_first_start_is_read_from_its_end(tmp_path: Path, start: Start, from_end: bool) -> None:
    """The old traceback of a file that predates the very first start is history, not news;
    a last line being written when the daemon starts is read whole; line numbers are the file's."""
    log = tmp_path / "train.log"
    old = step(1) + OOM + step(2)
    log.write_bytes(old + b"RuntimeError: No HIP GPUs are avail")
    _, sink = start([str(tmp_path / "*.log")], existing_from_end=from_end)
    append(log, b"able\n" + DTYPE)
    expected = [("RuntimeError", "device_unavailable", 1), WHOLE_DTYPE]
    if not from_end:
        expected.insert(0, ("RuntimeError", "oom", 6))
    assert sink.wait_for(count_at_least(sink, len(expected)), timeout=5.0)
    time.sleep(0.2)
    assert shape(sink) == expected
    assert failures(sink)[-1].line_number == old.count(b"\n") + 2


def test_files_created_after_start_are_read_from_their_start(tmp_path: Path, start: Start) -> None:
    """New files in new nested directories, and under a glob's base directory that did not
    exist at start, are found by inotify (the rescan interval is far longer than the test)."""
    (tmp_path / "logs").mkdir()
    _, sink = start([str(tmp_path / "logs" / "**" / "*.log"), str(tmp_path / "later" / "*.log")], rescan_interval=60)
    nested = tmp_path / "logs" / "run2" / "rank0"
    nested.mkdir(parents=True)
    (nested / "train.log").write_bytes(b"starting\n" + DTYPE)
    (tmp_path / "later").mkdir()
    time.sleep(0.3)  # the new base is watched from the next pass; its first file may predate that
    (tmp_path / "later" / "eval.log").write_bytes(OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
    assert sorted(summary(sink)) == [
        ("eval.log", "RuntimeError", "oom", 1, 6),
        ("train.log", "RuntimeError", "dtype_config", 2, 15),
    ]


# -- restarts ----------------------------------------------------------------------


def test_restart_loses_nothing_and_repeats_nothing(tmp_path: Path, start: Start) -> None:
    """Stopped with a traceback half read: its position is the traceback's start, so the next
    run reads it again whole (the only bytes read twice) and reports it once."""
    log = tmp_path / "train.log"
    log.write_bytes(b"old\n" + HALF)  # before the first start: not reported
    first, sink1 = start([str(tmp_path / "*.log")], quiet_flush=30)
    head = step(1) + OOM + step(2)
    append(log, head + DTYPE_HEAD)
    assert sink1.wait_for(count_at_least(sink1, 1), timeout=5.0)
    assert wait_read(first, log)
    first.stop()
    saved = stored(sink1)
    half_start = len(b"old\n" + HALF + head)
    assert saved[key_for(str(log))]["offset"] == half_start
    assert saved[key_for(str(log))]["line"] == (b"old\n" + HALF + head).count(b"\n")

    append(log, DTYPE_REST + step(3) + HALF)
    second, sink2 = start([str(tmp_path / "*.log")], positions=saved, first_start=False)
    assert sink2.wait_for(count_at_least(sink2, 2), timeout=5.0)
    time.sleep(0.2)
    oom_line = (b"old\n" + HALF).count(b"\n") + 2
    assert summary(sink1) + summary(sink2) == [
        ("train.log", "RuntimeError", "oom", oom_line, 6),
        ("train.log", "RuntimeError", "dtype_config", oom_line + 7, 15),
        ("train.log", "NotImplementedError", "missing_op", oom_line + 7 + 16, 6),
    ]
    assert first.health().records == len(head + DTYPE_HEAD)
    assert second.health().records == log.stat().st_size - half_start


def test_sigkill_mid_stream_loses_nothing_and_repeats_nothing(tmp_path: Path, engine: Engine) -> None:
    """The source in a child process commits each batch (failures with their positions) to a
    file and is SIGKILLed with a traceback half read; a restart from what was committed
    reports every failure exactly once."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    out = tmp_path / "committed.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.files", str(tmp_path / "*.log"), str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        append(log, step(1) + OOM + step(2) + DTYPE_HEAD)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not read_child_output(out)[0]:
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    committed, saved = read_child_output(out)
    assert [failure[2:] for failure in committed] == [["RuntimeError", "oom", 6]]
    assert saved[key_for(str(log))]["offset"] == len(step(1) + OOM + step(2))

    append(log, DTYPE_REST + HALF)
    sink = Collector()
    source = FileSource(engine, [str(tmp_path / "*.log")], positions=saved, first_start=False, quiet_flush=0.5)
    source.start(sink)
    try:
        assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
        time.sleep(0.2)
        assert shape(sink) == [WHOLE_DTYPE, ("NotImplementedError", "missing_op", 6)]
        assert source.health().records == log.stat().st_size - saved[key_for(str(log))]["offset"]
    finally:
        source.stop()


def test_rotated_while_stopped_the_rest_is_read_from_the_renamed_file(tmp_path: Path, start: Start) -> None:
    """logrotate renamed the log while the daemon was down, after more was written to it: the
    saved file is found by its inode in its directory (train.log.1), its rest is read from
    the saved offset, then it is forgotten; the new train.log is read from 0."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    first, sink1 = start([str(tmp_path / "*.log")])
    append(log, step(1) + OOM + step(2))
    assert sink1.wait_for(count_at_least(sink1, 1), timeout=5.0)
    first.stop()
    append(log, DTYPE + step(3))
    rotate(log, "create", tmp_path)
    append(log, HALF + step(1))
    second, sink2 = start([str(tmp_path / "*.log")], positions=stored(sink1), first_start=False, detached_quiet=0.5)
    assert sink2.wait_for(count_at_least(sink2, 2), timeout=5.0)
    rotated = key_for(str(tmp_path / "train.log.1"))
    assert sink2.wait_for(lambda: positions(sink2).get(rotated, 1) is None, timeout=5.0)
    assert sorted(summary(sink2)) == [
        ("train.log", "NotImplementedError", "missing_op", 1, 6),
        ("train.log.1", "RuntimeError", "dtype_config", 9, 15),  # where those lines are now
    ]
    assert second.health().records == len(DTYPE + step(3) + HALF + step(1))
    assert list(stored(sink2)) == [key_for(str(log))]


@pytest.mark.parametrize("change", ["inode_reused", "truncated", "rewritten_same_size"])
def test_a_different_file_under_a_saved_position_is_read_from_its_start(
    tmp_path: Path, start: Start, change: str
) -> None:
    """While the daemon was down the file was replaced (a new file that got the old inode),
    truncated (copytruncate), or rewritten to the same size: the hash of the bytes before the
    saved offset no longer matches, so the file is read from 0, not from the stale offset."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    first, sink1 = start([str(tmp_path / "*.log")])
    old = step(1) + OOM + b"x" * 1500 + b"\n"
    append(log, old)
    assert sink1.wait_for(count_at_least(sink1, 1), timeout=5.0)
    first.stop()
    saved = stored(sink1)
    inode = saved[key_for(str(log))]["inode"]
    new = {
        "inode_reused": HALF + step(9) + b"y" * 2000 + b"\n",
        "truncated": HALF,
        "rewritten_same_size": HALF + step(9) + b"z" * (len(old) - len(HALF) - len(step(9)) - 1) + b"\n",
    }[change]
    if change == "inode_reused":
        for _ in range(50):  # ext4 and xfs hand a freed inode to the next file; tmpfs does not
            log.unlink()
            log.write_bytes(new)
            if log.stat().st_ino == inode:
                break
        else:  # the same state, made by hand: the saved position names the new file's inode
            saved[key_for(str(log))]["inode"] = log.stat().st_ino
        assert len(new) > len(old)
    else:
        with log.open("r+b") as f:
            f.truncate(0)
            f.write(new)
        assert log.stat().st_ino == inode
    assert (len(new) == len(old)) == (change == "rewritten_same_size")
    second, sink2 = start([str(tmp_path / "*.log")], positions=saved, first_start=False)
    assert sink2.wait_for(count_at_least(sink2, 1), timeout=5.0)
    assert shape(sink2) == [("NotImplementedError", "missing_op", 6)]
    assert failures(sink2)[0].line_number == 1
    assert second.health().records == len(new)


# -- rotation ----------------------------------------------------------------------


def test_rename_rotation_lines_written_to_the_old_descriptor(tmp_path: Path, start: Start) -> None:
    """logrotate `create` (the real binary when installed, see ROTATOR) while a traceback is half written, and the writer keeps its
    descriptor (no postrotate signal): the rest lands in train.log.1 and is read from there,
    so the traceback is whole; the new train.log is read from 0; the renamed file's position
    is dropped once it has been quiet."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")], quiet_flush=2.0, detached_quiet=1.0)
    with log.open("ab", buffering=0) as writer:
        writer.write(step(1) + DTYPE_HEAD)
        assert wait_read(source, log)
        rotate(log, "create", tmp_path)
        writer.write(DTYPE_REST + step(2))
    append(log, b"resumed\n" + OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=6.0)
    rotated = key_for(str(tmp_path / "train.log.1"))
    assert sink.wait_for(lambda: positions(sink).get(rotated, 1) is None, timeout=5.0)
    assert sorted(summary(sink)) == [
        ("train.log", "RuntimeError", "dtype_config", 2, 15),
        ("train.log", "RuntimeError", "oom", 2, 6),
    ]
    final = stored(sink)
    assert list(final) == [key_for(str(log))]
    assert final[key_for(str(log))]["inode"] == log.stat().st_ino
    assert final[key_for(str(log))]["offset"] == log.stat().st_size
    assert (tmp_path / "train.log.1").read_bytes() == step(1) + DTYPE + step(2)


def test_rename_rotation_writer_reopens_the_new_file(tmp_path: Path, start: Start) -> None:
    """logrotate `create` (the real binary when installed, see ROTATOR) while a traceback is half written, and the writer reopens its
    log (a postrotate signal, WatchedFileHandler): the rest is at the start of the new
    train.log. The new file continues the renamed file's scanner, so the traceback is
    reported once and whole, not as two fragments."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")], quiet_flush=2.0, detached_quiet=1.0)
    append(log, step(1) + DTYPE_HEAD)
    assert wait_read(source, log)
    rotate(log, "create", tmp_path)
    append(log, DTYPE_REST + step(2) + OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=6.0)
    time.sleep(0.3)
    assert summary(sink) == [
        ("train.log", "RuntimeError", "dtype_config", 2, 15),
        ("train.log", "RuntimeError", "oom", 11, 6),
    ]
    assert sink.wait_for(lambda: list(stored(sink)) == [key_for(str(log))], timeout=5.0)
    assert stored(sink)[key_for(str(log))]["offset"] == log.stat().st_size


def test_copytruncate_in_the_middle_of_a_traceback(tmp_path: Path, start: Start) -> None:
    """logrotate `copytruncate` (the real binary when installed): the traceback's first half goes to the copy,
    train.log.1, and the writer (O_APPEND) writes the rest at offset 0 of the truncated file.
    The same scanner goes on reading, so the traceback is reported once and whole."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")], quiet_flush=2.0)
    with log.open("ab", buffering=0) as writer:
        writer.write(step(1) + DTYPE_HEAD)
        assert wait_read(source, log)
        rotate(log, "copytruncate", tmp_path)
        assert log.stat().st_size == 0
        writer.write(DTYPE_REST + step(2) + OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=6.0)
    time.sleep(0.3)
    assert shape(sink) == [WHOLE_DTYPE, ("RuntimeError", "oom", 6)]
    assert failures(sink)[1].line_number == DTYPE_REST.count(b"\n") + 2  # a line of the truncated file
    assert (tmp_path / "train.log.1").read_bytes() == step(1) + DTYPE_HEAD
    assert source.health().detail["truncations"] == 1
    assert sink.wait_for(lambda: stored(sink)[key_for(str(log))]["offset"] == log.stat().st_size, timeout=3.0)


@pytest.mark.parametrize("mode", ["create", "copytruncate"], ids=lambda mode: f"{mode}-{ROTATOR}")
def test_rotation_helper_does_what_logrotate_does(tmp_path: Path, mode: str) -> None:
    """The rotations above are real: `create` renames (the inode moves to .1, a new file takes
    the name), `copytruncate` copies and truncates in place (the inode stays)."""
    log = tmp_path / "train.log"
    log.write_bytes(DTYPE_HEAD)
    inode = log.stat().st_ino
    rotate(log, mode, tmp_path)
    rotated = tmp_path / "train.log.1"
    assert rotated.read_bytes() == DTYPE_HEAD and log.read_bytes() == b""
    assert (rotated.stat().st_ino == inode) == (mode == "create")
    assert (log.stat().st_ino == inode) == (mode == "copytruncate")


def test_truncated_and_rewritten_past_the_offset_between_two_reads(tmp_path: Path, start: Start) -> None:
    """Truncation is noticed even when the file is already longer again when it is next read:
    the bytes before the read offset changed."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")])
    append(log, b"step 1\nstep 2\n")
    assert wait_read(source, log)
    with log.open("r+b") as f:
        f.truncate(0)
        f.write(b"restarted\n" + DTYPE)
    assert sink.wait_for(count_at_least(sink, 1), timeout=5.0)
    assert shape(sink) == [WHOLE_DTYPE]
    assert failures(sink)[0].line_number == 2
    assert source.health().detail["truncations"] == 1


def test_deleted_file_is_finished_and_forgotten(tmp_path: Path, start: Start) -> None:
    """Deleted while a traceback is half written: the writer's rest, written to the deleted
    file, is still read through the open descriptor; then the position is dropped."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")], quiet_flush=2.0, detached_quiet=0.5)
    with log.open("ab", buffering=0) as writer:
        writer.write(DTYPE_HEAD)
        assert wait_read(source, log)
        assert positions(sink).get(key_for(str(log))) is not None or sink.wait_for(
            lambda: key_for(str(log)) in positions(sink), timeout=3.0
        )
        log.unlink()
        writer.write(DTYPE_REST)
    assert sink.wait_for(count_at_least(sink, 1), timeout=5.0)
    assert sink.wait_for(lambda: positions(sink).get(key_for(str(log)), 1) is None, timeout=5.0)
    assert shape(sink) == [WHOLE_DTYPE]
    assert source.health().detail["files"] == {}


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize("arrival", ["appended", "whole"])
def test_100_mb_line_without_newline_is_capped_counted_and_what_follows_found(
    tmp_path: Path, start: Start, arrival: str
) -> None:
    """A 100 MB line, appended while the source reads along, or present whole when the file
    appears (renamed into the glob): memory stays at a few read buffers, the line is counted
    as skipped, and the traceback after it is found whole."""
    log = tmp_path / "train.log"
    writing = log if arrival == "appended" else tmp_path / "train.tmp"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "*.log")])
    if arrival == "whole":
        log.unlink()
    chunk = b"x" * (1 << 20)
    rss_before = rss()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with writing.open("ab") as writer:
            for _ in range(100):
                writer.write(chunk)
            writer.write(b"\n" + DTYPE)
        if arrival == "whole":
            writing.rename(log)
        assert sink.wait_for(count_at_least(sink, 1), timeout=9.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB while reading a 100 MB line"
    assert rss() - rss_before < 48 << 20, "resident memory grew with the line"
    assert shape(sink) == [WHOLE_DTYPE]
    assert failures(sink)[0].line_number == 2
    health = source.health()
    assert health.skipped == 1 and health.detail["long_lines"] == 1
    assert health.records == log.stat().st_size


def test_invalid_utf8_loses_nothing(tmp_path: Path, start: Start) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    _, sink = start([str(tmp_path / "*.log")])
    broken = DTYPE.replace(b"but got Double", b"but got \xc3\x28\xff Double")
    append(log, b"\xff\xfe\x80 binary junk \xed\xa0\x80\n" + broken + step(1) + b"\x00\x01\x02\n" + OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
    time.sleep(0.2)
    assert shape(sink) == [WHOLE_DTYPE, ("RuntimeError", "oom", 6)]
    assert "\ufffd" in failures(sink)[0].message


def test_carriage_return_progress_bars_lose_nothing(tmp_path: Path, start: Start) -> None:
    """tqdm redraws with \\r and no newline for a whole epoch; the traceback after it is found
    whole, with the line numbers the file has."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    _, sink = start([str(tmp_path / "*.log")])
    bars = b"".join(
        b"\r%3d%%|%-10s| %d/1000 [00:01<00:09, 9.1it/s]" % (i // 10, b"#" * (i // 100), i) for i in range(1000)
    )
    append(log, b"epoch 1\n" + bars + b"\n" + DTYPE + step(1) + bars + b"\r" + OOM)
    assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
    time.sleep(0.2)
    assert shape(sink) == [WHOLE_DTYPE, ("RuntimeError", "oom", 6)]
    assert failures(sink)[0].line_number == 3


# -- errors ------------------------------------------------------------------------


def test_unreadable_file_is_counted_and_skipped(tmp_path: Path, start: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that cannot be opened is counted once and skipped; the others are read; it is
    read once it can be. As root, permissions do not deny, so the open is made to fail."""
    bad, good = tmp_path / "bad.log", tmp_path / "good.log"
    bad.write_bytes(b"")
    good.write_bytes(b"")
    real_open = files_module._open_file
    as_root = os.geteuid() == 0
    if as_root:

        def denied(path: str) -> int:
            if path == str(bad):
                raise PermissionError(13, "Permission denied", path)
            return real_open(path)

        monkeypatch.setattr(files_module, "_open_file", denied)
    else:
        bad.chmod(0)
    source, sink = start([str(tmp_path / "*.log")], rescan_interval=0.3, first_start=False)
    append(bad, OOM)
    append(good, DTYPE)
    assert sink.wait_for(count_at_least(sink, 1), timeout=5.0)
    time.sleep(0.8)  # a few rescans: still one error, not one per rescan
    health = source.health()
    assert health.alive and health.detail["file_errors"] == 1
    assert "Permission denied" in health.detail["last_file_error"]
    assert str(bad) not in health.detail["files"]
    assert summary(sink) == [("good.log", "RuntimeError", "dtype_config", 1, 15)]
    if as_root:
        monkeypatch.setattr(files_module, "_open_file", real_open)
    else:
        bad.chmod(0o644)
    assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
    assert summary(sink)[1] == ("bad.log", "RuntimeError", "oom", 1, 6)


def test_without_inotify_the_rescan_finds_and_reads_everything(
    tmp_path: Path, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No inotify instance left (or a filesystem that sends no events, NFS): the periodic
    rescan alone finds new files and reads the ones that grew."""

    def no_inotify() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(files_module, "InotifyObserver", no_inotify)
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    source, sink = start([str(tmp_path / "**" / "*.log")], rescan_interval=0.3)
    assert source.health().detail["watching"].startswith("rescan only")
    append(log, step(1) + OOM + step(2))
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "train.log").write_bytes(DTYPE + step(1))
    assert sink.wait_for(count_at_least(sink, 2), timeout=5.0)
    assert sorted(summary(sink)) == [
        ("train.log", "RuntimeError", "dtype_config", 1, 15),
        ("train.log", "RuntimeError", "oom", 2, 6),
    ]


def test_a_sink_that_fails_gets_the_same_batch_again(tmp_path: Path, engine: Engine) -> None:
    """A store that cannot commit: the batch is kept and handed over again, nothing is lost or
    doubled, and the source shows no progress meanwhile."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    got: list[Batch] = []
    refusals = [2]

    def sink(batch: Batch) -> None:
        if batch.failures and refusals[0] > 0:
            refusals[0] -= 1
            raise RuntimeError("database is locked")
        got.append(batch)

    source = FileSource(engine, [str(tmp_path / "*.log")], first_start=True, quiet_flush=0.3)
    source.start(sink)
    try:
        append(log, DTYPE)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not any(batch.failures for batch in got):
            time.sleep(0.05)
        assert [len(batch.failures) for batch in got if batch.failures] == [1]
        assert source.health().detail["sink_errors"] == 2
    finally:
        source.stop()


def test_health_shows_progress_while_idle_and_death_after_stop(tmp_path: Path, start: Start) -> None:
    source, _ = start([str(tmp_path / "*.log")])
    first = source.health().last_progress
    time.sleep(1.3)
    health = source.health()
    assert health.alive and health.last_progress is not None and first is not None
    assert health.last_progress > first
    assert health.detail["watching"] == "inotify" and health.detail["watches"] == [str(tmp_path)]
    source.stop()
    assert not source.health().alive


# -- globs -------------------------------------------------------------------------


def test_globset_matches_what_glob_lists(tmp_path: Path) -> None:
    """The path an inotify event names is tested with the same rules glob.glob lists by."""
    for name in [
        "a.log",
        "b.txt",
        ".hidden.log",
        "run1/train.log",
        "run1/deep/er/x.log",
        ".cache/y.log",
        "run1/.tmp/z.log",
        "run2/rank0.log",
        "run2/rank0.log.1",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    patterns = [str(tmp_path / "**" / "*.log"), str(tmp_path / "run?" / "rank[0-9].log"), str(tmp_path / "*.txt")]
    for pattern in patterns:
        globset = GlobSet([pattern])
        listed = set(glob.glob(pattern, recursive=True))
        every = {str(path) for path in tmp_path.rglob("*") if path.is_file()}
        assert {path for path in every if globset.matches(path)} == listed, pattern
        assert globset.expand() == listed
    assert GlobSet(patterns).roots() == [WatchRoot(str(tmp_path), True)]
    assert GlobSet(["/var/log/training/*.log", "/srv/run.log", "/data/out/**"]).roots() == [
        WatchRoot("/var/log/training", False),
        WatchRoot("/srv", False),
        WatchRoot("/data/out", True),
    ]


def test_relative_globs_are_taken_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert GlobSet(["./logs/**/*.log"]).patterns == [str(tmp_path / "logs" / "**" / "*.log")]


def test_positions_are_json(tmp_path: Path, start: Start) -> None:
    """The daemon stores positions as JSON: they must survive a round trip unchanged."""
    log = tmp_path / "train.log"
    log.write_bytes(b"2026-11-30 10:00:00 step 1\n")
    _, sink = start([str(tmp_path / "*.log")], first_start=False, checkpoint_interval=0.1)
    assert sink.wait_for(lambda: key_for(str(log)) in positions(sink), timeout=3.0)
    saved = stored(sink)
    assert json.loads(json.dumps(saved)) == saved
    assert saved[key_for(str(log))]["last_stamp"] is not None
