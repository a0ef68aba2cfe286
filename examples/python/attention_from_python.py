#!/usr/bin/env python3
"""mha from Python, the last stop of `make demo`: the numpy API, sentence embeddings, then mha
inside PyTorch.

Checks itself (exit 1 on a mismatch): mha's numpy result against the plain formula in float64,
and mha.torch against PyTorch's own scaled_dot_product_attention, forward and gradients, then a
torch model whose SDPA calls are routed to mha by mha.torch.patch().
"""
import pathlib
import sys

import numpy as np

import mha


def plain_attention(q, k, v, causal):
    """softmax(q kᵀ / sqrt(d) + causal mask) v, written out in numpy."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        L, S = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((L, S), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def check(name, error, bound):
    ok = error <= bound
    print(f"  {name:58s} max |diff| {error:.2e}  (bound {bound:.0e})  {'ok' if ok else 'MISMATCH'}")
    return ok


def main():
    ok = True
    rng = np.random.default_rng(0)
    print("numpy: q (2, 8, 128, 64), k and v (2, 8, 256, 64), causal, float64")
    q = rng.standard_normal((2, 8, 128, 64))
    k, v = rng.standard_normal((2, 8, 256, 64)), rng.standard_normal((2, 8, 256, 64))
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    ok &= check("mha.scaled_dot_product_attention vs the plain formula", np.abs(out - plain_attention(q, k, v, True)).max(), 1e-12)

    model = pathlib.Path(__file__).resolve().parents[2] / "models" / "all-MiniLM-L6-v2"
    print(f"\nmha.SentenceEncoder({model.name}): sentence embeddings, cosine similarities")
    encoder = mha.SentenceEncoder(model)
    sentences = ["A man is eating food.", "Someone is having a meal.", "The stock market fell."]
    e = encoder.encode(sentences)
    for i, j in ((0, 1), (0, 2)):
        print(f"  {float(e[i] @ e[j]):.4f}  {sentences[i]!r} ~ {sentences[j]!r}")
    ok &= bool(e[0] @ e[1] > e[0] @ e[2])

    try:
        import torch
        from mha import torch as mha_torch
    except ImportError:
        print("\nPyTorch is not installed: the torch part is skipped (pip install torch).")
        return ok

    print(f"\nPyTorch {torch.__version__}: (batch, L, heads, d) memory viewed as (batch, heads, L, d), float32")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 128, 8, 64).transpose(1, 2).requires_grad_() for _ in range(3))
    mine = mha_torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ok &= check("mha.torch.scaled_dot_product_attention vs PyTorch's", (mine - theirs).abs().max().item(), 1e-5)
    grads_mine = torch.autograd.grad(mine.sum(), (q, k, v))
    grads_theirs = torch.autograd.grad(theirs.sum(), (q, k, v))
    for name, a, b in zip(("dq", "dk", "dv"), grads_mine, grads_theirs):
        ok &= check(f"  gradient {name}", (a - b).abs().max().item(), 1e-4)

    print("\nnn.MultiheadAttention (training mode, dropout 0): inside mha_torch.patch() its core runs in mha")
    attention = torch.nn.MultiheadAttention(64, 4, batch_first=True).train()
    x = torch.randn(3, 50, 64)
    calls = []
    real_op = mha_torch._sdpa._sdpa_forward
    mha_torch._sdpa._sdpa_forward = lambda *a: calls.append(1) or real_op(*a)  # counts the calls that reach mha
    try:
        with torch.no_grad():
            reference = attention(x, x, x, need_weights=False)[0]
            with mha_torch.patch():
                routed = attention(x, x, x, need_weights=False)[0]
    finally:
        mha_torch._sdpa._sdpa_forward = real_op
    print(f"  calls that reached mha inside the block: {len(calls)}")
    ok &= len(calls) == 1
    ok &= check("nn.MultiheadAttention under patch() vs without", (routed - reference).abs().max().item(), 1e-5)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
