"""parse_stamp: the stamp formats training logs really use, and what is not a stamp."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from triage.program.prefix import split_prefix
from triage.program.timestamps import parse_stamp

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "cases.jsonl"
TORCH = REPO / "tests" / "data" / "torch"


def local(*parts: int, micro: int = 0) -> float:
    return datetime(*parts).timestamp() + micro / 1e6  # type: ignore[arg-type]


STAMPED = [
    # ISO 8601
    ("2024-08-21T22:56:04.123+02:00 step 3", datetime(2024, 8, 21, 20, 56, 4, 123000, tzinfo=UTC).timestamp()),
    ("2024-08-21T22:56:04Z worker started", datetime(2024, 8, 21, 22, 56, 4, tzinfo=UTC).timestamp()),
    ("2024-08-21T22:56:04-0700 x", datetime(2024, 8, 21, 22, 56, 4, tzinfo=timezone(timedelta(hours=-7))).timestamp()),
    ("2024-08-21T22:56:04 naive", local(2024, 8, 21, 22, 56, 4)),
    ("2024/08/21 22:56:04 slashes", local(2024, 8, 21, 22, 56, 4)),
    # Python logging, as LLaMA-Factory, DeepSpeed and loguru print it
    ("2024-08-21 22:56:04,123 - INFO - root - hello", local(2024, 8, 21, 22, 56, 4, micro=123000)),
    ("[INFO|2024-08-21 22:56:04] llamafactory.data.loader:143 >> Loading dataset", local(2024, 8, 21, 22, 56, 4)),
    (
        "[2024-08-21 22:56:04,123] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda",
        local(2024, 8, 21, 22, 56, 4, micro=123000),
    ),
    (
        "[INFO|configuration_utils.py:733] 2024-08-21 22:56:04,123 >> loading configuration file",
        local(2024, 8, 21, 22, 56, 4, micro=123000),
    ),
    # from the corpus (autotrain737): loguru's level column
    ("ERROR    | 2024-08-21 22:56:04 | autotrain.trainers.common:wrapper:121 - HIP out of memory.", 1724280964.0),
    # transformers / accelerate: month first
    ("11/30/2026 10:56:45 - INFO - __main__ - Process rank: 0", local(2026, 11, 30, 10, 56, 45)),
    # torchrun ChildFailedError
    ("2024-08-21_22:56:04", local(2024, 8, 21, 22, 56, 4)),
    # glog (torch.distributed.elastic) and c10 logging: no year
    ("W1130 10:56:45.034000 819010 torch/distributed/elastic/multiprocessing/api.py:900] Sending process", None),
    ("[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught", None),
    ("I20240821 22:56:04.500000 12 main.cc:1] glog with a year", local(2024, 8, 21, 22, 56, 4, micro=500000)),
]


@pytest.mark.parametrize(("text", "expected"), STAMPED, ids=[text[:40] for text, _ in STAMPED])
def test_formats(text: str, expected: float | None) -> None:
    got = parse_stamp(text, reference_year=2024)
    if expected is None:  # the glog forms: check against the reference year
        match = re.search(r"[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)", text)
        assert match is not None
        month, day, hour, minute, second = (int(part) for part in match.groups()[:5])
        expected = local(2024, month, day, hour, minute, second) + float("0." + match[6])
    if text.startswith("ERROR    |"):
        expected = local(2024, 8, 21, 22, 56, 4)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "raw",
    [
        "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation",
        "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught",
        "[default3]:[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x",
        "[2024-03-21 02:07:08,408][rank0]: Traceback (most recent call last):",
    ],
)
def test_stamp_after_launcher_prefixes(raw: str) -> None:
    """The raw line (prefix and all) gives the stamp; so does the text when the stamp is not in the prefix."""
    expected = local(2024, 3, 21, 2, 7, 8) + 0.408
    assert parse_stamp(raw, reference_year=2024) == pytest.approx(expected, abs=1e-3)
    _, text = split_prefix(raw)
    if not raw.startswith("[2024"):
        assert parse_stamp(text, reference_year=2024) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain text",
        "2024-13-01 10:00:00 month 13",
        "2024-02-30 10:00:00 February 30",
        "2024-08-21 25:00:00 hour 25",
        "2024-08-21 22:61:00 minute 61",
        "2024-08-21 22:56:60 second 60",
        "W1330 10:56:45.034000 12 x.py:1] month 13",
        "1899-08-21 22:56:04 too old",
        "2024-08-21T22:56:04+25:00 offset out of range",
        "INFO:tensorflow:loss = 1.35363, step = 501, precision = 0.609375",
        " 45%|████▌     | 450/1000 [02:15<02:45,  3.32it/s]",
        "{'loss': 1.4350, 'grad_norm': 3.48, 'learning_rate': 1.628e-05, 'epoch': 0.74}",
        "  time      : 2024-08-21_22:56:04",  # a field of torchrun's summary, not the line's stamp
        "RuntimeError: the checkpoint from 2024-08-21 22:56:04 is corrupt",  # a date inside a message
        "x" * 70 + " 2024-08-21 22:56:04 too far in",
        "20240821 22:56:04 no separators",
        "4.44.094.268 E ROCm error: unspecified launch failure",  # llama.cpp's relative clock
        "12024-08-21 22:56:04 five-digit year",
    ],
)
def test_not_a_stamp(text: str) -> None:
    assert parse_stamp(text, reference_year=2024) is None


def test_glog_year_is_this_year_unless_that_is_in_the_future(monkeypatch: pytest.MonkeyPatch) -> None:
    now = local(2026, 3, 1, 12, 0, 0)
    monkeypatch.setattr(time, "time", lambda: now)
    past = parse_stamp("W0215 10:00:00.000000 1 a.py:1] two weeks ago")
    assert past == local(2026, 2, 15, 10, 0, 0)
    future = parse_stamp("W1231 10:00:00.000000 1 a.py:1] December: last year's")
    assert future == local(2025, 12, 31, 10, 0, 0)
    tomorrow = parse_stamp("W0302 10:00:00.000000 1 a.py:1] within a day of slack")
    assert tomorrow == local(2026, 3, 2, 10, 0, 0)
    leap = parse_stamp("W0229 10:00:00.000000 1 a.py:1] no Feb 29 in 2026")
    assert leap is None or leap == local(2024, 2, 29, 10, 0, 0) or leap < now
    # An explicit reference year wins.
    assert parse_stamp("W1231 10:00:00.000000 1 a.py:1] x", reference_year=2030) == local(2030, 12, 31, 10, 0, 0)


def test_fraction_digits() -> None:
    base = local(2024, 3, 21, 2, 7, 8)
    assert parse_stamp("[E321 02:07:08.408271257 x]", reference_year=2024) == pytest.approx(base + 0.408271257)
    assert parse_stamp("2024-03-21 02:07:08.5 x") == pytest.approx(base + 0.5)


def torch_logs() -> list[Path]:
    return sorted(TORCH.glob("torchrun-*.log"))


@pytest.mark.parametrize("path", torch_logs(), ids=lambda path: path.name)
def test_real_torchrun_stamps_agree(path: Path) -> None:
    """torchrun's glog lines and its ChildFailedError `time :` field name the same second."""
    lines = path.read_text(encoding="utf-8").splitlines()
    summary = [line for line in lines if line.strip().startswith("time      :")]
    assert summary, "every torchrun fixture ends in a ChildFailedError summary"
    year = int(summary[0].split(":", 1)[1].strip()[:4])
    failed = [line for line in lines if "failed (exitcode:" in line]
    assert len(failed) == 1
    failed_at = parse_stamp(failed[0], reference_year=year)
    assert failed_at is not None
    for field in summary:
        value = field.split(":", 1)[1].strip()
        assert parse_stamp(value) == pytest.approx(failed_at, abs=15)
    glog = [line for line in lines if re.match(r"[IWEF]\d{4} ", line)]
    assert glog
    stamps = [parse_stamp(line, reference_year=year) for line in glog]
    known = [stamp for stamp in stamps if stamp is not None]
    assert known == stamps
    assert known == sorted(known)


def corpus_lines() -> list[str]:
    if not CORPUS.exists():
        return []
    lines: list[str] = []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if raw.strip():
            lines.extend(json.loads(raw)["program_log"].splitlines())
    return lines


@pytest.mark.skipif(not CORPUS.exists(), reason="no corpus")
def test_corpus_stamped_lines() -> None:
    """Every glog/c10 stamped line of the corpus parses; a known count of lines has a stamp."""
    lines = corpus_lines()
    glog = [line for line in lines if re.search(r"(?:^|\]:?\[?)[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+ ", line)]
    assert len(glog) >= 8
    for line in glog:
        assert parse_stamp(line, reference_year=2024) is not None, line
    assert any(parse_stamp(line) is not None for line in lines if line.startswith("ERROR    |"))


def test_lines_without_a_stamp_are_cheap() -> None:
    """The quick rejection: a line with no HH:MM:SS costs a few string scans (generous bound)."""
    lines = [
        "{'loss': 1.4350, 'grad_norm': 3.48, 'learning_rate': 1.628e-05, 'epoch': 0.74}",
        " 45%|████▌     | 450/1000 [02:15<02:45,  3.32it/s]",
        '[rank0]:   File "/usr/lib/python3/x.py", line 12, in f',
    ] * 20000
    start = time.perf_counter()
    for line in lines:
        parse_stamp(line)
    per_line = (time.perf_counter() - start) / len(lines)
    assert per_line < 50e-6, f"{per_line * 1e6:.1f} µs per line"
