"""Properties of the program-log pieces over arbitrary input (hypothesis).

- No bytes make split_prefix, parse_stamp or the assembler raise.
- LineSplitter gives the same lines however the bytes are cut into chunks
  (`\\r\\n` split across two chunks included), and bounds every line.
- A traceback split at any byte boundary across two reads assembles the same.
- Ranks' lines interleaved in any order assemble as when printed one by one.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.model import ProgramFailure
from triage.patterns import load_file
from triage.program import FailureAssembler, LineSplitter, make_line, parse_stamp, split_lines, split_prefix

REPO = Path(__file__).resolve().parents[1]
TORCH = REPO / "tests" / "data" / "torch"
RULES = load_file(REPO / "tests" / "data" / "program" / "rules.toml")

#: Real lines to build inputs from, so random data reaches the interesting states.
_FIXTURE_LINES = [
    line
    for path in sorted(TORCH.glob("*.log"))
    for line in path.read_text(encoding="utf-8").splitlines()
    if line.strip()
]
REAL_LINES = [
    *_FIXTURE_LINES[:400],
    "Memory access fault by GPU node-2 (Agent handle: 0x580db0) on address 0x18000. Reason: Page not present.",
    "HW Exception by GPU node-4 (Agent handle: 0x1ebc04e0) reason :GPU Hang",
    "terminate called after throwing an instance of 'c10::Error'",
    "  what():  CUDA error: an illegal memory access was encountered",
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout",
    "Fatal Python error: Segmentation fault",
    "Current thread 0x00007fb0995efb80 (most recent call first):",
    "x" * 200,
]

pieces = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(REAL_LINES).map(lambda line: line.encode("utf-8")),
    st.sampled_from([b"\n", b"\r", b"\r\n", b"[rank1]: ", b"[default2]:", b"  ", b"\xff\xfe", "é█".encode()]),
)
log_bytes = st.lists(pieces, max_size=60).map(b"".join)


def assemble_lines(lines: list[str]) -> list[ProgramFailure]:
    assembler = FailureAssembler(RULES, context_lines=5)
    failures: list[ProgramFailure] = []
    for number, raw in enumerate(lines, start=1):
        line = make_line(raw, number)
        if number % 7 == 0:
            assembler.feed_context(line)
        else:
            failures += assembler.feed(line)
    return failures + assembler.flush()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_bytes)
def test_no_input_raises(data: bytes) -> None:
    lines = split_lines(data.decode("utf-8", errors="replace"))
    for raw in lines:
        prefix, text = split_prefix(raw)
        assert raw[prefix.length :] == text
        parse_stamp(raw)
        parse_stamp(text, reference_year=2024)
    for failure in assemble_lines(lines):
        assert failure.lines and failure.category
        assert failure.title and len(failure.title) <= 100


def split_in_chunks(data: bytes, cuts: list[int], max_line: int = 64 * 1024) -> tuple[list[str], int]:
    splitter = LineSplitter(max_line=max_line)
    lines: list[str] = []
    previous = 0
    for cut in [*sorted(cuts), len(data)]:
        lines += splitter.feed(data[previous:cut])
        previous = cut
    return lines + splitter.flush(), splitter.truncated


splitter_bytes = st.lists(
    st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"\r\r", "é".encode(), "█".encode(), b"\xff", b""]),
    max_size=80,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(splitter_bytes, st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_line_splitter_any_chunking(data: bytes, cuts: list[int]) -> None:
    cuts = [cut for cut in cuts if cut <= len(data)]
    whole, _ = split_in_chunks(data, [])
    assert split_in_chunks(data, cuts)[0] == whole
    assert whole == split_lines(data.decode("utf-8", errors="replace"))


@settings(max_examples=300, deadline=None)
@given(splitter_bytes, st.lists(st.integers(min_value=0, max_value=200), max_size=6), st.integers(1, 6))
def test_line_splitter_bounds_lines(data: bytes, cuts: list[int], cap: int) -> None:
    cuts = [cut for cut in cuts if cut <= len(data)]
    whole = split_in_chunks(data, [], max_line=cap)
    assert split_in_chunks(data, cuts, max_line=cap) == whole
    lines, truncated = whole
    assert all(len(line) <= cap for line in lines)  # a byte decodes to at most one character
    long = [part for part in re.split(rb"\r\n|\r|\n", data) if len(part) > cap]
    assert truncated == len(long)


def test_line_splitter_examples() -> None:
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"") == []
    assert splitter.feed(b"one\r") == ["one"]
    assert splitter.feed(b"") == []
    assert splitter.feed(b"\ntwo\rthree\n\nfour") == ["two", "three", ""]
    assert splitter.feed(b" 0123456789 and more") == []
    assert splitter.feed(b"\n") == ["four 01234"]
    assert splitter.truncated == 1
    assert splitter.feed("é".encode()[:1]) == []
    assert splitter.feed("é".encode()[1:] + b"\n") == ["é"]
    assert splitter.flush() == []
    assert splitter.feed(b"tail") == [] and splitter.flush() == ["tail"]


def digest(failures: list[ProgramFailure]) -> list[str]:
    return sorted(
        repr(
            (f.kind, f.rank, f.local_rank, f.exception_type, f.message, f.chain, f.lines, f.count, f.rule_id, f.fields)
        )
        for f in failures
    )


def assemble_bytes(data: bytes, cuts: list[int]) -> list[ProgramFailure]:
    lines, _ = split_in_chunks(data, cuts)
    assembler = FailureAssembler(RULES)
    failures: list[ProgramFailure] = []
    for number, raw in enumerate(lines, start=1):
        failures += assembler.feed(make_line(raw, number, reference_year=2026))
    return failures + assembler.flush()


def test_traceback_split_at_every_byte() -> None:
    data = (TORCH / "errors-chained.log").read_bytes().replace(b"\n", b"\r\n")
    expected = digest(assemble_bytes(data, []))
    assert len(expected) == 1 and "'RuntimeError'" in expected[0]
    for cut in range(1, len(data)):
        assert digest(assemble_bytes(data, [cut])) == expected, f"split at byte {cut}"


FIXTURES = [*sorted(TORCH.glob("torchrun-*.log")), TORCH / "cpp-terminate.log"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FIXTURES), st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_real_logs_split_anywhere(path: Path, fractions: list[float]) -> None:
    data = path.read_bytes()
    cuts = [int(fraction * len(data)) for fraction in fractions]
    assert digest(assemble_bytes(data, cuts)) == digest(assemble_bytes(data, []))


RANK_LINES: dict[int, list[str]] = {}
for _raw in (TORCH / "torchrun-different.log").read_text(encoding="utf-8").splitlines():
    _match = re.match(r"\[rank(\d+)\]: ", _raw)
    if _match:
        RANK_LINES.setdefault(int(_match[1]), []).append(_raw)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_interleaving_of_ranks(data: st.DataObject) -> None:
    queues = {rank: list(lines) for rank, lines in RANK_LINES.items()}
    merged: list[str] = []
    while queues:
        rank = data.draw(st.sampled_from(sorted(queues)))
        merged.append(queues[rank].pop(0))
        if not queues[rank]:
            del queues[rank]
    sequential = [line for rank in sorted(RANK_LINES) for line in RANK_LINES[rank]]
    expected = digest(assemble_lines_plain(sequential))
    assert len(expected) == 4
    assert digest(assemble_lines_plain(merged)) == expected


def assemble_lines_plain(lines: list[str]) -> list[ProgramFailure]:
    assembler = FailureAssembler(RULES)
    failures: list[ProgramFailure] = []
    for number, raw in enumerate(lines, start=1):
        failures += assembler.feed(make_line(raw, number))
    return failures + assembler.flush()
