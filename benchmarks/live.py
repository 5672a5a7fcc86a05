"""The live daemon: how fast an incident shows, and what the daemon costs the node.

Starts `triage serve` (no kernel source, one watched directory, a fresh state
directory) and measures, printing a table:

- latency from a traceback's last line written to the incident visible over
  HTTP, p50/p99 over N incidents (each traceback stamped an hour after the
  previous one, so each is an incident of its own);
- the daemon's CPU (utime+stime from /proc) while idle, and while a log grows at
  1 MB/s with the usual content (progress bars, loss dicts, INFO lines);
- its RSS after a 1 GiB log went through it.

Usage: python benchmarks/live.py [--incidents 200] [--gib 1.0] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")

TRACEBACK = """Traceback (most recent call last):
  File "/opt/LLaMA-Factory/src/llamafactory/train/tuner.py", line 50, in run_exp
    run_sft(model_args, data_args, training_args, finetuning_args, generating_args, callbacks)
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
RuntimeError: HIP error: an illegal memory access was encountered
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if line.startswith("Vm")}
    return values["VmRSS"] / 1024, values["VmHWM"] / 1024


def get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


def filler(rng: random.Random, size: int) -> bytes:
    lines = []
    total = 0
    step = rng.randint(0, 10**6)
    while total < size:
        step += 1
        bar = "".join(f"\r{p:3d}%|{'#' * (p // 10):10s}| {step}/99999 [00:01<00:09, 2.0it/s]" for p in range(0, 100, 9))
        loss = f"{{'loss': {rng.uniform(0.5, 2):.4f}, 'grad_norm': {rng.uniform(0.1, 3):.4f}, 'epoch': {step}}}"
        info = f"[INFO|2026-11-30 10:00:00,000] llamafactory.train.callbacks:123 >> step {step}"
        line = f"{bar}\n{loss}\n{info}\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--incidents", type=int, default=200)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the idle and 1 MB/s phases")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="triage-live-"))
    logs = work / "logs"
    logs.mkdir()
    port = free_port()
    daemon_log = (work / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "triage", "serve", "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(work / "state"), "--watch", str(logs / "*.log"), "--kernel-source", "none"],
        cwd=REPO, stderr=daemon_log,
    )  # fmt: skip
    rng = random.Random(3)
    try:
        for _ in range(300):
            try:
                get(port, "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        rows: list[tuple[str, str]] = []

        # Latency: the traceback's last line written -> visible over HTTP.
        log = logs / "rank0.log"
        latencies = []
        start_stamp = time.time() - args.incidents * 3700
        with log.open("a", buffering=1) as out:
            for number in range(args.incidents):
                out.write(filler(rng, 2000).decode())
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start_stamp + number * 3700))
                out.write(f"[INFO|{stamp},000] llamafactory.train: step {number}\n{TRACEBACK}")
                out.flush()
                written = time.perf_counter()
                while len(get(port, f"/incidents?limit={number + 2}")["incidents"]) <= number:
                    time.sleep(0.005)
                latencies.append(time.perf_counter() - written)
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        rows.append(("latency p50 / p99", f"{statistics.median(latencies) * 1000:.0f} ms / {p99 * 1000:.0f} ms"))

        # CPU while idle.
        time.sleep(2)
        before = cpu_seconds(daemon.pid)
        time.sleep(args.seconds)
        rows.append(("CPU idle", f"{(cpu_seconds(daemon.pid) - before) / args.seconds * 100:.2f} % of a core"))

        # CPU while a log grows at 1 MB/s.
        grow = logs / "rank1.log"
        chunk = filler(rng, 100_000)
        before = cpu_seconds(daemon.pid)
        began = time.perf_counter()
        with grow.open("ab") as out:
            for tick in range(int(args.seconds * 10)):
                out.write(chunk)
                out.flush()
                time.sleep(max(0.0, began + (tick + 1) * 0.1 - time.perf_counter()))
        spent = time.perf_counter() - began
        time.sleep(1.5)
        cpu = cpu_seconds(daemon.pid) - before
        rows.append(("CPU at 1 MB/s", f"{cpu / (spent + 1.5) * 100:.1f} % of a core"))

        # RSS after a GiB of log.
        big = logs / "rank2.log"
        block = filler(rng, 8 << 20)
        target = int(args.gib * (1 << 30))
        began = time.perf_counter()
        with big.open("ab") as out:
            written_bytes = 0
            while written_bytes < target:
                out.write(block)
                written_bytes += len(block)
        while True:
            files = next(s for s in get(port, "/healthz")["sources"] if s["name"] == "files")
            offsets = json.dumps(files.get("detail", {}))
            if str(written_bytes) in offsets or time.perf_counter() - began > 600:
                break
            time.sleep(0.5)
        rss, peak = rss_mib(daemon.pid)
        rows.append((f"RSS after {args.gib:g} GiB", f"{rss:.0f} MiB (peak {peak:.0f} MiB)"))
        rows.append((f"{args.gib:g} GiB read in", f"{time.perf_counter() - began:.1f} s"))
        for name, value in rows:
            print(f"{name:>22}  {value}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        daemon_log.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
