#!/usr/bin/env python3
"""`make bench`, bfloat16 part: scaled dot-product attention in bfloat16 beside mha's own float32 and
PyTorch's SDPA in bfloat16 (and float32), and both in float16, same inputs, same threads, same run.

Shapes (B, H, L = S, d) = (4, 8, 2048, 64) and (4, 8, 2048, 128), causal and not; forward
(inference mode) and forward + backward (gradients of query, key and value). The compared calls
take turns round after round (bench_variants.interleaved: the machine's bursts meet them all
alike); medians. mha in bfloat16 runs its products on the CPU's bf16 instructions where it has
AMX (TDPBF16PS tiles) or AVX512_BF16 (libxsmm's VDPBF16PS kernels) and says which; its float16
forward runs on the tiles too where there are AMX tiles (split into bfloat16 pairs, docs/bfloat16.md), on float products
elsewhere. Writes <build>/bench/bfloat16.json.

    python3 scripts/bench/bench_bfloat16.py [build dir] [--quick]   (--quick: d = 64, causal, 2 rounds)
"""
import os
import sys

import torch

import mha.torch
from mha import _mha

from bench import script_arguments, write_json  # bench.py, beside this file (the script's folder is on sys.path)
from bench_variants import interleaved

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    build, flags = script_arguments("usage: bench_bfloat16.py [build dir] [--quick]   (--quick: d = 64, 2 rounds)",
                                    needs_cli=False)
    quick = bool(flags)
    threads = torch.get_num_threads()
    rounds = 2 if quick else 5
    shapes = [(4, 8, 2048, 64)] + ([] if quick else [(4, 8, 2048, 128)])
    F = torch.nn.functional
    calls = {
        "mha bfloat16": (mha.torch.scaled_dot_product_attention, torch.bfloat16),
        "mha float32": (mha.torch.scaled_dot_product_attention, torch.float32),
        "torch bfloat16": (F.scaled_dot_product_attention, torch.bfloat16),
        "torch float32": (F.scaled_dot_product_attention, torch.float32),
        "mha float16": (mha.torch.scaled_dot_product_attention, torch.float16),
        "torch float16": (F.scaled_dot_product_attention, torch.float16),
    }
    print(f"bfloat16 SDPA beside float32 and PyTorch {torch.__version__}, {threads} threads; mha's bf16 products on "
          f"{_mha.bf16_path()}")
    print(f"{'shape (B, H, L, d)':20} {'causal':6} {'pass':8} | " + " ".join(f"{n:>15}" for n in calls) +
          f" | {'vs mha f32':>10} {'vs torch bf16':>13} {'f16 vs mha f32':>14} {'f16 vs torch f16':>16}")
    report = {"threads": threads, "torch_version": torch.__version__, "bf16_native": _mha.bf16_native(),
              "bf16_path": _mha.bf16_path(), "rows": []}
    for B, H, L, d in shapes:
        g = torch.Generator().manual_seed(0)
        base = [torch.randn(B, H, L, d, generator=g) for _ in range(4)]
        for causal in ([True] if quick else [True, False]):
            inputs = {name: [x.to(dtype) for x in base] for name, (_, dtype) in calls.items()}

            def forward(name):
                fn = calls[name][0]
                q, k, v, _ = inputs[name]

                def run():
                    with torch.inference_mode():
                        fn(q, k, v, is_causal=causal)
                return run

            def forward_backward(name):
                fn = calls[name][0]
                q, k, v, dout = inputs[name]
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                return lambda: torch.autograd.grad(fn(*leaves, is_causal=causal), leaves, dout)

            for label, make in (("forward", forward), ("fwd+bwd", forward_backward)):
                t = interleaved({name: (make(name), 1) for name in calls}, rounds)
                ours = t["mha bfloat16"]
                row = {"shape": [B, H, L, d], "causal": causal, "pass": label,
                       **{f"{name} ms": t[name] * 1e3 for name in calls},
                       "speedup vs mha float32": t["mha float32"] / ours,
                       "speedup vs torch bfloat16": t["torch bfloat16"] / ours,
                       "float16 speedup vs mha float32": t["mha float32"] / t["mha float16"],
                       "float16 speedup vs torch float16": t["torch float16"] / t["mha float16"]}
                report["rows"].append(row)
                print(f"{str((B, H, L, d)):20} {str(causal):6} {label:8} | " +
                      " ".join(f"{t[n] * 1e3:12.1f} ms" for n in calls) +
                      f" | {row['speedup vs mha float32']:9.2f}x {row['speedup vs torch bfloat16']:12.2f}x"
                      f" {row['float16 speedup vs mha float32']:13.2f}x {row['float16 speedup vs torch float16']:15.2f}x",
                      flush=True)
    path = os.path.join(build, "bench", "bfloat16.json")
    write_json(path, report)
    print(f"JSON written to {path}")


if __name__ == "__main__":
    main()
