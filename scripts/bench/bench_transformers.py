#!/usr/bin/env python3
"""`make bench`, transformers part (issue 27): models built from configs with random weights, run
by Hugging Face transformers with attn_implementation="mha" beside its own "sdpa" or "eager", same
inputs, same threads, same run (the contenders take turns, medians).

    prefill   a Mistral-shaped model at 16 384 tokens (window 512) against "sdpa": time, and the
              extra peak memory of the call (each contender in its own process, ru_maxrss)
    variants  gpt-oss-shaped (sinks, window 128) and Gemma-2-shaped (soft-cap 50, window 2 048)
              models at 4 096 tokens against "eager" (transformers has no other path for them)
    llama     a Llama-shaped model at 4 096 tokens, float32 and bfloat16, against "sdpa": end to
              end, and the attention function alone (each call timed) with its share of the time
    padded    a left-padded batch of four 2 048-token rows (0, 300, 900 and 1 500 padding tokens;
              Llama-shaped) against "sdpa": the padding reaches mha as lengths, end to end and
              the attention alone
    generate  256 greedy tokens after a 4 096-token prompt (Llama-shaped), tokens/s
    overhead  mha.transformers.attention_forward at a decode step (one query, 4 096 keys) against
              the operator it calls, µs per call

Every model has 2 layers and prints its shape. Writes <build>/bench/transformers.json.

    python3 scripts/bench/bench_transformers.py [build dir] [--quick]   (--quick: 1/4 the tokens)
"""
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import transformers as T
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import mha.transformers
from bench import script_arguments, write_json  # bench.py, beside this file
from bench_variants import interleaved

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))

SHAPES = {
    "mistral": lambda: T.MistralConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                       num_attention_heads=16, num_key_value_heads=4, sliding_window=512),
    "gpt_oss": lambda: T.GptOssConfig(vocab_size=1000, hidden_size=1024, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=16, num_key_value_heads=4, head_dim=64, sliding_window=128,
                                      num_local_experts=4, num_experts_per_tok=2,
                                      layer_types=["sliding_attention", "full_attention"]),
    "gemma2": lambda: T.Gemma2Config(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                                     query_pre_attn_scalar=128, attn_logit_softcapping=50.0, sliding_window=2048),
    "llama": lambda: T.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                   num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=8192),
}
BASE = {"mistral": T.MistralModel, "gpt_oss": T.GptOssModel, "gemma2": T.Gemma2Model, "llama": T.LlamaModel}


def build(family, implementation, dtype=torch.float32, causal_lm=False):
    torch.manual_seed(0)
    config = SHAPES[family]()
    model = (T.LlamaForCausalLM(config) if causal_lm else BASE[family](config)).eval().to(dtype)
    if family == "gpt_oss":
        model.set_experts_implementation("eager")
    model.set_attn_implementation(implementation)
    return model


def shape_of(family):
    c = SHAPES[family]()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    extra = {k: getattr(c, k) for k in ("sliding_window", "attn_logit_softcapping") if getattr(c, k, None)}
    return {"hidden": c.hidden_size, "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
            "head_dim": head_dim, "layers": c.num_hidden_layers, **extra}


def forward(model, ids, mask=None):
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask)


def peak_child(family, implementation, tokens):
    """(seconds, extra peak resident MiB) of one forward in a fresh process."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r});"
            f"import bench_transformers as b; b._child({family!r}, {implementation!r}, {tokens})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    seconds, mib = out.strip().splitlines()[-1].split()
    return float(seconds), float(mib)


def _no_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function that only allocates its output: the model's own memory floor."""
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None


def _child(family, implementation, tokens):
    torch.set_num_threads(THREADS)
    if implementation == "none":
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
        AttentionInterface.register("none", _no_attention)
        AttentionMaskInterface.register("none", mha.transformers.attention_mask)
    model = build(family, implementation)
    ids = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))
    forward(model, ids[:, :64])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    forward(model, ids)
    seconds = time.perf_counter() - start
    print(seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)


def timed_attention(name):
    """Wraps transformers' attention function `name` so that its calls are timed."""
    original = ALL_ATTENTION_FUNCTIONS[name]
    spent = []

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        spent.append(time.perf_counter() - start)
        return out

    ALL_ATTENTION_FUNCTIONS[name] = wrapper
    return spent, lambda: ALL_ATTENTION_FUNCTIONS.__setitem__(name, original)


def main():
    build_dir, flags = script_arguments("usage: bench_transformers.py [build dir] [--quick]", needs_cli=False)
    quick = bool(flags)
    scale = 4 if quick else 1
    torch.set_num_threads(THREADS)
    report = {"threads": THREADS, "torch": torch.__version__, "transformers": T.__version__, "cases": {}}
    print(f"transformers {T.__version__} with attn_implementation=\"mha\" beside its own, {THREADS} threads")

    # 1. Prefill, Mistral-shaped, 16 384 tokens: time and extra peak memory, each in its own process.
    tokens = 16384 // scale
    # "none": the same model with an attention that only allocates its output, the floor of its
    # peak memory (its own activations: the feed-forward's 16k × 2 048 tensors) for any attention.
    runs = {impl: [peak_child("mistral", impl, tokens) for _ in range(2)] for impl in ("mha", "sdpa", "none")}
    t = {impl: min(r[0] for r in v) for impl, v in runs.items()}
    mem = {impl: min(r[1] for r in v) for impl, v in runs.items()}
    report["cases"]["prefill_mistral"] = {"shape": shape_of("mistral"), "tokens": tokens, "seconds": t, "extra_peak_mib": mem}
    print(f"prefill, Mistral-shaped {shape_of('mistral')}, {tokens} tokens: mha {t['mha']:.2f} s, sdpa {t['sdpa']:.2f} s "
          f"(x{t['sdpa'] / t['mha']:.2f}); extra peak memory mha {mem['mha']:.0f} MiB, sdpa {mem['sdpa']:.0f} MiB "
          f"({mem['mha'] / max(mem['sdpa'], 1e-9):.2f} of it); with no attention at all {mem['none']:.0f} MiB, so the "
          f"attention adds mha {mem['mha'] - mem['none']:.0f} MiB, sdpa {mem['sdpa'] - mem['none']:.0f} MiB", flush=True)

    # 2. gpt-oss- and Gemma-2-shaped at 4 096 tokens against eager.
    tokens = 4096 // scale
    ids = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(1))
    for family in ("gpt_oss", "gemma2"):
        models = {impl: build(family, impl) for impl in ("mha", "eager")}
        t = interleaved({impl: (lambda m=m: forward(m, ids), 1) for impl, m in models.items()}, 3)
        report["cases"][f"forward_{family}"] = {"shape": shape_of(family), "tokens": tokens, "seconds": t}
        print(f"forward, {family}-shaped {shape_of(family)}, {tokens} tokens: mha {t['mha']:.2f} s, eager "
              f"{t['eager']:.2f} s (x{t['eager'] / t['mha']:.2f})", flush=True)

    # 3. Llama-shaped, 4 096 tokens, float32 and bfloat16: end to end and the attention alone.
    for dtype in (torch.float32, torch.bfloat16):
        models = {impl: build("llama", impl, dtype) for impl in ("mha", "sdpa")}
        total, attention = {}, {}
        for impl, model in models.items():
            spent, restore = timed_attention(impl)
            try:
                forward(model, ids)
                spent.clear()
                t = interleaved({impl: (lambda m=model: forward(m, ids), 1)}, 3)[impl]
                total[impl], attention[impl] = t, statistics.median(spent) * model.config.num_hidden_layers
            finally:
                restore()
        name = str(dtype)[6:]
        report["cases"][f"llama_{name}"] = {"shape": shape_of("llama"), "tokens": tokens, "seconds": total,
                                            "attention_seconds": attention}
        print(f"forward, Llama-shaped {shape_of('llama')}, {tokens} tokens, {name}: end to end mha {total['mha']:.3f} s, "
              f"sdpa {total['sdpa']:.3f} s (x{total['sdpa'] / total['mha']:.2f}); attention mha {attention['mha']:.3f} s "
              f"({100 * attention['mha'] / total['mha']:.0f}% of the time), sdpa {attention['sdpa']:.3f} s "
              f"({100 * attention['sdpa'] / total['sdpa']:.0f}%), x{attention['sdpa'] / attention['mha']:.2f}", flush=True)

    # 3b. A left-padded batch (padding as lengths for mha, a mask for sdpa), float32.
    length = 2048 // scale
    padded_ids = torch.randint(1, 1000, (4, length), generator=torch.Generator().manual_seed(2))
    padded_mask = torch.ones(4, length, dtype=torch.long)
    for row, pad in enumerate((0, 300 // scale, 900 // scale, 1500 // scale)):
        padded_mask[row, :pad] = 0
    models = {impl: build("llama", impl) for impl in ("mha", "sdpa")}
    total, attention = {}, {}
    for impl, model in models.items():
        spent, restore = timed_attention(impl)
        try:
            forward(model, padded_ids, padded_mask)
            spent.clear()
            total[impl] = interleaved({impl: (lambda m=model: forward(m, padded_ids, padded_mask), 1)}, 3)[impl]
            attention[impl] = statistics.median(spent) * model.config.num_hidden_layers
        finally:
            restore()
    report["cases"]["padded_llama"] = {"shape": shape_of("llama"), "batch": 4, "tokens": length,
                                       "padding": [int((padded_mask[r] == 0).sum()) for r in range(4)],
                                       "seconds": total, "attention_seconds": attention}
    print(f"left-padded batch, Llama-shaped, 4 x {length} tokens: end to end mha {total['mha']:.3f} s, sdpa "
          f"{total['sdpa']:.3f} s (x{total['sdpa'] / total['mha']:.2f}); attention mha {attention['mha']:.3f} s, sdpa "
          f"{attention['sdpa']:.3f} s (x{attention['sdpa'] / attention['mha']:.2f})", flush=True)

    # 4. Generation: 256 greedy tokens after a 4 096-token prompt.
    new = 256 // scale
    models = {impl: build("llama", impl, causal_lm=True) for impl in ("mha", "sdpa")}
    for model in models.values():
        model.generate(ids[:, :64], max_new_tokens=4, do_sample=False, pad_token_id=0)
    seconds = interleaved({impl: (lambda m=model: m.generate(ids, max_new_tokens=new, min_new_tokens=new,
                                                             do_sample=False, pad_token_id=0), 1)
                           for impl, model in models.items()}, 3)
    rates = {impl: new / s for impl, s in seconds.items()}
    report["cases"]["generate_llama"] = {"shape": shape_of("llama"), "prompt": tokens, "new_tokens": new,
                                         "tokens_per_s": rates}
    print(f"generation, Llama-shaped, {new} tokens after {tokens}: mha {rates['mha']:.1f} tokens/s, sdpa "
          f"{rates['sdpa']:.1f} (x{rates['mha'] / rates['sdpa']:.2f}; prefill included)", flush=True)

    # 5. The attention function's own cost at a decode step.
    c = shape_of("llama")
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(1, c["heads"], 1, c["head_dim"])
    k, v = (torch.randn(1, c["kv_heads"], 4096, c["head_dim"]) for _ in range(2))
    with torch.inference_mode():
        t = interleaved({
            "attention_forward": (lambda: mha.transformers.attention_forward(module, q, k, v, None), 200),
            "operator": (lambda: mha.torch._sdpa._sdpa_forward(q, k, v, None, 0.0, "bottom_right", None, True, None), 200),
        }, 5)
    overhead = (t["attention_forward"] - t["operator"]) * 1e6
    report["cases"]["decode_overhead"] = {"keys": 4096, "microseconds": {n: s * 1e6 for n, s in t.items()},
                                          "overhead_us": overhead}
    print(f"decode step (1 query, 4096 keys): attention_forward {t['attention_forward'] * 1e6:.1f} us, the operator "
          f"{t['operator'] * 1e6:.1f} us: {overhead:.1f} us of its own", flush=True)

    path = os.path.join(build_dir, "bench", "transformers.json")
    write_json(path, report)
    print(f"JSON written to {path}")


if __name__ == "__main__":
    main()
