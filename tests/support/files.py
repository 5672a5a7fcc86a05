"""Helpers for the training-log file source tests: real tracebacks, a real logrotate, what the
sink got, and a child process running the source that a test can SIGKILL.

`python -m tests.support.files GLOB OUT [POSITIONS]` runs a FileSource whose sink appends
every batch to OUT as one JSON line (flushed and fsynced, as a store would commit it),
until it is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.batches import Collector
from triage.model import ProgramFailure
from triage.sources import Batch

TORCH = Path(__file__).resolve().parents[1] / "data" / "torch"
LOGROTATE = shutil.which("logrotate") or next(
    (path for path in ("/usr/sbin/logrotate", "/sbin/logrotate") if os.access(path, os.X_OK)), None
)
#: How rotations are done in these tests: the real binary when installed.
ROTATOR = "logrotate" if LOGROTATE else "emulated"


def traceback(name: str) -> bytes:
    """A real traceback from tests/data/torch (produced by real PyTorch runs)."""
    return (TORCH / f"errors-{name}.log").read_bytes()


def split_lines(data: bytes, lines: int) -> tuple[bytes, bytes]:
    """The first `lines` lines and the rest."""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[:lines]), b"".join(parts[lines:])


def failures(collector: Collector) -> list[ProgramFailure]:
    return [failure for batch in collector.snapshot() for failure in batch.failures]


def summary(collector: Collector) -> list[tuple[str, str | None, str, int, int]]:
    """(origin file name, exception type, category, first line number, line count) per failure."""
    return [
        (Path(f.origin).name, f.exception_type, f.category, f.line_number, len(f.lines)) for f in failures(collector)
    ]


def positions(collector: Collector) -> dict[str, Any]:
    """Every key's last position, as a store applying the batches in order would hold them."""
    merged: dict[str, Any] = {}
    for batch in collector.snapshot():
        merged.update(batch.positions)
    return merged


def stored(collector: Collector) -> dict[str, Any]:
    """The positions a store keeps: forgotten (None) keys removed."""
    return {key: value for key, value in positions(collector).items() if value is not None}


def rotate(log: Path, mode: str, workdir: Path) -> None:
    """Rotate `log` the way logrotate does, with `create` (rename to .1, create a new empty file)
    or `copytruncate` (copy to .1, truncate the original in place). The real logrotate runs
    when it is installed; otherwise its steps are done here in the same order."""
    assert mode in ("create", "copytruncate")
    if LOGROTATE:
        config = workdir / f"logrotate-{mode}.conf"
        config.write_text(f"{log} {{\n    rotate 3\n    {mode}\n    missingok\n    nocompress\n}}\n")
        subprocess.run(
            [LOGROTATE, "-f", "-s", str(workdir / "logrotate.status"), str(config)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return
    rotated = log.with_name(log.name + ".1")
    if mode == "create":
        mode_bits = log.stat().st_mode & 0o7777
        os.rename(log, rotated)
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode_bits))
    else:
        shutil.copy2(log, rotated)
        os.truncate(log, 0)


def wait_read(source: Any, path: Path, timeout: float = 5.0) -> bool:
    """Wait until the source has read `path` to its current end."""
    deadline = time.monotonic() + timeout
    size = path.stat().st_size
    while time.monotonic() < deadline:
        state = source.health().detail["files"].get(str(path))
        if state is not None and state["offset"] >= size:
            return True
        time.sleep(0.02)
    return False


# -- the child a test kills --------------------------------------------------------


def _batch_json(batch: Batch) -> str:
    return json.dumps(
        {
            "failures": [[f.origin, f.line_number, f.exception_type, f.category, len(f.lines)] for f in batch.failures],
            "positions": batch.positions,
        }
    )


def read_child_output(path: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    """(failures, merged positions) the child had committed; a torn last line is ignored, as a
    store's uncommitted transaction would be."""
    found: list[list[Any]] = []
    merged: dict[str, Any] = {}
    if not path.exists():
        return found, merged
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        found.extend(record["failures"])
        merged.update(record["positions"])
    return found, merged


def main(argv: list[str]) -> None:
    from triage.engine import Engine
    from triage.sources.files import FileSource

    pattern, out = argv[0], Path(argv[1])
    saved = json.loads(Path(argv[2]).read_text()) if len(argv) > 2 else None
    with out.open("a") as sink_file:

        def sink(batch: Batch) -> None:
            sink_file.write(_batch_json(batch) + "\n")
            sink_file.flush()
            os.fsync(sink_file.fileno())

        source = FileSource(Engine.load(), [pattern], positions=saved, first_start=saved is None, quiet_flush=5.0)
        source.start(sink)
        print("started", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
