#!/usr/bin/env python3
"""Training throughput of `mha train` beside its PyTorch twin, same configuration, same run.

    python3 scripts/bench/bench_training.py                       # the tutorial's model
    python3 scripts/bench/bench_training.py --preset wide         # width 64, 2 blocks, projection, ...
    python3 scripts/bench/bench_training.py --steps 300 --repeat 5 -- --width 32 --pre-norm

Each round runs `mha train --max-steps N` and `scripts/twin/train_twin.py bench --steps N` with the
same model and training flags, one after the other, and reads the samples/s each reports for its
training loop (batches assembled from the loaded data set, forward, cross-entropy, backward,
AdamW step; data loading and evaluation excluded, on both sides). Rounds alternate which one runs
first. The report gives every round, then the best and the median of each and their ratios: on a
shared machine other work only ever slows a run down, so the best of several rounds is the
steadiest measure of what each can do (the median is shown beside it). Both use all cores (mha:
OpenMP, PyTorch: its intra-op threads) unless --threads is given.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = {
    "tutorial": [],
    "wide": ["--width", "64", "--blocks", "2", "--input-projection", "--positions", "--pre-norm"],
}


def run(cmd: list, pattern: str) -> float:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    match = re.search(pattern, out.stdout)
    if not match:
        sys.exit(f"no throughput in the output of {' '.join(cmd)}:\n{out.stdout}\n{out.stderr}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mha", default=os.path.join(REPO_ROOT, "build", "tools", "mha", "mha"))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tutorial")
    parser.add_argument("--steps", type=int, default=200, help="training steps per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each runs both)")
    parser.add_argument("--threads", type=int, default=0, help="threads for both (default: all cores)")
    parser.add_argument("flags", nargs="*", help="more model/training flags for both (after --)")
    a = parser.parse_args()
    if not os.path.exists(a.mha):
        sys.exit(f"{a.mha}: not built (cmake --build build, or pass --mha)")
    flags = PRESETS[a.preset] + a.flags
    threads = ["--threads", str(a.threads)] if a.threads else []
    mha_cmd = [a.mha, "train", *flags, *threads, "--epochs", "1", "--max-steps", str(a.steps)]
    twin_cmd = [sys.executable, os.path.join(REPO_ROOT, "scripts", "twin", "train_twin.py"), "bench", *flags,
                *threads, "--epochs", "1", "--steps", str(a.steps)]
    print(f"configuration: {a.preset} {' '.join(a.flags)}; {a.steps} steps of batch 128 per run, {a.repeat} rounds")
    mha_rates, twin_rates = [], []
    for r in range(a.repeat):
        pair = [("mha", mha_cmd, r"([0-9.]+) samples/s\s*$"), ("twin", twin_cmd, r"twin: .*: ([0-9.]+) samples/s")]
        if r % 2:
            pair.reverse()
        for name, cmd, pattern in pair:
            rate = run(cmd, pattern)
            (mha_rates if name == "mha" else twin_rates).append(rate)
            print(f"  round {r + 1}: {name:4s} {rate:9.0f} samples/s", flush=True)
    m, t = statistics.median(mha_rates), statistics.median(twin_rates)
    bm, bt = max(mha_rates), max(twin_rates)
    print(f"median: mha {m:.0f} samples/s, PyTorch twin {t:.0f} samples/s: mha/PyTorch = {m / t:.2f}x")
    print(f"best:   mha {bm:.0f} samples/s, PyTorch twin {bt:.0f} samples/s: mha/PyTorch = {bm / bt:.2f}x")


if __name__ == "__main__":
    main()
