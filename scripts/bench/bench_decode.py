#!/usr/bin/env python3
"""`make bench`, decode part: one generation step (one query row per head) against a KV cache,
mha beside PyTorch's scaled_dot_product_attention, same shapes, dtypes and threads, same run.

Runs `mha bench --decode` (which also measures the machine's read bandwidth, a parallel sum of
1 GiB after each step in the same rounds, per row: the host's bandwidth drifts over a run), then PyTorch on the same grid: B in {1, 8}, Hq = 32, Hkv in {8, 32}, d = 128,
S in {1024, 4096, 16384, 32768}, cache float32 and bfloat16 (both: query, key and value all in
that dtype; PyTorch with enable_gqa for Hkv < Hq). Each step reads
another copy of the cache, enough copies to fill 512 MiB, so no last-level cache holds it
between steps (as each layer of a model reads its own cache). Prints GB/s of keys and values
read, the fraction of the read bandwidth, and mha / PyTorch; writes build/bench/decode.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import median_seconds, script_arguments, write_json  # bench.py, beside this file (the script's folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def torch_step_seconds(row, threads, repeats):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[row["dtype"]]
    B, Hq, Hkv, S, d = row["batch"], row["query_heads"], row["kv_heads"], row["keys"], row["head_dim"]
    size = 2 * B * Hkv * S * d * (4 if dtype == torch.float32 else 2)
    copies = max(1, min(64, -(-(512 << 20) // size)))
    q = torch.empty(B, Hq, 1, d, dtype=dtype).uniform_(-1, 1)
    caches = [(torch.empty(B, Hkv, S, d, dtype=dtype).uniform_(-1, 1),
               torch.empty(B, Hkv, S, d, dtype=dtype).uniform_(-1, 1)) for _ in range(copies)]

    def step():
        for k, v in caches:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=Hkv != Hq)

    with torch.inference_mode():
        return median_seconds(step, repeats) / copies


def main():
    build, _ = script_arguments("usage: bench_decode.py [build dir]", flags=())
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    os.makedirs(os.path.join(build, "bench"), exist_ok=True)
    path = os.path.join(build, "bench", "decode.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run([os.path.join(build, "tools", "mha", "mha"), "bench", "--decode", "--json", path], check=True, env=env)
    with open(path) as f:
        report = json.load(f)
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    print(f"\nDecode step beside PyTorch {torch_version} SDPA, {threads} threads; %read: of the read bandwidth "
          f"measured in the row's own rounds")
    print(f"{'cache':9} {'B':>2} {'Hkv':>4} {'S':>6} | {'read':>6} | {'mha ms':>8} {'GB/s':>6} {'%read':>6} | "
          f"{'torch ms':>8} {'GB/s':>6} {'%read':>6} | {'torch/mha':>9}")
    for row in report["decode"]:
        mha_s = row["step_ms"] / 1e3
        bandwidth = row["read_gb_per_s"]
        line = (f"{row['dtype']:9} {row['batch']:>2} {row['kv_heads']:>4} {row['keys']:>6} | {bandwidth:6.1f} | "
                f"{mha_s * 1e3:8.3f} {row['gb_per_s']:6.1f} {100 * row['gb_per_s'] / bandwidth:5.0f}% | ")
        if torch_version:
            t = torch_step_seconds(row, threads, 5)
            gbs = row["cache_bytes"] / t / 1e9
            row["torch_step_ms"] = t * 1e3
            row["torch_gb_per_s"] = gbs
            line += f"{t * 1e3:8.3f} {gbs:6.1f} {100 * gbs / bandwidth:5.0f}% | {t / mha_s:8.2f}x"
        print(line, flush=True)
    report["torch_version"] = torch_version
    write_json(path, report)
    print(f"JSON written to {path}")


if __name__ == "__main__":
    main()
