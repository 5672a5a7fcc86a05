"""Real CUDA failures captured on an NVIDIA H200 (tests/data/cuda, README.md there) get TAXONOMY.md's labels.

Each `<scenario>.log` is the unedited stdout+stderr of a program that failed for real on the GPU;
`<scenario>.kernel.txt` is what the kernel printed while that program ran (NVRM Xid lines: the
machine was a Firecracker VM whose own kernel runs the NVIDIA driver), and `kernel-*.txt` is the
whole kernel log of the run in the forms `triage scan --kernel` reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The `run_cli` fixture of conftest.py: `triage ARGS...` in this process, giving (status, stdout, stderr).
# Its type is spelled here rather than imported, so this module imports whether or not tests/ is a package.
RunCli = Callable[..., tuple[int, str, str]]

DATA = Path(__file__).resolve().parent / "data" / "cuda"


def scan(run_cli: RunCli, *args: str) -> dict[str, Any]:
    status, out, err = run_cli("scan", "--format", "json", *args)
    assert status == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


def first_label(document: dict[str, Any]) -> tuple[str, str]:
    incidents = document["incidents"]
    assert incidents, f"no incident; inputs: {document['inputs']}"
    return incidents[0]["level"], incidents[0]["category"]


def explain(document: dict[str, Any]) -> str:
    if not document["incidents"]:
        return json.dumps(document["inputs"], indent=1)
    first = document["incidents"][0]
    return (
        f"first incident: {first['level']}/{first['category']} {first['title']!r}\n"
        f"evidence: {json.dumps(first['evidence'], indent=1)}\n"
        f"all: {[(i['level'], i['category']) for i in document['incidents']]}"
    )


# The program log alone (no kernel log given): the label comes from the program's own words.
PROGRAM_ONLY = {
    # torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB ...
    "oom": ("code", "oom"),
    # torch.AcceleratorError: CUDA error: an illegal memory access was encountered (after synchronize)
    "illegal_address": ("code", "illegal_memory_access"),
    # CUDA_LAUNCH_BLOCKING=1: RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered
    "illegal_address_blocking": ("code", "illegal_memory_access"),
    # cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access ...
    "illegal_address_cupy": ("code", "illegal_memory_access"),
    # IndexKernel.cu ... Assertion `... "index out of bounds"` failed. + CUDA error: device-side assert triggered
    "device_assert": ("code", "device_assert"),
    # Loss.cu ... Assertion `t >= 0 && t < n_classes` failed. + CUDA error: device-side assert triggered
    "device_assert_nll": ("code", "device_assert"),
    # RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::BFloat16 != float
    # (a precision mix-up, the same family as TAXONOMY's "expected scalar type ... but found ...")
    "dtype_mm": ("code", "dtype_config"),
    # RuntimeError: mat1 and mat2 must have the same dtype, but got BFloat16 and Float (bf16 batch, fp32 nn.Linear)
    "dtype_linear": ("code", "dtype_config"),
    # ValueError: Attempting to unscale FP16 gradients.
    "dtype_gradscaler": ("code", "dtype_config"),
    # NotImplementedError: "addmm_cuda" not implemented for 'Long'
    "missing_op": ("code", "missing_op"),
    # NotImplementedError: Could not run 'aten::mkldnn_linear' with arguments from the 'CUDA' backend. ...
    "missing_op_backend": ("code", "missing_op"),
    # step 0 loss nan ... RuntimeError: Function 'SqrtBackward0' returned nan values in its 0th output.
    "nan_anomaly": ("code", "nan_loss"),
    # torchrun, 2 ranks both on cuda:0: "NCCL WARN Duplicate GPU detected", DistBackendError ... ncclInvalidUsage,
    # then ChildFailedError. A NCCL setup failure caused by the job's own device mapping, with no GPU fault:
    # TAXONOMY's collective_failure ("setup failures"), code-level.
    "torchrun_nccl_same_gpu": ("code", "collective_failure"),
    # torchrun, gloo, rank 1 skips an all_reduce: "Timed out waiting 20000ms for recv operation to complete" on
    # rank 0, ChildFailedError. Not NCCL, but the same failure class: a collective timeout with no GPU fault on
    # this node, which TAXONOMY's level table names code-level; collective_failure is the category for it.
    "torchrun_gloo_timeout": ("code", "collective_failure"),
    # torchrun, NCCL: "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE,
    # ... Timeout(ms)=20000)", the process taken down (SIGABRT), ChildFailedError exitcode -6.
    "torchrun_nccl_watchdog": ("code", "collective_failure"),
}


def test_every_captured_log_has_an_expected_label() -> None:
    captured = {path.name.removesuffix(".log") for path in DATA.glob("*.log")}
    assert captured == set(PROGRAM_ONLY), "a fixture was added or removed: give it its label here"


@pytest.mark.parametrize("name", sorted(PROGRAM_ONLY))
def test_program_log_first_incident(name: str, run_cli: RunCli) -> None:
    document = scan(run_cli, "--log", str(DATA / f"{name}.log"))
    assert first_label(document) == PROGRAM_ONLY[name], explain(document)
    first = document["incidents"][0]
    assert first["evidence"], "an incident must say why it has its label"
    assert first["hint"]


# The program log with the kernel lines its own process caused (same pid, same seconds).
# Xid 31 (MMU fault) for every illegal address: TAXONOMY maps it to vm_page_fault, driver-level, and an illegal
# memory access whose page fault the kernel log shows becomes vm_page_fault. Xid 43 is app-scoped, code-level
# device_assert. The program logs carry no time stamps, so the scan correlates each pair as one window.
WITH_KERNEL_SLICE = {
    "illegal_address": ("driver", "vm_page_fault"),
    "illegal_address_blocking": ("driver", "vm_page_fault"),
    "illegal_address_cupy": ("driver", "vm_page_fault"),
    "device_assert": ("code", "device_assert"),
    "device_assert_nll": ("code", "device_assert"),
}


def test_every_kernel_slice_has_an_expected_label() -> None:
    captured = {path.name.removesuffix(".kernel.txt") for path in DATA.glob("*.kernel.txt")}
    assert captured == set(WITH_KERNEL_SLICE)


@pytest.mark.parametrize("name", sorted(WITH_KERNEL_SLICE))
def test_program_log_with_its_kernel_lines(name: str, run_cli: RunCli) -> None:
    document = scan(run_cli, "--kernel", str(DATA / f"{name}.kernel.txt"), "--log", str(DATA / f"{name}.log"))
    assert first_label(document) == WITH_KERNEL_SLICE[name], explain(document)
    first = document["incidents"][0]
    assert first["kernel_events"], "the Xid line must be part of the incident's evidence"
    assert first["program_failures"], "the program's failure must be part of the incident"


KERNEL_FORMATS = [
    "kernel-dmesg.txt",  # dmesg: [   113.306558] monotonic stamps
    "kernel-dmesg-T.txt",  # dmesg -T: [Mon Nov 30 11:24:00 2026]
    "kernel-dmesg-x.txt",  # dmesg -x: kern  :warn  : [  113.306558]
    "kernel-dmesg-r.txt",  # dmesg -r: <4>[  113.306558]
    "kernel-dmesg-iso.txt",  # dmesg --time-format=iso: 2026-11-30T11:24:00,250709+00:00
    "kernel-kmsg.txt",  # /dev/kmsg records: 4,362,113306558,c;NVRM: Xid ...
]


@pytest.mark.parametrize("kernel", KERNEL_FORMATS)
def test_whole_kernel_log_with_illegal_address(kernel: str, run_cli: RunCli) -> None:
    """The brief's pairing: the node's whole kernel log beside the illegal-address program log.

    The log has no clock, so everything is one window; the Xid 31 page faults make it driver/vm_page_fault.
    """
    document = scan(run_cli, "--kernel", str(DATA / kernel), "--log", str(DATA / "illegal_address.log"))
    assert first_label(document) == ("driver", "vm_page_fault"), explain(document)
    kernel_categories = {event["category"] for event in document["incidents"][0]["kernel_events"]}
    assert "vm_page_fault" in kernel_categories, explain(document)


@pytest.mark.parametrize("kernel", KERNEL_FORMATS)
def test_whole_kernel_log_alone(kernel: str, run_cli: RunCli) -> None:
    """Kernel log only: two Xid 43 and three Xid 31 of short-lived python3 processes on one GPU.

    The leading category is vm_page_fault. The boot line "NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100:
    FBHUB Interrupt detected. Clearing it." is the driver clearing a stale interrupt at load on every boot of
    this machine, not a RAS/ECC error: nothing may be labelled ras_error (or any other driver fault) here.
    """
    document = scan(run_cli, "--kernel", str(DATA / kernel))
    assert first_label(document) == ("driver", "vm_page_fault"), explain(document)
    categories = {incident["category"] for incident in document["incidents"]}
    assert categories <= {"vm_page_fault", "device_assert"}, explain(document)


# Collective failures beside the wall-clock kernel log of the same run. The Xid lines come from other processes
# (Xid 43: pids 673, 697; Xid 31: pids 725, 769, 797, the assert and illegal-address scenarios), all of which had
# exited before either torchrun job started (11:24:28 and 11:24:59; the last Xid is at 11:24:11); the failing
# rank 0 is pid 894 / pid 948, named in the ChildFailedError summary. TAXONOMY: a kernel
# fault attributed to another process does not make a training failure driver-level on its own, and no GPU
# reset happened: both stay code/collective_failure even though the faults fall inside the collective window.
# The unrelated page faults may still be reported as a kernel-only incident of their own (listed first, being
# driver-level), so the assertion is on the incident that holds the program's failure.
@pytest.mark.parametrize("name", ["torchrun_gloo_timeout", "torchrun_nccl_watchdog"])
def test_collective_timeout_beside_other_processes_faults(name: str, run_cli: RunCli) -> None:
    document = scan(run_cli, "--kernel", str(DATA / "kernel-dmesg-T.txt"), "--log", str(DATA / f"{name}.log"))
    crashes = [incident for incident in document["incidents"] if incident["program_failures"]]
    for crash in crashes:
        assert (crash["level"], crash["category"]) == ("code", "collective_failure"), json.dumps(
            crash["evidence"], indent=1
        )
    # one crash (the timeout, the abort after it, the torchrun summary) is one incident
    assert len(crashes) == 1, explain(document)
