"""Throughput and peak memory of `triage scan` on a large training log, beside grep.

Generates a training log (default 1 GiB: tqdm progress bars joined by `\\r`, loss
dicts, INFO lines, a few real-looking tracebacks), then in the same run times

- `grep -E -c` with the same prefilter the scanner uses (its literal set, caseless
  literals spelled as bracket classes), LC_ALL=C;
- `triage scan --log FILE --format json` in a fresh process, with its peak RSS;

and, to show that memory stays flat in the file size, the scan of a file a quarter
the size. Prints a table; numbers go into benchmarks/README.md by hand.

Usage: python benchmarks/scan.py [--size-mb 1024] [--keep] [--engine auto|hyperscan|python]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"

TRACEBACK = """Traceback (most recent call last):
  File "/opt/LLaMA-Factory/src/llamafactory/launcher.py", line 23, in <module>
    launch()
  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2481, in _inner_training_loop
    tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347, in backward
    _engine_run_backward(
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.95 GiB. GPU 3 has a total capacity of 191.98 GiB \
of which 1.02 GiB is free. Of the allocated memory 186.21 GiB is allocated by PyTorch, and 2.11 GiB is reserved \
by PyTorch but unallocated.
"""


def generate(path: Path, size: int, seed: int = 7) -> int:
    """Write a training log of about `size` bytes; returns how many tracebacks it holds."""
    rng = random.Random(seed)
    written = 0
    tracebacks = 0
    step = 0
    with path.open("wb", buffering=8 * 1024 * 1024) as out:
        while written < size:
            parts: list[str] = []
            for _ in range(200):
                step += 1
                bar = "".join(
                    f"\r{p:3d}%|{'█' * (p // 10)}{' ' * (10 - p // 10)}| {step}/{step + 900} "
                    f"[00:{p % 60:02d}<01:{(100 - p) % 60:02d}, {rng.uniform(1, 3):.2f}it/s]"
                    for p in range(0, 100, 7)
                )
                parts.append(bar + "\n")
                loss = rng.uniform(0.5, 2.5)
                parts.append(
                    f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.1, 4):.6f}, "
                    f"'learning_rate': {rng.uniform(1e-6, 1e-4):.4e}, 'epoch': {step / 10000:.2f}}}\n"
                )
                hour, minute, second = (step // 3600) % 24, (step // 60) % 60, step % 60
                parts.append(
                    f"[INFO|2026-11-30 {hour:02d}:{minute:02d}:{second:02d},{rng.randint(0, 999):03d}] "
                    f"llamafactory.train.callbacks:{rng.randint(100, 200)} >> step {step} tokens/s "
                    f"{rng.randint(1000, 9000)} mem {rng.uniform(100, 180):.1f}GiB\n"
                )
            if rng.random() < 0.002:
                parts.append("".join(f"[rank{r}]:" + line + "\n" for r in range(2) for line in TRACEBACK.splitlines()))
                tracebacks += 1
            blob = "".join(parts).encode("utf-8")
            out.write(blob)
            written += len(blob)
    return tracebacks


def grep_pattern(literals: list[tuple[str, bool]]) -> str:
    """The scanner's literal set as one ERE; caseless letters as [xX] classes."""
    alternatives = []
    for text, caseless in literals:
        escaped = re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)
        if caseless:
            escaped = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in escaped)
        alternatives.append(escaped)
    return "|".join(alternatives)


def run_timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS of the child in KiB, and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed, max(peak, before), done.stdout


def measure_rss(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Like run_timed, but the peak RSS of this one child (via /usr/bin/time when present)."""
    if Path("/usr/bin/time").exists():
        wrapped = ["/usr/bin/time", "-f", "%M", *command]
        start = time.perf_counter()
        done = subprocess.run(wrapped, capture_output=True, text=True, env=env, check=False)
        elapsed = time.perf_counter() - start
        if done.returncode not in (0, 1):  # grep -c: 1 means no line matched
            raise SystemExit(f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
        peak = int(done.stderr.strip().splitlines()[-1])
        return elapsed, peak, done.stdout
    return run_timed(command, env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--engine", default="auto", choices=("auto", "hyperscan", "python"))
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from triage.engine import Engine

    engine = Engine.load()
    literals = [(lit.text, lit.caseless) for lit in engine.prefilter.literals]
    DATA.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LC_ALL": "C", "TRIAGE_PREFILTER": args.engine}
    triage = [sys.executable, "-m", "triage", "scan", "--format", "json", "--log"]
    pattern = grep_pattern(literals)

    print(f"prefilter: {len(literals)} literals, engine {engine.prefilter.engine} (asked: {args.engine})")
    print(f"{'file':>10} {'tool':>8} {'seconds':>8} {'MB/s':>8} {'peak RSS MiB':>13}  result")
    rows = []
    for size_mb in (args.size_mb // 4, args.size_mb):
        path = DATA / f"train-{size_mb}mb.log"
        if not path.exists() or path.stat().st_size < size_mb * 1024 * 1024:
            generate(path, size_mb * 1024 * 1024)
        size = path.stat().st_size
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        seconds, peak, out = measure_rss(["grep", "-E", "-c", pattern, str(path)], env)
        rows.append((size_mb, "grep -E", seconds, size / seconds / 1e6, peak / 1024, f"{out.strip()} lines"))
        seconds, peak, out = measure_rss([*triage, str(path)], env)
        incidents = json.loads(out)["incidents"]
        stats = json.loads(out)["inputs"][0]
        result = f"{len(incidents)} incident(s), {stats['failures']} failures, {stats['candidates']} candidates"
        rows.append((size_mb, "triage", seconds, size / seconds / 1e6, peak / 1024, result))
        for row in rows[-2:]:
            print(f"{row[0]:>8}MB {row[1]:>8} {row[2]:8.2f} {row[3]:8.0f} {row[4]:13.1f}  {row[5]}")
        if not args.keep:
            path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
