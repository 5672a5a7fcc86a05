"""Required-literal extraction and the multi-literal prefilter, both engines."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.literals import Literal, required_literals
from triage.prefilter import HAVE_HYPERSCAN, Prefilter

ENGINES = ["python", *(["hyperscan"] if HAVE_HYPERSCAN else [])]


def texts(pattern: str) -> list[tuple[str, bool]] | None:
    found = required_literals(pattern)
    return None if found is None else [(lit.text, lit.caseless) for lit in found]


def test_plain_literal() -> None:
    assert texts(r"GPU reset begin!") == [("GPU reset begin!", False)]


def test_longest_run_is_chosen() -> None:
    assert texts(r"ring \S+ timeout, signaled seq=\d+") == [(" timeout, signaled seq=", False)]


def test_alternation_gives_every_branch() -> None:
    assert texts(r"(?:HIP|CUDA) out of memory") == [(" out of memory", False)]
    assert texts(r"hipErrorNoBinaryForGpu|invalid device function") == [
        ("hipErrorNoBinaryForGpu", False),
        ("invalid device function", False),
    ]


def test_case_insensitive_flag_is_kept() -> None:
    assert texts(r"(?i)out of memory") == [("out of memory", True)]
    assert texts(r"foo(?i:BARBAZ)") == [("BARBAZ", True)]


def test_optional_parts_do_not_count() -> None:
    assert texts(r"(?:abcdef)?xyz") == [("xyz", False)]
    assert texts(r"(?:abcdef)*x") is None


def test_unknown_when_no_literal() -> None:
    assert texts(r"\d+\s+\w+") is None
    assert texts(r"(?:ab|\d+)") is None


def test_regex_module_only_syntax_is_unknown_not_an_error() -> None:
    assert texts(r"\p{Lu}+ error") == [(" error", False)] or texts(r"\p{Lu}+ error") is None


@pytest.mark.parametrize("engine", ENGINES)
def test_prefilter_finds_first_literal_end(engine: str) -> None:
    prefilter = Prefilter([Literal("Traceback", False), Literal("out of memory", True)], engine=engine)
    data = b"step 1\nstep 2 loss=1.0\nHIP OUT OF MEMORY here\nTraceback x\n"
    hit = prefilter.search(data)
    assert hit == data.index(b"OUT OF MEMORY") + len(b"OUT OF MEMORY")
    second = prefilter.search(data, hit)
    assert second == data.index(b"Traceback") + len(b"Traceback")
    assert prefilter.search(data, second) is None
    assert prefilter.search(data, 0, 10) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_prefilter_case_sensitive_literal_ignores_other_case(engine: str) -> None:
    prefilter = Prefilter([Literal("Error", False)], engine=engine)
    assert prefilter.search(b"no error here\n") is None
    assert prefilter.search(b"an Error here\n") == 8


@pytest.mark.parametrize("engine", ENGINES)
def test_search_last(engine: str) -> None:
    finder = Prefilter(regexes=[rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"], engine=engine)
    data = b"".join(b"2024-08-21 22:56:%02d x\n" % i for i in range(60)) + b"y" * 100000 + b"\n"
    last = finder.search_last(data)
    assert last == data.index(b"2024-08-21 22:56:59") + 19
    assert finder.search_last(b"nothing at all\n" * 10000) is None


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(["abc", "Traceback", "fault", "x", "\n", "FAULT", "Trace"]), max_size=40),
    start=st.integers(min_value=0, max_value=50),
)
def test_engines_agree(words: list[str], start: int) -> None:
    data = "".join(words).encode()
    literals = [Literal("Traceback", False), Literal("fault", True)]
    expected = None
    match = re.compile(rb"Traceback|(?i:fault)").search(data, min(start, len(data)))
    if match:
        expected = match.end()
    for engine in ENGINES:
        assert Prefilter(literals, engine=engine).search(data, min(start, len(data))) == expected
