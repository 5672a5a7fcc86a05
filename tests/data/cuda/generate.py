#!/usr/bin/env python3
"""Produce the real CUDA failure fixtures of this folder on a machine with an NVIDIA GPU.

Each scenario is a small program that fails for real on the GPU; it runs as its own
`python3` (or `torchrun`) process under `timeout`, and its stdout+stderr, unedited, become
`<scenario>.log`. Around each scenario the kernel ring buffer is read, so the kernel lines
that one scenario caused (NVRM Xid lines, when the guest kernel runs the NVIDIA driver)
land in `<scenario>.kernel.txt`. At the end the whole kernel log is saved in the forms
`triage scan --kernel` reads (dmesg, dmesg -T, dmesg -x, dmesg -r, journalctl when there is
one), with /proc/version and `nvidia-smi -q`.

Usage (on the GPU machine; python3 must hold torch with CUDA, triton and cupy):

    cd tests/data/cuda && python3 generate.py            # writes under $OUT, else ./out

What comes back: $OUT/cuda-logs.tar.gz (everything, rewritten after each scenario, so a run
cut short still leaves what it did), $OUT/summary.txt and $OUT/timeline.tsv. Unpack with
`tar -xzf cuda-logs.tar.gz` and copy the non-empty files here (README.md says which).

Never set NCCL_NVLS_ENABLE=1 here: NVLink multicast on a shared host can put its GPUs out
of service; the three multicast-off variables are forced on for every child.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "out")
WORK = Path(os.environ.get("CUDA_FIXTURE_WORK", "/tmp/triage-cuda"))  # the scenario programs
LOGS = Path(os.environ.get("CUDA_FIXTURE_LOGS", "/tmp/triage-cuda-logs"))  # everything captured
BUDGET_S = float(os.environ.get("CUDA_FIXTURE_BUDGET_S", "560"))  # start no scenario that could end past this
STARTED = time.monotonic()

ENV = dict(os.environ)
ENV.update(
    PYTHONUNBUFFERED="1",
    NCCL_NVLS_ENABLE="0",  # KINDS.md: NVLink multicast can take a shared host's GPUs down
    TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
    NVSHMEM_DISABLE_NVLS="1",
)
ENV.pop("CUDA_LAUNCH_BLOCKING", None)

# ---------------------------------------------------------------------------------------------
# The scenario programs. Each one fails on its own; nothing here catches the final error.

PROGRAMS: dict[str, str] = {}

PROGRAMS["oom.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
model = torch.nn.Linear(4096, 4096).cuda()
x = torch.randn(64, 4096, device="cuda")
print("step 0 loss", model(x).square().mean().item())
# a batch-size bug: one activation buffer of 200 GiB, far past the 141 GB of an H200;
# refused at once, so the shared GPU is never filled
activations = torch.empty(200 * 1024**3, dtype=torch.uint8, device="cuda")
print(activations.shape)
"""

PROGRAMS["illegal_address_triton.py"] = """
import torch
import triton
import triton.language as tl


@triton.jit
def scatter_rows(out_ptr, x_ptr, n, row_offset, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    # the bug: row_offset is a byte count from the caller, used as an element index;
    # the store lands terabytes past the end of `out`
    tl.store(out_ptr + offs + row_offset, x, mask=mask)


print(f"torch {torch.__version__}, triton {triton.__version__} on {torch.cuda.get_device_name(0)}")
x = torch.randn(4096, device="cuda")
out = torch.empty_like(x)
print("launching scatter_rows")
scatter_rows[(4,)](out, x, x.numel(), 1 << 40, BLOCK=1024)
torch.cuda.synchronize()
print("checksum", out.sum().item())
"""

PROGRAMS["illegal_address_cupy.py"] = """
import cupy as cp

poke = cp.RawKernel(r'''
extern "C" __global__ void poke(const float* src, unsigned long long dst_addr) {
    float* dst = reinterpret_cast<float*>(dst_addr);  // a wild pointer from the host
    dst[threadIdx.x] = src[threadIdx.x];
}
''', "poke")

print(f"cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
src = cp.ones(32, dtype=cp.float32)
poke((1,), (32,), (src, cp.uint64(0x100)))
cp.cuda.runtime.deviceSynchronize()
print("done")
"""

PROGRAMS["device_assert.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
x = torch.arange(10, device="cuda")
idx = torch.tensor([20], device="cuda")  # past the end of a 10-element tensor
y = x[idx]
print(y.tolist())
"""

PROGRAMS["device_assert_nll.py"] = """
import torch
import torch.nn.functional as F

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
model = torch.nn.Linear(32, 10).cuda()
x = torch.randn(8, 32, device="cuda")
target = torch.randint(0, 10, (8,), device="cuda")
target[3] = 12  # a label outside the 10 classes the head has
loss = F.cross_entropy(model(x), target)
loss.backward()
print("step 0 loss", loss.item())
"""

PROGRAMS["dtype_mm.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
b = torch.randn(64, 64, device="cuda")  # float32
print(torch.mm(a, b).sum().item())
"""

PROGRAMS["dtype_linear.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
batch = torch.randn(8, 64, device="cuda").to(torch.bfloat16)  # bf16 data, fp32 weights, no autocast
loss = model(batch).square().mean()
print("step 0 loss", loss.item())
"""

PROGRAMS["dtype_gradscaler.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
model = torch.nn.Linear(64, 64).cuda().half()  # fp16 master weights: GradScaler refuses them
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(8, 64, device="cuda", dtype=torch.float16)
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).float().square().mean()
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
print("step 0 loss", loss.item())
"""

# missing_op: probe a few ops that may lack a CUDA kernel for a dtype; keep the first that
# raises NotImplementedError, then run it again with nothing catching it.
MISSING_OP_PROBE = """
import json, sys, traceback
import torch

def cuda(*shape, dtype):
    return torch.ones(*shape, device="cuda").to(dtype)

CANDIDATES = [
    ("matmul int64", lambda: cuda(4, 4, dtype=torch.long) @ cuda(4, 4, dtype=torch.long)),
    ("topk bool", lambda: cuda(8, dtype=torch.bool).topk(2)),
    ("exp complex32", lambda: cuda(4, dtype=torch.chalf).exp()),
    ("cumsum complex32", lambda: cuda(4, dtype=torch.chalf).cumsum(0)),
    ("sort complex32", lambda: cuda(4, dtype=torch.chalf).sort()),
    ("add uint16", lambda: cuda(4, dtype=torch.uint16) + cuda(4, dtype=torch.uint16)),
    ("median bool", lambda: cuda(8, dtype=torch.bool).median()),
    ("erfinv float16", lambda: cuda(4, dtype=torch.half).erfinv()),
]
BACKEND_CANDIDATES = [
    ("mkldnn_linear", lambda: torch.ops.aten.mkldnn_linear(cuda(2, 4, dtype=torch.float), cuda(3, 4, dtype=torch.float))),
    ("fbgemm_linear_fp16_weight", lambda: torch.ops.aten.fbgemm_linear_fp16_weight(
        cuda(2, 4, dtype=torch.float), cuda(4, dtype=torch.float), cuda(3, dtype=torch.float))),
    ("mkldnn_reorder_conv2d_weight", lambda: torch._C._nn.mkldnn_reorder_conv2d_weight(cuda(4, 4, 3, 3, dtype=torch.float))),
]
found = {}
for group, candidates in (("dtype", CANDIDATES), ("backend", BACKEND_CANDIDATES)):
    for name, fn in candidates:
        try:
            fn()
            torch.cuda.synchronize()
            print(f"{group} {name}: ran", file=sys.stderr)
        except Exception as error:
            print(f"{group} {name}: {type(error).__name__}: {str(error).splitlines()[0]}", file=sys.stderr)
            if isinstance(error, NotImplementedError) and group not in found:
                found[group] = name
print(json.dumps(found))
"""

MISSING_OP_RUN = """
import torch

def cuda(*shape, dtype):
    return torch.ones(*shape, device="cuda").to(dtype)

CANDIDATES = {
    "matmul int64": lambda: cuda(4, 4, dtype=torch.long) @ cuda(4, 4, dtype=torch.long),
    "topk bool": lambda: cuda(8, dtype=torch.bool).topk(2),
    "exp complex32": lambda: cuda(4, dtype=torch.chalf).exp(),
    "cumsum complex32": lambda: cuda(4, dtype=torch.chalf).cumsum(0),
    "sort complex32": lambda: cuda(4, dtype=torch.chalf).sort(),
    "add uint16": lambda: cuda(4, dtype=torch.uint16) + cuda(4, dtype=torch.uint16),
    "median bool": lambda: cuda(8, dtype=torch.bool).median(),
    "erfinv float16": lambda: cuda(4, dtype=torch.half).erfinv(),
    "mkldnn_linear": lambda: torch.ops.aten.mkldnn_linear(cuda(2, 4, dtype=torch.float), cuda(3, 4, dtype=torch.float)),
    "fbgemm_linear_fp16_weight": lambda: torch.ops.aten.fbgemm_linear_fp16_weight(
        cuda(2, 4, dtype=torch.float), cuda(4, dtype=torch.float), cuda(3, dtype=torch.float)),
    "mkldnn_reorder_conv2d_weight": lambda: torch._C._nn.mkldnn_reorder_conv2d_weight(cuda(4, 4, 3, 3, dtype=torch.float)),
}

import sys
name = sys.argv[1]
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: {name}")
result = CANDIDATES[name]()
torch.cuda.synchronize()
print(result)
"""

PROGRAMS["nan_anomaly.py"] = """
import torch

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
torch.autograd.set_detect_anomaly(True)
w = torch.nn.Parameter(torch.tensor([-1.0, 4.0, 9.0], device="cuda"))  # one weight went negative
opt = torch.optim.SGD([w], lr=0.01)
for step in range(3):
    loss = torch.sqrt(w).sum()
    print(f"step {step} loss {loss.item():.4f}")
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# torchrun, 2 processes on a 1-GPU machine.
PROGRAMS["ddp_same_gpu.py"] = """
import os
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.cuda.set_device(0)  # the bug: LOCAL_RANK ignored, every rank on GPU 0
dist.init_process_group("nccl")
print(f"rank {rank}/{dist.get_world_size()} on cuda:{torch.cuda.current_device()}")
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {rank}: all_reduce ok, {t[0].item()}")
dist.destroy_process_group()
"""

PROGRAMS["ddp_gloo_timeout.py"] = """
import datetime as dt
import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=dt.timedelta(seconds=20))
rank = dist.get_rank()
torch.cuda.set_device(0)
print(f"rank {rank}/{dist.get_world_size()} up")
grad = torch.ones(1 << 16)
if rank == 1:
    # the bug: rank 1 skips this step's gradient all_reduce (an early `continue` on it alone)
    print("rank 1: skipping sync this step")
    time.sleep(90)
else:
    dist.all_reduce(grad)
    print("rank 0: all_reduce ok")
dist.destroy_process_group()
"""

PROGRAMS["ddp_nccl_watchdog.py"] = """
import datetime as dt
import os
import torch
import torch.distributed as dist

# one GPU for two ranks: the default group is gloo, and NCCL carries rank 0's collectives
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(0)
nccl = dist.new_group(ranks=[0], backend="nccl", timeout=dt.timedelta(seconds=20))
print(f"rank {rank}/{dist.get_world_size()} up")
if rank == 0:
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t, group=nccl)
    torch.cuda.synchronize()
    print("rank 0: warm-up all_reduce ok")
    # a kernel stuck ahead of the collective on the stream (about 40 s of spinning at full clock):
    # the all_reduce cannot finish within the 20 s the group allows
    torch.cuda._sleep(80_000_000_000)
    dist.all_reduce(t, group=nccl)
    torch.cuda.synchronize()
    print("rank 0: second all_reduce ok")
dist.barrier()
dist.destroy_process_group()
"""


# ---------------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(message, flush=True)


def header(name: str) -> None:
    bar = "=" * 78
    say(f"\n{bar}\n== scenario {name}  (t+{time.monotonic() - STARTED:.0f}s)\n{bar}")


def uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return -1.0


def capture(cmd: list[str] | str, timeout: float = 30) -> tuple[int, str]:
    """stdout+stderr of a helper command, never raising."""
    try:
        done = subprocess.run(
            cmd,
            shell=isinstance(cmd, str),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            text=True,
            errors="replace",
        )
        return done.returncode, done.stdout
    except (OSError, subprocess.SubprocessError) as error:
        return -1, f"{type(error).__name__}: {error}\n"


def dmesg_lines() -> list[str]:
    rc, text = capture(["dmesg"])
    return text.splitlines() if rc == 0 else []


def new_kernel_lines(before: list[str], after: list[str]) -> list[str]:
    """Lines of `after` past `before` (the ring buffer may have rolled: match on the last line)."""
    if not before:
        return after
    if after[: len(before)] == before:
        return after[len(before) :]
    last = before[-1]
    for i in range(len(after) - 1, -1, -1):
        if after[i] == last:
            return after[i + 1 :]
    return after


TIMELINE: list[dict[str, object]] = []


def pack() -> None:
    """(Re)write $OUT/cuda-logs.tar.gz, summary.txt and timeline.tsv from LOGS."""
    OUT.mkdir(parents=True, exist_ok=True)
    (LOGS / "timeline.json").write_text(json.dumps(TIMELINE, indent=1) + "\n")
    rows = ["name\trc\tseconds\twall_start\twall_end\tuptime_start\tuptime_end\tkernel_lines\tcommand"]
    for t in TIMELINE:
        rows.append(
            "\t".join(
                str(t[k])
                for k in (
                    "name",
                    "rc",
                    "seconds",
                    "wall_start",
                    "wall_end",
                    "uptime_start",
                    "uptime_end",
                    "kernel_lines",
                    "command",
                )
            )
        )
    (LOGS / "timeline.tsv").write_text("\n".join(rows) + "\n")
    shutil.copy(LOGS / "timeline.tsv", OUT / "timeline.tsv")
    tmp = OUT / "cuda-logs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(LOGS, arcname="cuda-logs")
    tmp.rename(OUT / "cuda-logs.tar.gz")


def run_scenario(name: str, argv: list[str], *, timeout: int = 120, env: dict[str, str] | None = None) -> int | None:
    if time.monotonic() - STARTED + timeout + 15 > BUDGET_S:
        say(f"-- skipping {name}: its {timeout}s could run past the {BUDGET_S:.0f}s budget")
        return None
    header(name)
    command = ["timeout", "-k", "10", str(timeout), *argv]
    say("$ " + " ".join(command))
    before = dmesg_lines()
    wall_start = dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="microseconds")
    up_start = uptime()
    t0 = time.monotonic()
    with open(LOGS / f"{name}.log", "wb") as log:
        rc = subprocess.run(command, cwd=WORK, env=env or ENV, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - t0
    time.sleep(1.0)  # let the driver's Xid lines reach the ring buffer
    fresh = new_kernel_lines(before, dmesg_lines())
    if fresh:
        (LOGS / f"{name}.kernel.txt").write_text("\n".join(fresh) + "\n")
    TIMELINE.append(
        {
            "name": name,
            "rc": rc,
            "seconds": round(seconds, 1),
            "wall_start": wall_start,
            "wall_end": dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="microseconds"),
            "uptime_start": up_start,
            "uptime_end": uptime(),
            "kernel_lines": len(fresh),
            "command": " ".join(command),
        }
    )
    tail = (LOGS / f"{name}.log").read_text(errors="replace").splitlines()[-6:]
    say(f"-- {name}: rc={rc} in {seconds:.1f}s, {len(fresh)} new kernel line(s); log tail:")
    for line in tail:
        say("   | " + line[:200])
    for line in fresh[:12]:
        say("   k " + line[:200])
    pack()
    return rc


def torchrun() -> list[str]:
    found = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if Path(found).exists():
        return [found]
    return [sys.executable, "-m", "torch.distributed.run"]


def save(name: str, cmd: list[str] | str, timeout: float = 60) -> None:
    rc, text = capture(cmd, timeout)
    shown = cmd if isinstance(cmd, str) else " ".join(cmd)
    if text.strip():
        (LOGS / name).write_text(text)
    say(f"-- {name}: `{shown}` rc={rc}, {len(text.splitlines())} line(s)")


def system_info() -> None:
    save("proc-version.txt", ["cat", "/proc/version"])
    save("uname.txt", ["uname", "-a"])
    save("nvidia-driver-version.txt", ["cat", "/proc/driver/nvidia/version"])
    save("nvidia-smi.txt", ["nvidia-smi"])
    save("nvidia-smi-q.txt", "nvidia-smi -q | head -50")
    save(
        "python-env.txt",
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys, torch, triton
                print("python", sys.version.split()[0], sys.executable)
                print("torch", torch.__version__, "cuda", torch.version.cuda)
                print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
                print("triton", triton.__version__)
                print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
                try:
                    import cupy; print("cupy", cupy.__version__)
                except Exception as e: print("cupy", e)
                """
            ),
        ],
        timeout=120,
    )
    save("btime.txt", "grep btime /proc/stat; date -d @$(awk '/btime/{print $2}' /proc/stat) -Iseconds; date -Iseconds")


def kernel_logs() -> None:
    header("kernel logs")
    save("dmesg.txt", ["dmesg"])
    save("dmesg-T.txt", ["dmesg", "-T"])
    save("dmesg-x.txt", ["dmesg", "-x"])
    save("dmesg-r.txt", ["dmesg", "-r"])
    save("dmesg-time-format-iso.txt", ["dmesg", "--time-format=iso"])
    if shutil.which("journalctl"):
        save("journal-short-iso.txt", ["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso"])
        save("journal.json", ["journalctl", "-k", "-b", "--no-pager", "-o", "json"])
    else:
        say("-- journalctl: not installed")
    # /dev/kmsg records, read without blocking
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        records = []
        while True:
            try:
                records.append(os.read(fd, 8192))
            except BlockingIOError:
                break
            except OSError as error:  # EPIPE when a record was overwritten: keep reading
                if error.errno == 32:
                    continue
                raise
        os.close(fd)
        (LOGS / "kmsg.txt").write_bytes(b"".join(records))
        say(f"-- kmsg.txt: {len(records)} record(s)")
    except OSError as error:
        say(f"-- /dev/kmsg: {error}")
    _, text = capture("dmesg | grep -ci 'NVRM'")
    say(f"-- NVRM lines in dmesg: {text.strip()}")
    _, text = capture("dmesg | grep -i 'xid'")
    say("-- Xid lines:\n" + (text if text.strip() else "   (none)"))


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.rmtree(LOGS, ignore_errors=True)
    WORK.mkdir(parents=True)
    LOGS.mkdir(parents=True)
    for filename, source in PROGRAMS.items():
        (WORK / filename).write_text(textwrap.dedent(source).lstrip())
    (WORK / "missing_op_probe.py").write_text(textwrap.dedent(MISSING_OP_PROBE).lstrip())
    (WORK / "missing_op.py").write_text(textwrap.dedent(MISSING_OP_RUN).lstrip())
    say(f"OUT={OUT} WORK={WORK} LOGS={LOGS} python={sys.executable}")
    system_info()
    pack()

    py = [sys.executable]
    run_scenario("oom", [*py, "oom.py"])
    run_scenario("dtype_mm", [*py, "dtype_mm.py"])
    run_scenario("dtype_linear", [*py, "dtype_linear.py"])
    run_scenario("dtype_gradscaler", [*py, "dtype_gradscaler.py"])

    header("missing_op probe")
    _, text = capture([sys.executable, str(WORK / "missing_op_probe.py")], timeout=120)
    (LOGS / "missing_op.probe.txt").write_text(text)
    say(text)
    found: dict[str, str] = {}
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            break
    if "dtype" in found:
        run_scenario("missing_op", [*py, "missing_op.py", found["dtype"]])
    if "backend" in found:
        run_scenario("missing_op_backend", [*py, "missing_op.py", found["backend"]])

    run_scenario("nan_anomaly", [*py, "nan_anomaly.py"])
    run_scenario("device_assert", [*py, "device_assert.py"])
    run_scenario("device_assert_nll", [*py, "device_assert_nll.py"])
    run_scenario("illegal_address", [*py, "illegal_address_triton.py"])
    blocking = dict(ENV, CUDA_LAUNCH_BLOCKING="1")
    run_scenario("illegal_address_blocking", [*py, "illegal_address_triton.py"], env=blocking)
    run_scenario("illegal_address_cupy", [*py, "illegal_address_cupy.py"])

    tr = [*torchrun(), "--standalone", "--nproc_per_node=2"]
    nccl_env = dict(ENV, NCCL_DEBUG="WARN")
    run_scenario("torchrun_nccl_same_gpu", [*tr, "ddp_same_gpu.py"], timeout=180, env=nccl_env)
    run_scenario("torchrun_gloo_timeout", [*tr, "ddp_gloo_timeout.py"], timeout=180)
    run_scenario("torchrun_nccl_watchdog", [*tr, "ddp_nccl_watchdog.py"], timeout=180, env=nccl_env)

    kernel_logs()
    pack()
    header("summary")
    lines = [f"{t['name']}: rc={t['rc']} {t['seconds']}s kernel_lines={t['kernel_lines']}" for t in TIMELINE]
    lines.append(f"total {time.monotonic() - STARTED:.0f}s")
    (OUT / "summary.txt").write_text("\n".join(lines) + "\n")
    say("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
