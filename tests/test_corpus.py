"""Every real case of ../shared/corpus gets its label as the first incident of `triage scan`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import CORPUS, RunCli, corpus_cases

CASES = [case for case in corpus_cases() if not case.get("drop")]
pytestmark = pytest.mark.skipif(not CASES, reason=f"no corpus at {CORPUS}")


def scan_case(case: dict[str, Any], tmp_path: Path, run_cli: RunCli) -> dict[str, Any]:
    args = ["scan", "--format", "json", "--one-window"]  # the corpus README: no common clock
    if case["kernel_log"]:
        kernel = tmp_path / "kernel.log"
        kernel.write_text(case["kernel_log"] + "\n", encoding="utf-8")
        args += ["--kernel", str(kernel)]
    if case["program_log"]:
        log = tmp_path / "train.log"
        log.write_text(case["program_log"] + "\n", encoding="utf-8")
        args += ["--log", str(log)]
    status, out, err = run_cli(*args)
    assert status == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_corpus_case_first_incident(case: dict[str, Any], tmp_path: Path, run_cli: RunCli) -> None:
    document = scan_case(case, tmp_path, run_cli)
    incidents = document["incidents"]
    assert incidents, f"no incident for {case['id']} (why: {case['why']})"
    first = incidents[0]
    accepted = {case["category"], *case.get("also_ok", [])}
    assert (first["level"], first["category"] in accepted) == (case["level"], True), (
        f"{case['id']}: got {first['level']}/{first['category']}, want {case['level']}/{sorted(accepted)}\n"
        f"why: {case['why']}\nevidence: {json.dumps(first['evidence'], indent=1)}"
    )
    assert first["evidence"], "an incident must say why it has its label"
    assert first["hint"]
