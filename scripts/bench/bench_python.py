#!/usr/bin/env python3
"""`make bench`, Python part: mha from PyTorch beside PyTorch's own SDPA and nn.MultiheadAttention,
in the same run.

For each shape (B, H, L=S, d): the median time of mha.torch.scaled_dot_product_attention and of
torch.nn.functional.scaled_dot_product_attention, forward (inference mode) and forward+backward,
and the cost of the layers above the C++ kernel: the same forward through the numpy API and
straight through the binding (_mha.sdpa_forward on preallocated arrays: the kernel plus
nanobind's argument conversion), whose difference from mha.torch is the per-call overhead of
the operator, autograd and the shape handling. Then, for each module shape (N, L, E, heads):
mha.torch.MultiheadAttention against nn.MultiheadAttention with the same weights, batch_first,
need_weights=False (what a model asks for), forward (eval, inference mode: PyTorch takes its
fused fast path where it can) and forward+backward (gradients of the inputs and every parameter),
with distinct query, key and value and as self-attention (x, x, x). Threads:
torch.get_num_threads() for both (OMP_NUM_THREADS, default all cores). Writes
<build>/bench/python.json.

    python3 scripts/bench/bench_python.py [build dir] [--quick]   (--quick: the small shape only)
"""
import json
import os
import sys

import numpy as np
import torch

import mha
import mha.torch
from mha import _mha

from bench import median_seconds, script_arguments  # bench.py, beside this file (the script's folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = [(1, 8, 128, 64), (4, 8, 2048, 64)]  # the small one shows the binding's overhead
MODULE_SHAPES = [(1, 128, 512, 8), (4, 2048, 512, 8)]  # (N, L, E, heads)


def bench_shape(B, H, L, d, repeats):
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, d, generator=g) for _ in range(4))
    F = torch.nn.functional
    out = {}
    with torch.inference_mode():
        out["mha_forward_ms"] = median_seconds(lambda: mha.torch.scaled_dot_product_attention(q, k, v), repeats)
        out["torch_forward_ms"] = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v), repeats)
    for name, fn in (("mha", mha.torch.scaled_dot_product_attention), ("torch", F.scaled_dot_product_attention)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out[f"{name}_forward_backward_ms"] = median_seconds(
            lambda: torch.autograd.grad(fn(*leaves), leaves, dout), repeats)
    # The layers under mha.torch, on the same arrays.
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    output, lse = np.empty((B, H, L, d), dtype=np.float32), np.empty((B, H, L))
    views = (None,) * len(_mha.views())  # Options' typed views, none given
    threads = torch.get_num_threads()
    mha.set_num_threads(threads)
    out["numpy_forward_ms"] = median_seconds(lambda: mha.scaled_dot_product_attention(qn, kn, vn), repeats)
    out["binding_forward_ms"] = median_seconds(
        lambda: _mha.sdpa_forward(qn, kn, vn, output, lse, _mha.Scoring(), views, threads), repeats)
    for k_ in list(out):
        out[k_] *= 1e3
    out["overhead_us"] = (out["mha_forward_ms"] - out["binding_forward_ms"]) * 1e3
    out["overhead_fraction"] = out["overhead_us"] / 1e3 / out["mha_forward_ms"]
    return out


def bench_module(N, L, E, heads, repeats):
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(E, heads, batch_first=True)
    ours = mha.torch.MultiheadAttention(E, heads, batch_first=True)
    ours.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(N, L, E, generator=g) for _ in range(4))
    out = {}
    for kind, inputs in (("distinct", (q, k, v)), ("self", (q, q, q))):
        for name, module in (("mha", ours), ("torch", reference)):
            module.eval()
            with torch.inference_mode():
                out[f"{kind}_{name}_forward_ms"] = median_seconds(lambda: module(*inputs, need_weights=False), repeats)
            module.train()  # dropout 0: the same computation, with autograd
            params = list(module.parameters())
            x = inputs[0].clone().requires_grad_()
            leaves = (x, x, x) if kind == "self" else tuple(t.clone().requires_grad_() for t in inputs)

            def forward_backward():
                output = module(*leaves, need_weights=False)[0]
                return torch.autograd.grad(output, list(dict.fromkeys(leaves)) + params, dout)
            out[f"{kind}_{name}_forward_backward_ms"] = median_seconds(forward_backward, repeats)
    return {k_: v_ * 1e3 for k_, v_ in out.items()}


def main():
    build, flags = script_arguments("usage: bench_python.py [build dir] [--quick]   (--quick: the first shape)")
    shapes = SHAPES[:1] if flags else SHAPES
    results = []
    for B, H, L, d in shapes:
        repeats = 200 if L <= 256 else 5
        r = dict(batch=B, heads=H, len=L, head_dim=d, **bench_shape(B, H, L, d, repeats))
        results.append(r)
    print(f"\nmha.torch vs torch.nn.functional.scaled_dot_product_attention, float32, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}; medians in ms, ratio = torch / mha (> 1: mha is faster)")
    print(f'{"shape (B, H, L=S, d)":22s} {"mha fwd":>9s} {"torch":>9s} {"ratio":>6s} {"mha f+b":>9s} {"torch":>9s} '
          f'{"ratio":>6s} {"numpy":>9s} {"binding":>9s} {"overhead":>12s}')
    for r in results:
        print(f'({r["batch"]}, {r["heads"]}, {r["len"]}, {r["head_dim"]}){"":6s} {r["mha_forward_ms"]:9.3f} '
              f'{r["torch_forward_ms"]:9.3f} {r["torch_forward_ms"] / r["mha_forward_ms"]:6.2f} '
              f'{r["mha_forward_backward_ms"]:9.3f} {r["torch_forward_backward_ms"]:9.3f} '
              f'{r["torch_forward_backward_ms"] / r["mha_forward_backward_ms"]:6.2f} {r["numpy_forward_ms"]:9.3f} '
              f'{r["binding_forward_ms"]:9.3f} {r["overhead_us"]:6.1f} µs {100 * r["overhead_fraction"]:3.0f}%')
    print("(numpy: mha.scaled_dot_product_attention; binding: _mha.sdpa_forward on preallocated arrays; "
          "overhead: mha.torch forward minus binding)")

    modules = []
    for N, L, E, heads in MODULE_SHAPES[:len(shapes)]:
        modules.append(dict(batch=N, len=L, embed_dim=E, heads=heads,
                            **bench_module(N, L, E, heads, 50 if L <= 256 else 5)))
    print("\nmha.torch.MultiheadAttention vs torch.nn.MultiheadAttention, float32, batch_first, need_weights=False; "
          "medians in ms, ratio = torch / mha")
    print(f'{"(N, L, E, heads)":22s} {"inputs":9s} {"mha fwd":>9s} {"torch":>9s} {"ratio":>6s} {"mha f+b":>9s} '
          f'{"torch":>9s} {"ratio":>6s}')
    for r in modules:
        for kind in ("distinct", "self"):
            f = [r[f"{kind}_{n}_{p}_ms"] for p in ("forward", "forward_backward") for n in ("mha", "torch")]
            print(f'({r["batch"]}, {r["len"]}, {r["embed_dim"]}, {r["heads"]}){"":6s} {kind:9s} {f[0]:9.3f} {f[1]:9.3f} '
                  f'{f[1] / f[0]:6.2f} {f[2]:9.3f} {f[3]:9.3f} {f[3] / f[2]:6.2f}')
    os.makedirs(os.path.join(build, "bench"), exist_ok=True)
    path = os.path.join(build, "bench", "python.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"threads": torch.get_num_threads(), "torch_version": torch.__version__, "shapes": results,
                   "modules": modules}, f, indent=2)
    os.replace(path + ".tmp", path)
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
