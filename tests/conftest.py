"""Shared fixtures: the real corpus, the shipped engine, and the CLI run in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from triage.cli import main
from triage.engine import Engine

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "cases.jsonl"


def corpus_cases() -> list[dict[str, Any]]:
    """Every labelled case of ../shared/corpus (read, not copied: the corpus grows)."""
    if not CORPUS.exists():
        return []
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def engine() -> Engine:
    return Engine.load()


RunCli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> RunCli:
    """Run `triage ARGS...` in this process; returns (status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        try:
            status = main(list(args))
        except SystemExit as exit_:  # argparse usage errors
            status = int(exit_.code or 0)
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run
