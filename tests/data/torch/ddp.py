"""A 4-rank torchrun job on gloo (CPU) that fails the way real jobs do.

Modes (argv[1]):
  different  each rank raises its own error (ValueError, NotImplementedError, dtype, KeyError)
  identical  every rank raises the same RuntimeError (NaN in backward)
  chained    every rank raises a chained exception; the workers use @record, so
             torchrun's ChildFailedError carries their tracebacks
  timeout    rank 0 never joins an all_reduce: gloo times out on the others
  segv       rank 2 dies of SIGSEGV (faulthandler on), the others time out
  abort      rank 1 throws a c10::Error in a C++ thread: terminate, SIGABRT
             (needs TRIAGE_CRASH_EXT, the extension generate.sh builds)
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

MODE = sys.argv[1]


def step(rank: int) -> None:
    if MODE == "identical":
        weights = torch.tensor([-1.0, 4.0], requires_grad=True)
        with torch.autograd.detect_anomaly(check_nan=True):
            torch.sqrt(weights).sum().backward()
    if MODE == "different":
        if rank == 0:
            raise ValueError("learning rate must be a float, got 'abc'")
        if rank == 1:
            torch.linalg.cholesky(torch.eye(2, dtype=torch.half))
        if rank == 2:
            torch.nn.Linear(2, 2)(torch.zeros(2, 2, dtype=torch.float64))
        if rank == 3:
            {}["missing_key"]
    if MODE == "chained":
        try:
            {}["lr"]
        except KeyError as error:
            raise ValueError(f"rank {rank}: config is missing 'lr'") from error
    if MODE == "timeout":
        if rank == 0:
            time.sleep(12)
        else:
            dist.all_reduce(torch.ones(1))
    if MODE == "segv":
        if rank == 2:
            import ctypes

            ctypes.string_at(0)
        dist.all_reduce(torch.ones(1))
    if MODE == "abort":
        if rank == 1:
            import importlib.util

            spec = importlib.util.spec_from_file_location("triage_crash", os.environ["TRIAGE_CRASH_EXT"])
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.crash_in_thread()
        dist.all_reduce(torch.ones(1))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    step(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    (record(main) if MODE == "chained" else main)()
