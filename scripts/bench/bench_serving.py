#!/usr/bin/env python3
"""`make bench`, serving part: greedy generation of a Llama-shaped model (random weights) through
transformers' generate() with mha.transformers.PagedCache in float32, bfloat16 and int8 pages,
beside transformers' dynamic cache (attn_implementation="mha" for all), several seeds: how many
of the greedy tokens each paged cache keeps equal to the float32 dynamic cache's, the largest
difference of the logits over the steps both agree on, and tokens per second.

Random weights give near-flat logits, where two candidates often lie within a rounding of each
other: a divergence here says where the cache's rounding first decided a near tie, not that the
model's output degraded (the logit differences say how large the rounding is).

usage: bench_serving.py [--tokens N] [--seeds N]
"""
from __future__ import annotations

import argparse
import time

import torch
import transformers

import mha
import mha.transformers

# Llama-shaped: GQA 8/2, head_dim 64, 4 layers (random weights, HF's initialisation).
CONFIG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=4096)


def run(model, ids, tokens, cache):
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(input_ids=ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0, cache=cache,
                             output_scores=True, return_dict_in_generate=True)
        return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    threads = mha.get_num_threads()
    torch.set_num_threads(threads)
    print(f"greedy generation, Llama-shaped (hidden 512, 4 layers, GQA 8/2, head_dim 64, random weights), "
          f"{args.tokens} tokens after a 32-token prompt, {threads} threads")
    print(f"{'seed':>4} {'cache':>20} | {'equal tokens':>12} | {'max |Δlogit| while equal':>25} | {'tokens/s':>8}"
          f" (median gap of the two best float32 logits)")
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
        model.set_attn_implementation("mha")
        ids = torch.randint(1, CONFIG["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(100 + seed))
        exact, seconds = run(model, ids, args.tokens, None)
        gap = torch.stack([s[0].double().topk(2).values for s in exact.scores]).diff(dim=1).abs().median()
        print(f"{seed:>4} {'dynamic float32':>20} | {'-':>12} | {'-':>25} | {args.tokens / seconds:8.1f} "
              f"({float(gap):.2e})")
        for dtype in ("float32", "bfloat16", "int8"):
            got, seconds = run(model, ids, args.tokens, mha.transformers.PagedCache(model.config, dtype=dtype))
            differs = (got.sequences[0, 32:] != exact.sequences[0, 32:]).nonzero()
            equal = int(differs[0]) if len(differs) else args.tokens
            worst = max((float((a - b).abs().max()) for a, b in zip(got.scores[:equal + 1], exact.scores)), default=0.0)
            print(f"{seed:>4} {'paged ' + dtype:>20} | {equal:>5} of {args.tokens:<4} | {worst:25.3e} | "
                  f"{args.tokens / seconds:8.1f}", flush=True)


if __name__ == "__main__":
    main()
