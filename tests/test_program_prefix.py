"""split_prefix: every launcher prefix torchrun, accelerate and MPI put on worker lines."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from triage.program.prefix import NO_PREFIX, Prefix, split_prefix
from triage.program.timestamps import parse_stamp

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "cases.jsonl"
TORCH = REPO / "tests" / "data" / "torch"

PREFIXED = [
    # the excepthook of init_process_group: "[rankN]: " + line
    ("[rank3]: Traceback (most recent call last):", 3, None, "Traceback (most recent call last):"),
    ('[rank14]:   File "/x/accelerator.py", line 1598, in _prepare_deepspeed', 14, None, '  File "/x/accelerator.py"'),
    ("[rank1]: torch.distributed.DistBackendError: NCCL error", 1, None, "torch.distributed.DistBackendError: NCCL"),
    # c10 logging: no space, the glog header stays in the text
    (
        "[rank2]:[E424 01:17:25.031978332 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 2] Process",
        2,
        None,
        "[E424 01:17:25.031978332 ProcessGroupNCCL.cpp:1895] [PG ID 0",
    ),
    # torchrun --tee/--redirects: [${role_name}${local_rank}]:
    ("[default3]:Traceback (most recent call last):", None, 3, "Traceback (most recent call last):"),
    ('[default0]:  File "/x.py", line 1, in <module>', None, 0, '  File "/x.py"'),
    ("[default3]:[rank3]: Traceback (most recent call last):", 3, 3, "Traceback (most recent call last):"),
    ("[default0]:", None, 0, ""),
    ("[trainer1]:[rank5]: KeyError: 'lr'", 5, 1, "KeyError: 'lr'"),
    ("[default12]:x", None, 12, "x"),
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${rank}]:'
    ("[3]:[rank3]: Traceback (most recent call last):", 3, None, "Traceback (most recent call last):"),
    ("[7]:hello", 7, None, "hello"),
    # a paste's line counter and a log collector's stamp in front
    ("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog", 0, None, "[E321 02:07"),
    ("[2024-08-21 22:56:04,123][rank0]: Traceback (most recent call last):", 0, None, "Traceback (most"),
    ("[2024-08-21 22:56:04,123] [default1]:hello", None, 1, "hello"),
    # Open MPI --tag-output
    ("[1,3]<stderr>:Traceback (most recent call last):", 3, None, "Traceback (most recent call last):"),
    ("[1,0]<stdout>: step 1", 0, None, "step 1"),
    # pdsh (DeepSpeed multi-node): the host before the rank tag
    ("worker-1: [rank8]: Traceback (most recent call last):", 8, None, "Traceback (most recent call last):"),
    # kubectl logs --timestamps / docker logs -t
    ("2024-08-21T22:56:04.123456789Z [rank2]: Traceback (most recent call last):", 2, None, "Traceback (most"),
    ('2024-08-21T22:56:04.123456789Z   File "x.py", line 1, in f', None, None, '  File "x.py"'),
    ("2024-08-21T22:56:04+02:00 plain", None, None, "plain"),
    ('node07.cluster: [default2]:[rank10]:   File "x.py", line 1, in f', 10, 2, '  File "x.py"'),
]


@pytest.mark.parametrize(("raw", "rank", "local_rank", "text"), PREFIXED, ids=[p[0][:32] for p in PREFIXED])
def test_prefixes(raw: str, rank: int | None, local_rank: int | None, text: str) -> None:
    prefix, rest = split_prefix(raw)
    assert (prefix.rank, prefix.local_rank) == (rank, local_rank)
    assert rest.startswith(text)
    assert raw[prefix.length :] == rest


NOT_PREFIXED = [
    "",
    "[",
    "plain text",
    "Traceback (most recent call last):",
    "[INFO|2024-08-21 22:56:04] llamafactory.data.loader:143 >> Loading",
    "[2024-08-21 22:56:04,123] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator",
    "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught",
    "[Rank 0] Watchdog caught collective operation timeout",
    "[rank0] no colon",
    "[0]:",  # ChildFailedError's failure index, alone on its line
    "[1]:",
    "[80746] a counter with no rank after it",
    "[1/3] Building CXX object",
    "[rank0 ]: spaced",
    "[ 1.234] dmesg-like",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed",
    "worker-1: no rank tag after the host",
    "Note: [x] is text",
    "2024-08-21 22:56:04,123 - INFO - a Python logging record is the message, not a prefix",
    "2024-08-21T22:56:04 naive ISO without a zone is not a collector's",
]


@pytest.mark.parametrize("raw", NOT_PREFIXED)
def test_not_prefixes(raw: str) -> None:
    assert split_prefix(raw) == (NO_PREFIX, raw)


def test_collector_stamp_is_prefix_and_still_read_from_the_raw_line() -> None:
    raw = '2024-08-21T22:56:04.5Z [rank1]:   File "train.py", line 3, in main'
    prefix, text = split_prefix(raw)
    assert (prefix.rank, text) == (1, '  File "train.py", line 3, in main')
    assert parse_stamp(raw) == 1724280964.5
    assert parse_stamp(text) is None


def test_host_of_a_multi_node_launcher() -> None:
    prefix, text = split_prefix("worker-1: [rank8]: KeyError: 'x'")
    assert (prefix.host, prefix.rank, text) == ("worker-1", 8, "KeyError: 'x'")
    assert split_prefix("[rank8]: x")[0].host is None


def test_prefix_is_a_small_frozen_value() -> None:
    prefix, _ = split_prefix("[rank3]: x")
    assert prefix == Prefix(rank=3, local_rank=None, length=9)
    with pytest.raises(AttributeError):
        prefix.rank = 4  # type: ignore[misc]


def torch_lines() -> list[tuple[str, str]]:
    return [
        (path.name, line)
        for path in sorted(TORCH.glob("*.log"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def test_real_torchrun_prefixes() -> None:
    """Each bracket tag of the real fixtures comes back as the rank / local rank it names."""
    lines = torch_lines()
    assert lines
    seen: set[str] = set()
    for name, raw in lines:
        prefix, text = split_prefix(raw)
        tee = re.match(r"\[(?:default|trainer)(\d+)\]:", raw)
        hook = re.match(r"(?:\[(?:default|trainer)?\d+\]:)?\[rank(\d+)\]: ", raw)
        template = re.match(r"\[(\d+)\]:(?=.)", raw)
        if tee:
            assert prefix.local_rank == int(tee[1]), (name, raw)
            seen.add("tee")
        if hook:
            assert prefix.rank == int(hook[1]), (name, raw)
            assert not text.startswith("[rank"), (name, raw)
            seen.add("hook")
        if template:
            assert prefix.rank == int(template[1]), (name, raw)
            seen.add("template")
        if not (tee or hook or template):
            assert prefix == NO_PREFIX, (name, raw)
    assert seen == {"tee", "hook", "template"}


@pytest.mark.skipif(not CORPUS.exists(), reason="no corpus")
def test_corpus_rank_prefixes() -> None:
    count = 0
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        for line in json.loads(raw)["program_log"].splitlines():
            tag = re.match(r"(?:\[\d+\] )?\[rank(\d+)\]:", line)
            if tag is None:
                continue
            prefix, text = split_prefix(line)
            assert prefix.rank == int(tag[1]), line
            assert line.endswith(text)
            count += 1
    assert count >= 20


def test_lines_without_prefix_are_cheap() -> None:
    lines = ["{'loss': 1.43, 'grad_norm': 3.48}", '  File "x.py", line 3, in f', "[2024-08-21 22:56:04,123] [INFO]"]
    lines *= 30000
    start = time.perf_counter()
    for line in lines:
        split_prefix(line)
    per_line = (time.perf_counter() - start) / len(lines)
    assert per_line < 20e-6, f"{per_line * 1e6:.1f} µs per line"
