"""`triage scan` end to end: inputs (files, gzip, stdin), output shapes, exit codes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, RunCli

KERNEL = """\
[ 2679.300365] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=502589, emitted seq=502591
[ 2679.300490] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process python pid 10728 thread python:cs0 pid 10762
[ 2679.300601] amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!
"""

TRACEBACK = """\
[INFO|2026-11-30 10:56:40,001] llamafactory.train: step 100 loss 1.23
Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    main()
  File "/work/train.py", line 8, in main
    loss.backward()
RuntimeError: HIP error: unspecified launch failure
"""

OOM = """\
2026-11-30 10:56:45,034 - INFO - step 7
Traceback (most recent call last):
  File "/work/train.py", line 3, in <module>
    x = torch.empty(10**12, device="cuda")
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.64 TiB. GPU 0 has a total capacity of 191.98 GiB
"""


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_kernel_and_program_with_boot_time_align(tmp_path: Path, run_cli: RunCli) -> None:
    kernel = write(tmp_path / "dmesg.txt", KERNEL)
    log = write(tmp_path / "train.log", TRACEBACK)
    # Boot so that the reset (2679.3 s after boot) lands 2 s before the traceback's last stamp.
    status, out, err = run_cli(
        "scan", "--format", "json", "--kernel", kernel, "--log", log, "--boot-time", "2026-11-30T10:11:58.7"
    )
    assert status == 0, err
    document = json.loads(out)
    first = document["incidents"][0]
    assert (first["level"], first["category"]) == ("driver", "gpu_reset")
    assert document["clock"]["mode"] == "aligned"
    for key in ("id", "level", "category", "title", "hint", "first_seen", "last_seen", "count", "fingerprint"):
        assert first[key] not in (None, ""), key
    assert first["kernel_events"][0]["rule_id"] and first["kernel_events"][0]["lines"]
    assert first["program_failures"][0]["rule_id"] is not None or first["program_failures"][0]["lines"]
    assert any("before the program's failure" in line for line in first["evidence"]), first["evidence"]


def test_without_boot_time_logs_are_one_window_and_it_says_so(tmp_path: Path, run_cli: RunCli) -> None:
    kernel = write(tmp_path / "dmesg.txt", KERNEL)
    log = write(tmp_path / "train.log", TRACEBACK)
    status, out, _ = run_cli("scan", "--format", "json", "--kernel", kernel, "--log", log)
    assert status == 0
    document = json.loads(out)
    assert document["clock"]["mode"] == "one_window"
    assert "boot" in document["clock"]["note"]
    first = document["incidents"][0]
    assert first["category"] == "gpu_reset"
    assert any(line.startswith("clock:") for line in first["evidence"])


def test_program_only_is_code_level(tmp_path: Path, run_cli: RunCli) -> None:
    status, out, _ = run_cli("scan", "--format", "json", "--log", write(tmp_path / "t.log", OOM))
    assert status == 0
    incidents = json.loads(out)["incidents"]
    assert [(i["level"], i["category"]) for i in incidents] == [("code", "oom")]


def test_gzip_and_repeated_files(tmp_path: Path, run_cli: RunCli) -> None:
    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress(OOM.encode()))
    plain = write(tmp_path / "other.log", TRACEBACK)
    status, out, _ = run_cli("scan", "--format", "json", "--log", str(packed), "--log", plain)
    assert status == 0
    categories = sorted(i["category"] for i in json.loads(out)["incidents"])
    assert "oom" in categories


def test_stdin_is_read_with_dash(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "triage", "scan", "--format", "json", "--log", "-"],
        input=OOM.encode(),
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["incidents"][0]["category"] == "oom"


def test_text_output_names_level_category_and_hint(tmp_path: Path, run_cli: RunCli) -> None:
    status, out, _ = run_cli("scan", "--log", write(tmp_path / "t.log", OOM))
    assert status == 0
    assert "CODE   oom" in out
    assert "hint:" in out
    assert "\033[" not in out  # no colour when not on a terminal


def test_unreadable_file_exits_2_naming_it(tmp_path: Path, run_cli: RunCli) -> None:
    missing = tmp_path / "nope.log"
    status, out, err = run_cli("scan", "--log", str(missing))
    assert status == 2
    assert str(missing) in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""


def test_bad_usage_exits_2(run_cli: RunCli) -> None:
    assert run_cli("scan")[0] == 2
    assert run_cli("scan", "--log", "x", "--format", "yaml")[0] == 2
    status, _, err = run_cli("scan", "--log", "x", "--boot-time", "yesterday")
    assert status == 2 and "--boot-time" in err


def test_corrupt_gzip_exits_2(tmp_path: Path, run_cli: RunCli) -> None:
    broken = tmp_path / "broken.log.gz"
    broken.write_bytes(gzip.compress(OOM.encode())[:30])
    status, _, err = run_cli("scan", "--log", str(broken))
    assert status == 2 and "broken.log.gz" in err


def test_bad_user_pattern_dir_exits_2_naming_file_and_rule(tmp_path: Path, run_cli: RunCli) -> None:
    (tmp_path / "mine.toml").write_text(
        '[[rule]]\nid = "mine.bad"\nsource = "program"\nregex = "("\ncategory = "oom"\n'
        'title = "t"\nhint = "h"\nmatch = ["x"]\n',
        encoding="utf-8",
    )
    status, _, err = run_cli("scan", "--log", "-", "--patterns", str(tmp_path))
    assert status == 2
    assert "mine.toml" in err and "mine.bad" in err


def test_user_pattern_overrides_shipped_rule_by_id(tmp_path: Path, run_cli: RunCli) -> None:
    log = write(tmp_path / "t.log", "ERROR: widget exploded while training\n")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "site.toml").write_text(
        '[[rule]]\nid = "site.widget"\nsource = "program"\nregex = "widget exploded"\ncategory = "quantization"\n'
        'title = "Widget exploded"\nhint = "Call the widget team."\nmatch = ["widget exploded"]\n',
        encoding="utf-8",
    )
    status, out, _ = run_cli("scan", "--format", "json", "--log", log, "--patterns", str(tmp_path / "rules"))
    assert status == 0
    first = json.loads(out)["incidents"][0]
    assert (first["category"], first["title"], first["hint"]) == (
        "quantization",
        "Widget exploded",
        "Call the widget team.",
    )
