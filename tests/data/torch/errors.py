"""Real PyTorch failures on a CPU-only build, one per case name (see generate.sh).

Each case raises and lets Python print the traceback, so the fixture holds exactly
what a training job would print. Run: python errors.py CASE
"""

import sys

import torch


class TrainerConfigError(ValueError):
    """A custom exception from a dotted module, as trainers define them."""


TrainerConfigError.__module__ = "trainer.checks"


def chained() -> None:
    config: dict[str, float] = {}
    try:
        config["learning_rate"]
    except KeyError as error:
        try:
            raise TrainerConfigError("learning_rate missing from config") from error
        except TrainerConfigError:
            torch.zeros(2, 3) @ torch.zeros(2, 3)  # a second failure while handling the first


def not_implemented_half() -> None:
    torch.linalg.cholesky(torch.eye(4, dtype=torch.half))


def sparse_backend() -> None:
    torch.eye(3).to_sparse().view(9)


def cuda_not_compiled() -> None:
    torch.zeros(4, device="cuda")


def nan_anomaly() -> None:
    torch.autograd.set_detect_anomaly(True)
    weights = torch.tensor([-1.0, 4.0], requires_grad=True)
    loss = torch.sqrt(weights).sum()
    loss.backward()


def dtype_mismatch() -> None:
    layer = torch.nn.Linear(8, 8)
    layer(torch.zeros(2, 8, dtype=torch.float64))


def cpu_oom() -> None:
    torch.empty(1 << 50, dtype=torch.uint8)


def nccl_missing() -> None:
    import os

    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)


def keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def custom_error() -> None:
    raise TrainerConfigError("per_device_train_batch_size must be positive, got 0")


def exception_group() -> None:
    def load(shard: int) -> None:
        torch.load(f"/nonexistent/shard-{shard}.pt")

    errors: list[Exception] = []
    for shard in range(2):
        try:
            load(shard)
        except FileNotFoundError as error:
            errors.append(error)
    raise ExceptionGroup("2 data shards failed to load", errors)


CASES = {name: func for name, func in globals().items() if callable(func) and not name.startswith("_")}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
