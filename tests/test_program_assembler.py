"""FailureAssembler on real output: PyTorch/torchrun fixtures made here, and the corpus's excerpts.

The rules are tests/data/program/rules.toml, a small fixed stand-in for the
shipped catalog, so these tests pin the assembler, not the catalog.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from triage.model import ProgramFailure, ProgramLine
from triage.patterns import Rule, load_file
from triage.program import FailureAssembler, assemble_text, make_line, split_lines
from triage.program.assembler import FATAL_LINES, MAX_STREAMS, MESSAGE_LINES, STALE_MESSAGE
from triage.program.timestamps import parse_stamp

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "cases.jsonl"
TORCH = REPO / "tests" / "data" / "torch"
RULES = load_file(REPO / "tests" / "data" / "program" / "rules.toml")


def assemble(text: str, rules: list[Rule] = RULES, reference_year: int | None = None) -> list[ProgramFailure]:
    return assemble_text(rules, text, reference_year=reference_year)


def fixture(name: str) -> str:
    return (TORCH / name).read_text(encoding="utf-8")


def corpus_log(prefix: str) -> str:
    if not CORPUS.exists():
        pytest.skip(f"no corpus at {CORPUS}")
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if raw.strip():
            case = json.loads(raw)
            if case["id"].startswith(prefix):
                log: str = case["program_log"]
                return log
    raise AssertionError(f"no corpus case {prefix}")


def only(failures: list[ProgramFailure], kind: str | None = None) -> ProgramFailure:
    chosen = [failure for failure in failures if kind is None or failure.kind == kind]
    assert len(chosen) == 1, [(f.kind, f.line_number, f.title) for f in failures]
    return chosen[0]


def feed_all(assembler: FailureAssembler, lines: Iterable[str], start: int = 1) -> list[ProgramFailure]:
    failures: list[ProgramFailure] = []
    for number, raw in enumerate(lines, start=start):
        failures += assembler.feed(make_line(raw, number))
    return failures


# -- real PyTorch output (tests/data/torch, made by generate.sh) -------------


def test_chained_exceptions_are_one_failure() -> None:
    text = fixture("errors-chained.log")
    failure = only(assemble(text))
    assert failure.kind == "traceback"
    assert failure.exception_type == "RuntimeError"
    assert failure.message == "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"
    assert failure.chain == [
        "KeyError: 'learning_rate'",
        "trainer.checks.TrainerConfigError: learning_rate missing from config",
    ]
    assert [frame.function for frame in failure.frames] == ["chained", "chained", "<module>", "chained"]
    assert failure.lines == text.splitlines()
    assert failure.text == text.rstrip("\n")
    assert failure.line_number == 1
    assert failure.category == "unclassified"
    assert failure.title == "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"
    assert "traceback" in failure.hint and not failure.follow_on


@pytest.mark.parametrize(
    ("name", "exception_type", "message", "category"),
    [
        (
            "errors-not_implemented_half.log",
            "NotImplementedError",
            "\"cholesky_cpu\" not implemented for 'Half'",
            "missing_op",
        ),
        (
            "errors-cuda_not_compiled.log",
            "AssertionError",
            "Torch not compiled with CUDA enabled",
            "device_unavailable",
        ),
        (
            "errors-cpu_oom.log",
            "RuntimeError",
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator",
            "oom",
        ),
        ("errors-dtype_mismatch.log", "RuntimeError", "mat1 and mat2 must have the same dtype", "dtype_config"),
        ("errors-nan_anomaly.log", "RuntimeError", "Function 'SqrtBackward0' returned nan values", "nan_loss"),
        ("errors-nccl_missing.log", "RuntimeError", "Distributed package doesn't have NCCL built in", "unclassified"),
        ("errors-keyboard_interrupt.log", "KeyboardInterrupt", "", "unclassified"),
        ("errors-custom_error.log", "trainer.checks.TrainerConfigError", "per_device_train_batch_size", "unclassified"),
        (
            "errors-sparse_backend.log",
            "NotImplementedError",
            "Could not run 'aten::view' with arguments from the 'SparseCPU'",
            "unclassified",
        ),
    ],
)
def test_single_process_failures(name: str, exception_type: str, message: str, category: str) -> None:
    failure = only(assemble(fixture(name)))
    assert failure.kind == "traceback"
    assert failure.exception_type == exception_type
    assert failure.message.startswith(message)
    assert failure.category == category
    assert failure.frames and failure.frames[0].function == "<module>"
    assert all(frame.line is not None for frame in failure.frames)


def test_exception_group() -> None:
    """Python 3.11's `+ Exception Group Traceback` with its `|` gutter is one failure."""
    text = fixture("errors-exception_group.log")
    failure = only(assemble(text))
    assert (failure.kind, failure.exception_type) == ("traceback", "ExceptionGroup")
    assert failure.message == "2 data shards failed to load (2 sub-exceptions)"
    assert failure.fields["sub_exceptions"] == (
        "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/shard-0.pt'; "
        "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/shard-1.pt'"
    )
    assert failure.lines == text.splitlines()
    assert [frame.function for frame in failure.frames][:2] == ["<module>", "exception_group"]
    assert len(failure.frames) == 2 + 2 * 5


def test_named_groups_fill_fields() -> None:
    failure = only(assemble(fixture("errors-not_implemented_half.log")))
    assert failure.fields == {"op": "cholesky_cpu", "dtype": "Half"}
    assert failure.rule_id == "t.missing_op.dtype"


def test_dispatcher_registrations_after_the_blank_line_are_not_the_message() -> None:
    failure = only(assemble(fixture("errors-sparse_backend.log")))
    assert "registered at" not in failure.message
    assert failure.lines[-1].startswith("NotImplementedError: Could not run 'aten::view'")


def test_anomaly_warning_stack_is_context_not_a_failure() -> None:
    """detect_anomaly prints the forward stack as a warning (frames, no header) before the traceback."""
    failure = only(assemble(fixture("errors-nan_anomaly.log")))
    assert failure.lines[0] == "Traceback (most recent call last):"
    assert any("Error detected in SqrtBackward0" in line for line in failure.context)
    assert failure.fields == {"function": "SqrtBackward0", "index": "0"}


def test_frames_parse_file_line_function() -> None:
    failure = only(assemble(fixture("errors-dtype_mismatch.log")))
    last = failure.frames[-1]
    assert last.file.endswith("torch/nn/modules/linear.py")
    assert (last.line, last.function) == (134, "forward")


def test_cpp_terminate_block() -> None:
    failures = assemble(fixture("cpp-terminate.log"))
    cpp = only(failures, "cpp_exception")
    assert cpp.exception_type == "c10::Error"
    assert cpp.message == "CUDA error: an illegal memory access was encountered (raised on CPU by triage's fixture)"
    assert cpp.category == "illegal_memory_access"
    assert len(cpp.frames) == 11
    assert cpp.frames[0].function.startswith("c10::Error::Error(")
    assert cpp.frames[0].file.endswith("libc10.so")
    assert cpp.lines[2].startswith("Exception raised from operator()")
    assert cpp.lines[-1].startswith("frame #10:")
    abort = only(failures, "fatal_line")
    assert abort.rule_id == "t.abort" and abort.follow_on
    assert "Aborted" in abort.text


def test_torchrun_four_ranks_four_errors() -> None:
    failures = assemble(fixture("torchrun-different.log"))
    tracebacks = {f.rank: f for f in failures if f.kind == "traceback"}
    assert set(tracebacks) == {0, 1, 2, 3}
    assert tracebacks[0].exception_type == "ValueError"
    assert tracebacks[1].category == "missing_op"
    assert tracebacks[2].category == "dtype_config"
    assert tracebacks[3].message == "'missing_key'"
    for rank, failure in tracebacks.items():
        assert all(line.startswith(f"[rank{rank}]: ") for line in failure.lines)
        assert not failure.text.startswith("[rank")
    summaries = [f for f in failures if f.kind == "child_failed"]
    assert len(summaries) == 2 and all(f.follow_on for f in summaries)
    agent_line, summary = sorted(summaries, key=lambda f: f.line_number)
    assert agent_line.exception_type is None
    assert agent_line.fields["exitcode"] == "1"
    assert agent_line.pid == summary.pid
    assert agent_line.local_rank == summary.local_rank
    assert summary.exception_type == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
    assert summary.host == "localhost"
    assert summary.fields["failures"] == "4"
    assert summary.fields["script"] == "ddp.py"
    assert summary.time_source == "stamp"
    assert summary.time is not None and agent_line.time is not None
    assert abs(summary.time - agent_line.time) < 2
    assert summary.lines[-1].startswith("====")
    assert len(failures) == 6  # the glog banner and SIGTERM notices are not failures


def test_torchrun_tee_streams_and_context() -> None:
    """`[defaultN]:` tee prefixes, the anomaly warning of each rank as that rank's context."""
    failures = assemble(fixture("torchrun-tee-identical.log"))
    tracebacks = [f for f in failures if f.kind == "traceback"]
    assert {(f.rank, f.local_rank) for f in tracebacks} == {(n, n) for n in range(4)}
    for failure in tracebacks:
        assert failure.category == "nan_loss"
        assert (
            failure.lines[0]
            == f"[default{failure.local_rank}]:[rank{failure.rank}]: Traceback (most recent call last):"
        )
        assert any("Error detected in SqrtBackward0" in line for line in failure.context)
        assert not any(line.startswith("[default") for line in failure.context)
    assert len(failures) == 6


def test_torchrun_interleaved_chained_tracebacks() -> None:
    """`--role trainer --tee 3`: tail_log threads interleave the ranks' lines; @record summary."""
    text = fixture("torchrun-role-chained.log")
    failures = assemble(text)
    tracebacks = [f for f in failures if f.kind == "traceback"]
    assert len(tracebacks) == 4
    for failure in tracebacks:
        assert failure.rank == failure.local_rank
        assert failure.chain == ["KeyError: 'lr'"]
        assert failure.message == f"rank {failure.rank}: config is missing 'lr'"
        assert all(line.startswith(f"[trainer{failure.rank}]:") for line in failure.lines)
        assert len(failure.lines) == 19
    summary = (
        only(failures, "child_failed")
        if False
        else max((f for f in failures if f.kind == "child_failed"), key=lambda f: len(f.lines))
    )
    assert summary.fields["root_cause"] == f"ValueError: rank {summary.rank}: config is missing 'lr'"
    assert summary.fields["error_file"].endswith("/error.json")


@pytest.mark.parametrize("name", ["torchrun-timeout.log", "torchrun-rank-template-timeout.log"])
def test_gloo_timeouts(name: str) -> None:
    failures = assemble(fixture(name))
    timeouts = [f for f in failures if f.kind == "traceback"]
    assert len(timeouts) == 3 and {f.rank for f in timeouts} == {1, 2, 3}
    for failure in timeouts:
        assert failure.category == "collective_failure"
        assert failure.fields["timeout_ms"] == "5000"


def test_segfault_with_faulthandler() -> None:
    failures = assemble(fixture("torchrun-segv.log"))
    crash = min(failures, key=lambda f: f.line_number)
    assert crash.kind == "fatal_line" and crash.rule_id == "t.abort"
    assert crash.fields["what"] == "Segmentation fault"
    assert [frame.function for frame in crash.frames] == ["string_at", "step", "main", "<module>"]
    assert crash.lines[-1].startswith("Extension modules:")
    peers = [f for f in failures if f.kind == "traceback"]
    assert peers and all(f.rule_id == "t.gloo.peer_closed" and f.follow_on for f in peers)
    signals = {f.fields.get("signal") for f in failures if f.kind == "child_failed"}
    assert signals == {"SIGSEGV"}


def test_abort_in_a_worker() -> None:
    failures = assemble(fixture("torchrun-abort.log"))
    cpp = only(failures, "cpp_exception")
    assert cpp.exception_type == "c10::Error"
    summaries = [f for f in failures if f.kind == "child_failed"]
    assert {f.fields["exitcode"] for f in summaries} == {"-6"}
    assert {f.fields.get("signal") for f in summaries} == {"SIGABRT"}


# -- the corpus's real excerpts ------------------------------------------------


def test_excerpt_starting_mid_traceback_without_exception() -> None:
    failure = only(assemble(corpus_log("ds5274")))
    assert failure.kind == "traceback" and failure.rank == 14
    assert failure.exception_type is None
    assert [frame.function for frame in failure.frames] == ["_prepare_deepspeed", "__init__", "load"]
    assert failure.frames[-1].line == 479
    assert failure.title.startswith("Traceback cut short in load")


def test_nccl_system_error_continuation_lines() -> None:
    failure = only(assemble(corpus_log("llamafactory7233")))
    assert failure.exception_type == "torch.distributed.DistBackendError"
    assert failure.rank == 1
    lines = failure.message.splitlines()
    assert lines[1].startswith("ncclSystemError: System call")
    assert lines[2:] == [
        "Last error:",
        "Error while creating shared memory segment /dev/shm/nccl-LeXlEJ (size 9637888)",
    ]
    assert len(failure.frames) == 4


def test_terminal_folded_lines_rejoin() -> None:
    """A paste from a fixed-width terminal: the rest of a prefixed line has no prefix."""
    failure = only(assemble(corpus_log("llamafactory6161")))
    assert failure.rank == 1
    assert "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO" in failure.message.splitlines()[0]
    assert failure.message.splitlines()[-1] == "Failed to open libnvidia-ml.so.1"
    assert len(failure.lines) == 5  # the source line above the exception line is context

    watchdog = assemble(corpus_log("openr1-620"))[0]
    assert watchdog.kind == "fatal_line" and watchdog.rank == 2
    assert watchdog.rule_id == "t.nccl.watchdog"
    assert watchdog.fields["timeout_ms"] == "1800000"
    first = watchdog.text.splitlines()[0]
    assert "thread terminated with exception: [Rank 2] Watchdog caught" in first
    assert "Timeout(ms)=1800000) ran for 1800010 milliseconds" in first
    assert watchdog.text.splitlines()[1].startswith("Exception raised from checkTimeout")


def test_watchdog_lines_of_several_ranks() -> None:
    failures = assemble(corpus_log("llamafactory7396"), reference_year=2024)
    watchdog = [f for f in failures if f.rule_id == "t.nccl.watchdog"]
    assert [f.rank for f in watchdog] == [0, 4]
    assert [f.fields["op"] for f in watchdog] == ["ALLREDUCE", "ALLREDUCE"]
    assert watchdog[0].time == parse_stamp("[E321 02:07:08.408271257 x]", reference_year=2024)
    assert watchdog[0].time_source == "stamp"


def test_repeated_fatal_lines_fold_into_a_count() -> None:
    failures = assemble(corpus_log("rocm5259"))
    hang = failures[0]
    assert (hang.kind, hang.rule_id, hang.count, hang.gpu_node) == ("fatal_line", "t.rocr.hw_exception", 4, 4)
    assert hang.category == "gpu_hang"
    child = only(failures, "child_failed")
    assert (child.local_rank, child.pid, child.fields["exitcode"], child.fields["signal"]) == (
        0,
        819025,
        "-6",
        "SIGABRT",
    )
    assert child.follow_on
    assert len(failures) == 2  # the bare `Traceback (most recent call last):` at the end tells nothing


def test_memory_fault_fields_and_abort() -> None:
    fault = only(assemble(corpus_log("megatron-ds201")))
    assert (fault.gpu_node, fault.address) == (2, "0x18000")
    assert fault.fields["reason"] == "Page not present or supervisor privilege"
    failures = assemble(corpus_log("hiptf60"))
    assert [(f.rule_id, f.follow_on) for f in failures] == [("t.rocr.memory_fault", False), ("t.abort", True)]
    assert failures[0].context[-1].startswith("INFO:tensorflow:loss = 1.00229, step = 901")


def test_aperture_violation_takes_its_dispatch_lines() -> None:
    failure = only(assemble(corpus_log("aiter1143")))
    assert failure.rule_id == "t.hsa.aperture"
    assert failure.lines[1].startswith("Kernel Name: _ZN5aiter50fmoe")
    assert failure.lines[-1].strip() == "rptr=325385, wptr=325387"
    assert len(failure.lines) == 9


def test_fatal_line_continuations() -> None:
    failure = only(assemble(corpus_log("ramalama732")))
    assert failure.lines == [
        "ROCm error: invalid device function",
        "  current device: 0, in function ggml_cuda_compute_forward at /llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:2313",
        "  err",
    ]
    standalone = only(assemble(corpus_log("rocm5668")))
    assert (standalone.kind, standalone.exception_type) == ("fatal_line", "RuntimeError")
    assert standalone.message == "HIP error: invalid device function"
    assert len(standalone.lines) == 4 and standalone.lines[-1].startswith("Compile with `TORCH_USE_HIP_DSA`")


def test_standalone_exception_lines() -> None:
    failure = only(assemble(corpus_log("vllm7207")))
    assert (failure.kind, failure.exception_type, failure.category) == (
        "fatal_line",
        "RuntimeError",
        "device_unavailable",
    )
    imports = assemble(corpus_log("rocm-fa34"))
    assert [f.exception_type for f in imports] == ["ImportError", "ImportError"]
    assert imports[1].message.endswith("undefined symbol: _Z17apply_rotary_cudaN2at6TensorES0_S0_S0_S0_S0_b")
    assert all(f.category == "unclassified" and f.title.startswith("ImportError: ") for f in imports)


def test_message_ends_at_blank_line_prompt_and_progress_bar() -> None:
    failure = only(assemble(corpus_log("pt126015")))
    assert failure.message.splitlines() == [
        "HIP error: invalid argument",
        "HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
        "incorrect.",
        "For debugging consider passing AMD_SERIALIZE_KERNEL=3",
        "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
    ]
    assert failure.category == "unclassified"  # the bf16 rule needs bf16 in its context
    bar = only(assemble(corpus_log("bnb107")))
    assert len(bar.lines) == 1


def test_context_rule_uses_the_lines_before() -> None:
    log = "Loading model with bf16=True\n" + corpus_log("pt126015")
    failure = only(assemble(log))
    assert (failure.rule_id, failure.category) == ("t.hip.invalid_argument.bf16", "dtype_config")
    assert failure.context[0] == "Loading model with bf16=True"


def test_frame_forms() -> None:
    """`line 1229,in wrapped`, `...<2 lines>...`, Windows paths, `<frozen runpy>`, a frame cut at its start."""
    heaviside = only(assemble(corpus_log("pt148856")))
    assert (heaviside.frames[0].line, heaviside.frames[0].function) == (1229, "wrapped")
    assert "    ...<2 lines>..." in heaviside.lines
    assert heaviside.message == "derivative for aten::heaviside is not implemented"
    windows = only(assemble(corpus_log("simplelama10")))
    assert windows.frames[0].file == "D:\\object remover\\main.py"
    assert windows.line_number == 2
    frozen = only(assemble(corpus_log("bnb372")))
    assert frozen.frames[0].file == "<frozen runpy>"
    cut = only(assemble(corpus_log("therock5897")))
    assert (cut.frames[0].file, cut.frames[0].line, cut.frames[0].function) == ("mynet.py", 25, "__init__")
    assert cut.exception_type == "torch.AcceleratorError"


def test_cpp_terminate_forms_from_the_corpus() -> None:
    ecc = assemble(corpus_log("nvidia-semseg33"))
    assert [f.kind for f in ecc] == ["fatal_line", "cpp_exception"]
    assert ecc[1].exception_type is None
    assert ecc[1].title == "terminate called without an active exception"
    string = only(assemble(corpus_log("quadrants589")), "cpp_exception")
    assert string.exception_type == "std::__cxx11::basic_string"


def test_loss_dict_and_stamped_log_lines() -> None:
    failures = assemble(corpus_log("llamafactory5660"))
    assert len(failures) == 7 and {f.category for f in failures} == {"nan_loss"}
    oom = assemble(corpus_log("autotrain737"))
    assert [f.exception_type for f in oom] == ["torch.OutOfMemoryError", None]
    assert oom[1].time_source == "stamp" and oom[1].time == parse_stamp("2024-08-21 22:56:04")


# -- behaviour: streams, idleness, context, limits -----------------------------


def rank_lines(name: str) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for raw in fixture(name).splitlines():
        match = re.match(r"\[rank(\d+)\]: ", raw)
        if match:
            lines.setdefault(int(match[1]), []).append(raw)
    return lines


def digest(failures: list[ProgramFailure]) -> list[tuple[object, ...]]:
    return sorted(
        (f.rank, f.kind, f.exception_type, f.message, f.chain, [(x.file, x.line) for x in f.frames], f.lines)
        for f in failures
    )


def test_line_level_interleaving_of_ranks() -> None:
    """Four ranks' tracebacks merged line by line assemble as when printed one after the other."""
    per_rank = rank_lines("torchrun-different.log")
    sequential = [line for rank in sorted(per_rank) for line in per_rank[rank]]
    interleaved: list[str] = []
    longest = max(len(lines) for lines in per_rank.values())
    for index in range(longest):
        interleaved += [lines[index] for _, lines in sorted(per_rank.items()) if index < len(lines)]
    expected = digest(assemble("\n".join(sequential)))
    assert len(expected) == 4
    assert digest(assemble("\n".join(interleaved))) == expected


def test_traceback_after_progress_bars_and_mid_line() -> None:
    bar = " 10%|#         | 10/100 [00:01<00:09, 9.1it/s]"
    body = fixture("errors-not_implemented_half.log")
    carriage = assemble(bar + "\r" + bar + "\r" + body)
    assert only(carriage).lines[0] == "Traceback (most recent call last):"
    glued = only(assemble(bar + "Traceback (most recent call last):\n" + body.split("\n", 1)[1]))
    assert glued.text.startswith("Traceback (most recent call last):")
    assert glued.lines[0].startswith(bar)
    assert glued.category == "missing_op"


def test_collector_stamps_on_every_line() -> None:
    """`kubectl logs --timestamps`: a stamp before every line is prefix; the failure keeps its time."""
    body = fixture("errors-chained.log").splitlines()
    stamped = [f"2026-11-30T10:56:{n:02d}.000000001Z {line}" for n, line in enumerate(body)]
    failure = only(assemble("\n".join(stamped)))
    assert failure.text == only(assemble("\n".join(body))).text
    assert failure.chain == [
        "KeyError: 'learning_rate'",
        "trainer.checks.TrainerConfigError: learning_rate missing from config",
    ]
    assert failure.time == parse_stamp("2026-11-30T10:56:00Z") and failure.time_source == "stamp"
    assert failure.lines == stamped


def test_split_lines() -> None:
    assert split_lines("a\r\nb\rc\n\nd") == ["a", "b", "c", "", "d"]
    assert split_lines("a\n") == ["a"]
    assert split_lines("") == []


def test_idle_and_feed_context() -> None:
    assembler = FailureAssembler(RULES, origin="job.log", context_lines=3)
    assert assembler.idle
    for number, text in enumerate(["step 1", "step 2", "step 3", "step 4"], start=1):
        assembler.feed_context(make_line(text, number))
    assert assembler.idle
    body = fixture("errors-not_implemented_half.log").splitlines()
    failures = feed_all(assembler, body[:-1], start=5)
    assert failures == [] and not assembler.idle
    failures = feed_all(assembler, body[-1:], start=5 + len(body) - 1)
    assert failures == [] and not assembler.idle  # the message may go on
    failures = assembler.feed(make_line("{'loss': 1.0}", 99))
    assert assembler.idle
    failure = only(failures)
    assert failure.origin == "job.log"
    assert failure.line_number == 5
    assert failure.context == ["step 2", "step 3", "step 4"]
    assert assembler.flush() == []


def test_silent_stream_closes_after_other_streams_go_on() -> None:
    assembler = FailureAssembler(RULES)
    failures = feed_all(assembler, rank_lines("torchrun-different.log")[0])
    assert failures == [] and not assembler.idle
    noise = [f"[rank1]: step {n}" for n in range(STALE_MESSAGE + 1)]
    failures = feed_all(assembler, noise, start=100)
    assert [(f.rank, f.exception_type) for f in failures] == [(0, "ValueError")]
    assert assembler.idle


def test_flush_completes_open_blocks_in_line_order() -> None:
    assembler = FailureAssembler(RULES)
    per_rank = rank_lines("torchrun-different.log")
    feed_all(assembler, per_rank[3], start=1)
    feed_all(assembler, per_rank[1], start=50)
    flushed = assembler.flush()
    assert [f.rank for f in flushed] == [3, 1]
    assert assembler.idle


def test_identical_lines_of_different_streams_stay_apart() -> None:
    line = "Memory access fault by GPU node-1 (Agent handle: 0x1) on address 0x1000. Reason: Page not present."
    failures = assemble("\n".join([f"[rank0]: {line}", f"[rank1]: {line}", f"[rank0]: {line}"]))
    assert [(f.rank, f.count) for f in failures] == [(0, 2), (1, 1)]  # each rank's own repeats fold
    failures = assemble("\n".join([line, line.replace("0x1)", "0x2)"), line]))
    assert [(f.count, len(f.lines)) for f in failures] == [(3, 1)]
    other_address = line.replace("0x1000", "0x2000")
    assert len(assemble("\n".join([line, other_address]))) == 2


def test_unclassified_title_and_defaults() -> None:
    long = "RuntimeError: " + "x" * 300
    failure = only(assemble(long, rules=[]))
    assert failure.category == "unclassified" and failure.rule_id is None
    assert len(failure.title) <= 100 and failure.title.startswith("RuntimeError: xxx")
    assert failure.hint and not failure.follow_on
    summary = [f for f in assemble(fixture("torchrun-timeout.log"), rules=[]) if f.kind == "child_failed"]
    assert summary and all(f.follow_on and f.category == "unclassified" for f in summary)
    assert any(f.title.startswith("torchrun: ddp.py failed, rank ") for f in summary)


def test_rule_fields_fill_typed_attributes() -> None:
    text = "Memory access fault by GPU node-7 (Agent handle: 0x5) on address 0x7ff96a9ac000. Reason: Page not present."
    failure = only(assemble(text))
    assert (failure.gpu_node, failure.address, failure.rank) == (7, "0x7ff96a9ac000", None)
    watchdog = only(
        assemble(
            "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 5] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 ms"
        )
    )
    assert watchdog.rank == 5 and watchdog.ranks == [5]  # from the rule, there being no prefix
    assert watchdog.time is not None and watchdog.time_source == "stamp"


def test_limits() -> None:
    long_message = "ValueError: first\n" + "\n".join(f"more {n}" for n in range(100))
    failure = only(assemble('Traceback (most recent call last):\n  File "a.py", line 1, in f\n' + long_message))
    assert len(failure.message.splitlines()) == MESSAGE_LINES + 1
    indented = "ROCm error: invalid device function\n" + "\n".join(f"  detail {n}" for n in range(100))
    assert len(only(assemble(indented)).lines) == FATAL_LINES + 1
    deep = (
        "Traceback (most recent call last):\n" + '  File "a.py", line 1, in f\n    f()\n' * 5000 + "RecursionError: x"
    )
    failures = assemble(deep)
    assert failures and len(failures[0].lines) <= 2000


def test_memory_stays_bounded_with_many_tags() -> None:
    """`[stepN]:` lines look like a role's local ranks: the streams they make are capped."""
    assembler = FailureAssembler(RULES)
    feed_all(assembler, (f"[step{n}]: loss {n}" for n in range(3 * MAX_STREAMS)))
    assert len(assembler._streams) <= MAX_STREAMS
    body = fixture("errors-not_implemented_half.log").splitlines()
    failures = feed_all(assembler, [f"[step7]:{line}" for line in body]) + assembler.flush()
    assert only(failures).category == "missing_op"


def test_program_line_is_built_by_make_line() -> None:
    line = make_line("[default1]:[rank9]: KeyError: 'x'", 3, origin="a.log", last_time=5.0)
    assert line == ProgramLine(
        text="KeyError: 'x'",
        raw="[default1]:[rank9]: KeyError: 'x'",
        number=3,
        origin="a.log",
        rank=9,
        local_rank=1,
        time=5.0,
        time_source="last_stamp",
    )


# -- live: the same job run now assembles like the fixture ---------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.slow
def test_live_torchrun_job_matches_the_fixture(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun")
    env = dict(os.environ, PYTHONWARNINGS="ignore:Failed to initialize NumPy")
    run = subprocess.run(
        [torchrun, "--nproc-per-node=4", f"--master-port={free_port()}", str(TORCH / "ddp.py"), "different"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    live = assemble(run.stdout + run.stderr)

    def shape(failures: list[ProgramFailure]) -> list[tuple[object, ...]]:
        return sorted((f.rank, f.exception_type, f.category, f.message) for f in failures if f.kind == "traceback")

    assert shape(live) == shape(assemble(fixture("torchrun-different.log")))
    summary = max((f for f in live if f.kind == "child_failed"), key=lambda f: len(f.lines))
    assert summary.fields["failures"] == "4" and summary.pid is not None
