#!/usr/bin/env python3
"""The attention variants the models people run need, from PyTorch through mha (a stop of
`make demo`): a Mistral-style sliding window, Gemma 2's logit soft-cap, gpt-oss's attention sinks,
Bloom's ALiBi and a packed batch of sequences (FlashAttention-2's own functions on the CPU).

Checks itself (exit 1 on a mismatch): each call, forward and gradients, against the variant
written out in PyTorch float64 as its model's eager code computes it; then times the window
beside PyTorch's SDPA given the same window as a dense mask.
"""
import sys
import time

import torch

import mha.torch


def eager(q, k, v, causal=True, window=None, softcap=None, sinks=None, slopes=None):
    """The models' eager attention, (B, H, L, D): scores, soft-cap (Gemma 2), ALiBi (Bloom's form),
    the causal and sliding-window mask (Hugging Face's), a sink logit (gpt-oss), softmax."""
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    i, j = torch.arange(L).unsqueeze(-1) + S - L, torch.arange(S)
    if slopes is not None:  # Bloom's build_alibi_tensor: slope·(key position), under the causal mask
        s = s + slopes[:, None, None] * j
    see = (j <= i) if causal else torch.ones(L, S, dtype=torch.bool)
    if window is not None:
        see = see & (j > i - window)  # Hugging Face's sliding_window = W
    s = s.masked_fill(~see, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    return (p[..., :S] if sinks is not None else p) @ v


def check(name, got, want, grads, want_grads):
    error = max([(got - want).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(grads, want_grads)])
    ok = error <= 1e-10
    print(f"  {name:62s} max |diff| {error:.1e}  {'ok' if ok else 'MISMATCH'}")
    return ok


def main():
    torch.manual_seed(0)
    B, H, L, D = 2, 4, 64, 16
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.randn(H, dtype=torch.float64, requires_grad=True)
    slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float64) / H)  # Bloom's slopes
    dout = torch.randn(B, H, L, D, dtype=torch.float64)
    print("Each variant from PyTorch through mha, forward and gradients, against the models' eager code (float64):")
    ok = True
    cases = [
        ("Mistral: sliding_window = 16 (window_size=(15, 0))", dict(window_size=(15, 0)), dict(window=16), (q, k, v)),
        ("Gemma 2: attn_logit_softcapping = 2, sliding window 16", dict(window_size=(15, 0), softcap=2.0),
         dict(window=16, softcap=2.0), (q, k, v)),
        ("gpt-oss: a sink per head (its gradient too), window 16", dict(window_size=(15, 0), sinks=sinks),
         dict(window=16, sinks=sinks), (q, k, v, sinks)),
        ("Bloom: ALiBi with Bloom's slopes", dict(alibi_slopes=slopes), dict(slopes=slopes), (q, k, v)),
    ]
    for name, ours, theirs, leaves in cases:
        out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, **ours)
        want = eager(q, k, v, **theirs)
        ok &= check(name, out, want, torch.autograd.grad(out, leaves, dout), torch.autograd.grad(want, leaves, dout))

    # A packed batch of three sequences, FlashAttention's varlen layout (total, H, D).
    lengths = [5, 40, 19]
    cu = torch.tensor([0, 5, 45, 64], dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # batch 0 as (64, H, D)
    out = mha.torch.flash_attn_varlen_func(*packed, cu, cu, max(lengths), max(lengths), causal=True)
    want = torch.cat([eager(*(t[None, :, a:b] for t in (q[0], k[0], v[0])))[0].transpose(0, 1)
                      for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    ok &= check("packed: 3 sequences of 5, 40, 19 tokens (flash_attn_varlen_func)", out, want,
                torch.autograd.grad(out, (q,), torch.ones_like(out)), torch.autograd.grad(want, (q,), torch.ones_like(want)))

    # The window's cost: keys outside it are never computed; PyTorch's SDPA walks a dense mask.
    L, W = 4096, 256
    q, k, v = (torch.randn(1, 8, L, 64) for _ in range(3))
    mask = torch.ones(L, L, dtype=torch.bool).tril() & ~torch.ones(L, L, dtype=torch.bool).tril(-W)
    with torch.inference_mode():
        timings = {}
        for name, call in (("mha, window_size=(255, 0)", lambda: mha.torch.scaled_dot_product_attention(
                q, k, v, is_causal=True, window_size=(W - 1, 0))),
                           ("PyTorch SDPA, the window as a dense mask", lambda: torch.nn.functional.scaled_dot_product_attention(
                               q, k, v, attn_mask=mask))):
            call()
            start = time.perf_counter()
            call()
            timings[name] = time.perf_counter() - start
    print(f"\nA window of {W} keys over {L} tokens, 8 heads, d = 64, float32, forward:")
    for name, seconds in timings.items():
        print(f"  {name:42s} {seconds * 1e3:8.1f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
