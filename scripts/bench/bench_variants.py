#!/usr/bin/env python3
"""`make bench`, attention variants: a sliding window beside the dense causal call and the peers a
user would otherwise run, in the same run (docs/variants.md).

Shape B = 1, H = 8, L = S = 16 384, d = 64, float32, causal with a window of W = 256 keys
(Hugging Face's sliding_window = 256: window_size (255, 0)). Median times of:
  - mha.torch.scaled_dot_product_attention with window_size, forward (inference mode) and
    forward+backward; the same without the window (dense causal);
  - PyTorch's SDPA given the window as a dense (L, S) bool mask, forward and forward+backward;
  - FlexAttention compiled with a sliding-window BlockMask, forward only (it has no CPU backward),
    when torch.compile works here.
Calls that are compared take turns, round after round (here one dense call, three of each short
one), so that a burst of another tenant on this shared machine falls on all of them alike.
GFLOP/s count only the pairs a query sees (FlashAttention's 4·B·H·pairs·d forward, 2.5× that for
the backward), so the window's and the dense call's rates compare directly.

Then, same run:
  - soft-cap (Gemma 2's 50) and sinks beside the plain causal call, B = 1, H = 8, L = S = 4096,
    d = 64, forward and forward+backward;
  - a packed batch of 16 causal sequences of 64 to 2048 tokens through flash_attn_varlen_func
    beside the sum of the 16 sequences called one by one (flash_attn_func), H = 8, d = 64;
  - one decode step (one query per head, H = 32, Hkv = 8, d = 128) with a window of 4096 keys over
    a 32 768-token cache beside a plain step over a 4096-token cache;
each set taking turns likewise. Threads: torch.get_num_threads(). Writes <build>/bench/variants.json.

    python3 scripts/bench/bench_variants.py [build dir] [--quick]   (--quick: L = 2048)
"""
import os
import statistics
import sys
import time

import torch

import mha.torch

from bench import median_seconds, script_arguments, write_json  # bench.py, beside this file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def visible_pairs(L, W):
    """Pairs (i, j) with i - W < j <= i: Σ_i min(i + 1, W)."""
    return sum(min(i + 1, W) for i in range(L))


def interleaved(runs, rounds):
    """Median seconds of each run of `runs` (name: (function, calls per round)) after a warm-up, the
    runs taking turns round after round."""
    for fn, _ in runs.values():
        fn()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (fn, calls) in runs.items():
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    build, flags = script_arguments("usage: bench_variants.py [build dir] [--quick]   (--quick: L = 2048)",
                                    needs_cli=False)
    quick = bool(flags)
    B, H, L, d, W = 1, 8, 2048 if quick else 16384, 64, 256
    # Rounds: 5 where a dense 16k call takes part (1.5 to 6 s each), 15 for the shorter calls.
    repeats, repeats_short = 5, 15
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, d, generator=g) for _ in range(4))
    window = (W - 1, 0)
    report = {"shape": {"B": B, "H": H, "L": L, "S": L, "d": d, "W": W}, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "results": {}}
    pairs_window, pairs_causal = visible_pairs(L, W), L * (L + 1) // 2

    def forward_backward(fn, inputs=(q, k, v), grad=dout):
        """fn's forward and backward on leaves made once (copying the inputs is not timed); each
        run's gradients are new tensors, as in training after zero_grad(set_to_none=True)."""
        leaves = [t.clone().requires_grad_() for t in inputs]

        def run():
            for t in leaves:
                t.grad = None
            fn(*leaves).backward(grad)
        return run

    def record(name, pairs, fwd, fwd_bwd):
        r = {"forward_ms": fwd * 1e3, "forward_gflops": 4 * B * H * pairs * d / fwd / 1e9}
        if fwd_bwd is not None:
            bwd = fwd_bwd - fwd
            r.update({"forward_backward_ms": fwd_bwd * 1e3, "backward_gflops": 10 * B * H * pairs * d / bwd / 1e9})
        report["results"][name] = r
        text = f"{name:34} fwd {r['forward_ms']:9.1f} ms {r['forward_gflops']:6.1f} GFLOP/s"
        if fwd_bwd is not None:
            text += f"   fwd+bwd {r['forward_backward_ms']:9.1f} ms (bwd {r['backward_gflops']:6.1f} GFLOP/s)"
        print(text, flush=True)

    def compare(calls, inputs, grad, pairs):
        """Calls of the same work (name: function of the inputs) taking turns, forward and forward+backward."""
        with torch.inference_mode():
            fwd = interleaved({name: (lambda call=call: call(*inputs), 1) for name, call in calls.items()}, repeats_short)
        fwd_bwd = interleaved({name: (forward_backward(call, inputs, grad), 1) for name, call in calls.items()},
                              repeats_short)
        for name in calls:
            record(name, pairs, fwd[name], fwd_bwd[name])

    print(f"bench_variants: B={B} H={H} L=S={L} d={d} float32, causal window W={W} (window_size {window}); "
          f"{report['threads']} threads; torch {torch.__version__}")
    windowed = lambda q, k, v: mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, window_size=window)
    dense = lambda q, k, v: mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    # FlexAttention compiled with a sliding-window BlockMask, when torch.compile works here.
    flex_name, flex_forward = "FlexAttention compiled (BlockMask)", None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        block_mask = create_block_mask(lambda b, h, qi, kv: (kv <= qi) & (kv > qi - W), None, None, L, L,
                                       device="cpu")
        flex = torch.compile(flex_attention)
        flex_forward = lambda: flex(q, k, v, block_mask=block_mask)
        with torch.inference_mode():
            flex_forward()  # compiles
    except Exception as e:  # a peer that cannot run here is reported, not fatal
        report["results"][flex_name] = {"error": str(e).splitlines()[0][:300]}
        print(f"FlexAttention compiled: not run ({str(e).splitlines()[0][:200]})")
        flex_forward = None
    # The window, the dense call and Flex take turns (rounds of one dense call and three of each
    # short one), so that the bursts of another tenant fall on all of them alike.
    forwards = {"window": (lambda: windowed(q, k, v), 3), "dense": (lambda: dense(q, k, v), 1)}
    if flex_forward is not None:
        forwards["flex"] = (flex_forward, 3)
    with torch.inference_mode():
        fwd = interleaved(forwards, repeats)
    fwd_bwd = interleaved({"window": (forward_backward(windowed), 3), "dense": (forward_backward(dense), 1)}, repeats)
    record("mha window", pairs_window, fwd["window"], fwd_bwd["window"])
    record("mha dense causal", pairs_causal, fwd["dense"], fwd_bwd["dense"])
    if flex_forward is not None:
        record(flex_name, pairs_window, fwd["flex"], None)

    i = torch.arange(L).unsqueeze(-1)
    mask = (torch.arange(L) <= i) & (torch.arange(L) > i - W)
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.inference_mode():
        fwd = median_seconds(lambda: sdpa(q, k, v), 1)
    record("PyTorch SDPA, window as bool mask", pairs_window, fwd, median_seconds(forward_backward(sdpa), 1))

    # Soft-cap and sinks beside the plain causal call.
    Lv = 1024 if quick else 4096
    qv, kv_, vv, doutv = (t[:, :, :Lv].contiguous() for t in (q, k, v, dout))
    sinks = torch.randn(H, generator=g)
    variants = {
        "mha causal (plain)": dict(),
        "mha causal + softcap 50": dict(softcap=50.0),
        "mha causal + sinks": dict(sinks=sinks),
    }
    calls = {name: (lambda q, k, v, kw=kw: mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, **kw))
             for name, kw in variants.items()}
    compare(calls, (qv, kv_, vv), doutv, Lv * (Lv + 1) // 2)

    # A packed batch against its sequences one by one.
    lengths = [64, 2048, 128, 1024, 256, 1536, 512, 96, 1800, 640, 200, 1200, 64, 900, 384, 2000]
    if quick:
        lengths = [n // 8 for n in lengths]
    total = sum(lengths)
    qp, kp, vp, doutp = (torch.randn(total, H, d, generator=g) for _ in range(4))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    pairs_packed = sum(n * (n + 1) // 2 for n in lengths)
    packed = lambda q, k, v: mha.torch.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)

    def one_by_one(q, k, v):
        return torch.cat([mha.torch.flash_attn_func(q[None, a:b], k[None, a:b], v[None, a:b], causal=True)[0]
                          for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])

    compare({"mha packed (varlen), 16 sequences": packed, "mha 16 sequences one by one": one_by_one}, (qp, kp, vp),
            doutp, pairs_packed)

    # A decode step: a window of 4096 keys over a long cache against a plain step over 4096 keys.
    Hd, Hkvd, dd, cache, Wd = 32, 8, 128, 8192 if quick else 32768, 4096
    qd = torch.randn(1, 1, Hd, dd, generator=g)
    kd, vd = (torch.randn(1, cache, Hkvd, dd, generator=g) for _ in range(2))
    with torch.inference_mode():
        short_k, short_v = kd[:, -Wd:].contiguous(), vd[:, -Wd:].contiguous()
        steps = interleaved({"window": (lambda: mha.torch.flash_attn_func(qd, kd, vd, causal=True, window_size=(Wd - 1, 0)), 1),
                             "plain": (lambda: mha.torch.flash_attn_func(qd, short_k, short_v, causal=True), 1)}, 21)
        step_window, step_plain = steps["window"], steps["plain"]
    report["results"]["decode step"] = {"window_4096_over_cache_us": step_window * 1e6, "plain_4096_us": step_plain * 1e6,
                                        "cache": cache}
    print(f"decode step H={Hd} Hkv={Hkvd} d={dd}: window {Wd} over a {cache}-token cache {step_window * 1e6:8.1f} us, "
          f"plain over {Wd} keys {step_plain * 1e6:8.1f} us: {step_window / step_plain:.2f}x")

    r = report["results"]
    ratio = lambda a, b, key: r[a][key] / r[b][key]
    print(f"window / dense causal GFLOP/s: forward {ratio('mha window', 'mha dense causal', 'forward_gflops'):.2f}, "
          f"backward {ratio('mha window', 'mha dense causal', 'backward_gflops'):.2f}")
    sdpa_name = "PyTorch SDPA, window as bool mask"
    print(f"PyTorch SDPA with the mask / mha window: forward {r[sdpa_name]['forward_ms'] / r['mha window']['forward_ms']:.1f}x, "
          f"forward+backward {r[sdpa_name]['forward_backward_ms'] / r['mha window']['forward_backward_ms']:.1f}x")
    if "forward_ms" in r[flex_name]:
        print(f"FlexAttention / mha window: forward {r[flex_name]['forward_ms'] / r['mha window']['forward_ms']:.2f}x")
    plain = r["mha causal (plain)"]
    for name in ("mha causal + softcap 50", "mha causal + sinks"):
        print(f"{name[len('mha causal + '):]:10} / plain: forward {r[name]['forward_ms'] / plain['forward_ms']:.3f}x, "
              f"forward+backward {r[name]['forward_backward_ms'] / plain['forward_backward_ms']:.3f}x the time")
    one, many = r["mha packed (varlen), 16 sequences"], r["mha 16 sequences one by one"]
    print(f"packed / one by one: forward {many['forward_ms'] / one['forward_ms']:.2f}x, "
          f"forward+backward {many['forward_backward_ms'] / one['forward_backward_ms']:.2f}x the speed")
    write_json(os.path.join(build, "bench", "variants.json"), report)


if __name__ == "__main__":
    sys.exit(main())
