"""PyTorch's accuracy bar on random shapes (docs/bfloat16.md, "Accuracy"): mha.torch's SDPA in
bfloat16/float16, forward and backward, against PyTorch's SDPA in the same type, each one's error
measured against PyTorch's SDPA in float64 on the same rounded inputs and gradient. Prints the
cases whose ratio (mha's largest error / PyTorch's, over output, dQ, dK, dV) is highest.

    .venv/bin/python scripts/accuracy/sdpa_half_vs_pytorch.py [--cases 300] [--seed 0]

Shapes: batch 1-3, GQA, query and key lengths 1-257, head sizes 3-128 (value heads of another
size too), no mask / causal / bool / broadcast bool / additive masks, (B, L, H, D) layouts."""
import argparse
import random

import torch
import torch.nn.functional as F

import mha.torch

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--cases", type=int, default=300)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
rng = random.Random(args.seed)
torch.manual_seed(args.seed)


def forward_backward(fn, dtype, q, k, v, mask, causal, gqa, dout):
    leaves = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    return [out] + list(torch.autograd.grad(out, leaves, dout.to(dtype)))


rows = []
for case in range(args.cases):
    dtype = rng.choice([torch.bfloat16, torch.float16])
    B, Hkv, G = rng.choice([1, 2, 3]), rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
    L, S = rng.choice([1, 2, 3, 7, 16, 33, 64, 100]), rng.choice([1, 4, 16, 31, 64, 130, 257])
    D = rng.choice([3, 8, 16, 17, 40, 64, 80, 96, 128])
    Dv = rng.choice([D, D, 24, 32])
    kind = rng.choice(["none", "causal", "bool", "bool (L, S)", "additive"])
    if kind == "causal" and L > S:
        continue
    sd = rng.choice([0.5, 1.0, 3.0])
    transposed = rng.random() < 0.3

    def rounded(h, n, d):  # in the half type, then widened: both calls' exact inputs
        x = torch.randn(B, n, h, d).transpose(1, 2) if transposed else torch.randn(B, h, n, d)
        return (x * sd).to(dtype).double()

    q, k, v = rounded(Hkv * G, L, D), rounded(Hkv, S, D), rounded(Hkv, S, Dv)
    mask = {"bool": lambda: torch.rand(B, Hkv * G, L, S) < 0.7, "bool (L, S)": lambda: torch.rand(L, S) < 0.7,
            "additive": lambda: torch.randn(B, 1, L, S).to(dtype)}.get(kind, lambda: None)()
    if mask is not None and mask.dtype == torch.bool:
        mask[..., 0] = True  # every row sees a key
    dout = torch.randn(B, Hkv * G, L, Dv).to(dtype).double()
    causal, gqa = kind == "causal", G > 1
    exact = forward_backward(F.scaled_dot_product_attention, torch.float64, q, k, v,
                             None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                             causal, gqa, dout)
    ours = forward_backward(mha.torch.scaled_dot_product_attention, dtype, q, k, v, mask, causal, gqa, dout)
    theirs = forward_backward(F.scaled_dot_product_attention, dtype, q, k, v, mask, causal, gqa, dout)
    worst = (0.0, "")
    for name, a, b, c in zip(("output", "dQ", "dK", "dV"), ours, theirs, exact):
        mine, its = (a.double() - c).abs().max().item(), (b.double() - c).abs().max().item()
        ratio = mine / its if its > 0 else (1.0 if mine == 0 else float("inf"))
        worst = max(worst, (ratio, name))
    rows.append((worst[0], worst[1], str(dtype)[6:], f"B{B} Hq{Hkv * G} Hkv{Hkv} L{L} S{S} D{D} Dv{Dv} {kind}"
                 f"{' (B, L, H, D)' if transposed else ''} sd {sd}"))

rows.sort(reverse=True)
for ratio, name, dtype, shape in rows[:10]:
    print(f"{ratio:5.2f} {name:6s} {dtype:8s} {shape}")
for dtype in ("bfloat16", "float16"):
    ratios = sorted(r[0] for r in rows if r[2] == dtype)
    if ratios:
        print(f"{dtype}: {len(ratios)} cases, ratio median {ratios[len(ratios) // 2]:.2f}, largest {ratios[-1]:.2f}")
print(f"{len(rows)} cases; mha's error above 2x PyTorch's in {sum(r[0] > 2 for r in rows)}")
