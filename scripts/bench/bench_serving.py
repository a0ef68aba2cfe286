#!/usr/bin/env python3
"""`make bench`, serving part, a Llama-shaped model (random weights) on mha.transformers.PagedCache:
1. greedy generation through transformers' generate() with float32, bfloat16 and int8 pages,
   beside transformers' dynamic cache (attn_implementation="mha" for all), several seeds: how many
   of the greedy tokens each paged cache keeps equal to the float32 dynamic cache's, the largest
   difference of the logits over the steps both agree on, and tokens per second;
2. a serving step at the model level: 32 sequences decoding a token each at 2048 tokens and a
   512-token prefill chunk of a 2048-token prompt, as one packed forward (PagedCache.pack: one
   paged attention call a layer) beside the same work as 33 forwards, tokens per second.

Random weights give near-flat logits, where two candidates often lie within a rounding of each
other: a divergence here says where the cache's rounding first decided a near tie, not that the
model's output degraded (the logit differences say how large the rounding is).

usage: bench_serving.py [--tokens N] [--seeds N] [--parts 1,2,3] [--requests N]
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


def llama(seed, attention="mha"):
    """The Llama-shaped model of every part (HF's initialisation from `seed`)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    model.set_attn_implementation(attention)
    return model


def run(model, ids, tokens, cache):
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(input_ids=ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0, cache=cache,
                             output_scores=True, return_dict_in_generate=True)
        return out, time.perf_counter() - start


def serving_step(dtype, repeats=3):
    """Part 2: (one packed forward ms, 33 forwards ms) of the mixed step, medians over forks of the
    prefilled sequences (each repeat runs on fresh forks, which share the prompts' pages)."""
    model = llama(0)
    cache = mha.transformers.PagedCache(model.config, dtype=dtype, pages=33 * 9)
    decodes, context, chunk = 32, 2048, 512
    gen = torch.Generator().manual_seed(1)
    seqs = [cache.pool.add() for _ in range(decodes + 1)]
    lengths = [context - 1] * decodes + [context - chunk]

    def forward(part_seqs, parts, starts):
        cache.pack(part_seqs, [len(p) for p in parts])
        positions = torch.cat([torch.arange(s, s + len(p)) for s, p in zip(starts, parts)])[None]
        with torch.no_grad():
            model(input_ids=torch.cat(parts)[None], position_ids=positions, past_key_values=cache, use_cache=True,
                  logits_to_keep=1)

    for s, n in zip(seqs, lengths):  # the prompts, 2048 tokens a forward (not timed)
        for start in range(0, n, 2048):
            forward([s], [torch.randint(1, CONFIG["vocab_size"], (min(2048, n - start),), generator=gen)], [start])
    step_tokens = [torch.randint(1, CONFIG["vocab_size"], (1,), generator=gen) for _ in range(decodes)]
    step_tokens.append(torch.randint(1, CONFIG["vocab_size"], (chunk,), generator=gen))
    times = {"one": [], "separate": []}
    for _ in range(repeats):
        for how in times:
            forks = [cache.pool.fork(s) for s in seqs]
            start = time.perf_counter()
            if how == "one":
                forward(forks, step_tokens, lengths)
            else:
                for f, t, n in zip(forks, step_tokens, lengths):
                    forward([f], [t], [n])
            times[how].append(time.perf_counter() - start)
            for f in forks:
                cache.pool.release(f)
    return {how: sorted(t)[len(t) // 2] for how, t in times.items()}, decodes + chunk


def continuous_batching(requests, prompt, new, budget):
    """Part 3: {engine: (seconds, generated tokens, median steady forward s, tokens)}."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    model = llama(0)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, CONFIG["vocab_size"], (prompt,), generator=gen).tolist() for _ in range(requests)]
    steady = []  # the forwards of 32 decodes (positions past the prompt) and a chunk, filling the budget
    forward = model.forward

    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = forward(*args, **kwargs)
        positions = kwargs.get("position_ids")
        if positions is not None and positions.numel() == budget and int((positions >= prompt).sum()) == budget - 512:
            steady.append(time.perf_counter() - start)
        return result

    model.forward = timed
    results = {}
    for engine in ("transformers sdpa", "mha float32", "mha bfloat16", "mha int8"):
        steady.clear()
        start = time.perf_counter()
        if engine.startswith("transformers"):
            model.set_attn_implementation("sdpa")
            settings = ContinuousBatchingConfig(page_size=256, max_batch_tokens=budget, max_requests_per_batch=requests,
                                                num_blocks=requests * -(-(prompt + new) // 256))
            out = model.generate_batch(prompts, GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None,
                                                                 pad_token_id=0),
                                       continuous_batching_config=settings, warmup=False)
            tokens = [out[f"req_{i}"].generated_tokens for i in range(requests)]
        else:
            model.set_attn_implementation("mha")
            tokens = mha.transformers.generate_batch(model, prompts, new, dtype=engine.split()[1],
                                                     max_batch_tokens=budget)
        seconds = time.perf_counter() - start
        middle = sorted(steady)[len(steady) // 2] if steady else float("nan")
        results[engine] = (seconds, sum(map(len, tokens)), middle, tokens)
        yield engine, results


def greedy_agreement(tokens, seeds, threads):
    """Part 1."""
    print(f"greedy generation, Llama-shaped (hidden 512, 4 layers, GQA 8/2, head_dim 64, random weights), "
          f"{tokens} tokens after a 32-token prompt, {threads} threads")
    print(f"{'seed':>4} {'cache':>20} | {'equal tokens':>12} | {'max |Δlogit| while equal':>25} | {'tokens/s':>8}"
          f" (median gap of the two best float32 logits)")
    for seed in range(seeds):
        model = llama(seed)
        ids = torch.randint(1, CONFIG["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(100 + seed))
        exact, seconds = run(model, ids, tokens, None)
        gap = torch.stack([s[0].double().topk(2).values for s in exact.scores]).diff(dim=1).abs().median()
        print(f"{seed:>4} {'dynamic float32':>20} | {'-':>12} | {'-':>25} | {tokens / seconds:8.1f} "
              f"({float(gap):.2e})")
        for dtype in ("float32", "bfloat16", "int8"):
            got, seconds = run(model, ids, tokens, mha.transformers.PagedCache(model.config, dtype=dtype))
            differs = (got.sequences[0, 32:] != exact.sequences[0, 32:]).nonzero()
            equal = int(differs[0]) if len(differs) else tokens
            worst = max((float((a - b).abs().max()) for a, b in zip(got.scores[:equal + 1], exact.scores)), default=0.0)
            print(f"{seed:>4} {'paged ' + dtype:>20} | {equal:>5} of {tokens:<4} | {worst:25.3e} | "
                  f"{tokens / seconds:8.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="part 1's greedy tokens")
    parser.add_argument("--seeds", type=int, default=4, help="part 1's seeds")
    parser.add_argument("--parts", default="1,2,3", help="which parts, e.g. 2,3")
    parser.add_argument("--requests", type=int, default=48, help="part 3's requests")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    threads = mha.get_num_threads()
    torch.set_num_threads(threads)
    if 1 in parts:
        greedy_agreement(args.tokens, args.seeds, threads)
    if 2 in parts:
        print(f"A serving step: 32 decodes at 2048 tokens + a 512-token chunk of a 2048-token prompt, Llama-shaped "
              f"(hidden 512, 4 layers, GQA 8/2, head_dim 64), {threads} threads")
        for dtype in ("bfloat16", "int8"):
            medians, tokens = serving_step(dtype)
            print(f"  {dtype:>8} pages: one packed forward {medians['one'] * 1e3:8.1f} ms ({tokens / medians['one']:7.0f} "
                  f"tokens/s); as 33 forwards {medians['separate'] * 1e3:8.1f} ms "
                  f"({tokens / medians['separate']:7.0f} tokens/s): {medians['separate'] / medians['one']:.2f}x",
                  flush=True)
    if 3 in parts:
        prompt, new, budget = 2048, 128, 544
        print(f"Continuous batching: {args.requests} requests of {prompt}-token prompts, {new} greedy tokens each, "
              f"{budget} tokens a step (FIFO), Llama-shaped (hidden 512, 4 layers, GQA 8/2), {threads} threads")
        print(f"  {'engine':>18} | {'seconds':>8} | {'generated/s':>11} | {'all tokens/s':>12} | {'steady step ms':>14} | "
              f"requests equal to transformers'")
        for engine, results in continuous_batching(args.requests, prompt, new, budget):
            seconds, generated, middle, tokens = results[engine]
            first = next(iter(results.values()))
            equal = sum(a == b for a, b in zip(tokens, first[3]))
            ratio = f" ({first[0] / seconds:.1f}x)" if results[engine] is not first else ""
            print(f"  {engine:>18} | {seconds:8.1f} | {generated / seconds:11.1f} | "
                  f"{(generated + args.requests * prompt) / seconds:12.0f} | {middle * 1e3:14.1f} | "
                  f"{equal} of {args.requests}{ratio}", flush=True)


if __name__ == "__main__":
    main()
