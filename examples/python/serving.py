#!/usr/bin/env python3
"""Serving on the CPU with mha (a stop of `make demo`): a paged KV cache with int8 pages, a prefill
chunk and decode rows in one call, FlashAttention-2's flash_attn_with_kvcache, and generate() of a
Llama-shaped model (random weights) on mha.transformers.PagedCache, and continuous batching of
several prompts (mha.transformers.generate_batch).

Checks itself (exit 1 on a mismatch): the mixed call against PyTorch's SDPA on each sequence's
keys gathered out of the pages, flash_attn_with_kvcache likewise, and float32 pages' greedy tokens
against transformers' dynamic cache, as are continuous batching's against each prompt's generate()
alone; int8 and bfloat16 pages' agreement is printed.
"""
import sys
import time

import torch
import transformers

import mha.torch
import mha.transformers

failures = 0


def sdpa(q, k, v, dtype):
    """PyTorch's SDPA of q (L, Hq, D) against k, v (S, Hkv, D), bottom-right causal, in `dtype`."""
    L, S = q.shape[0], k.shape[0]
    mask = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + S - L
    q, k, v = (x.to(dtype).transpose(0, 1) for x in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(0, 1)


def check(what, ours, q, k, v):
    """FlashAttention's rule: mha's error against PyTorch's SDPA in float64 at most twice PyTorch's
    own float32 error, + 1e-6 of the output's size."""
    global failures
    exact = sdpa(q, k, v, torch.float64)
    error = float((ours.double() - exact).abs().max())
    bound = 2 * float((sdpa(q, k, v, torch.float32).double() - exact).abs().max()) + 1e-6 * float(exact.abs().max())
    ok = error <= bound
    failures += not ok
    print(f"  {what}: max |mha - SDPA float64| = {error:.2e}, bound {bound:.2e} "
          f"{'ok' if ok else 'MISMATCH'}")


torch.manual_seed(0)
Hq, Hkv, D, page = 16, 4, 64, 256

print("One call for a prefill chunk and three decode rows, over shuffled pages of 256 tokens:")
lengths, queries = [700, 1200, 90, 3000], [1, 1, 1, 512]  # the last: a 512-token chunk of a 3000-token prompt
blocks = [-(-n // page) for n in lengths]
order = torch.randperm(sum(blocks))
k_pages, v_pages = torch.randn(len(order), page, Hkv, D), torch.randn(len(order), page, Hkv, D)
table = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
for s, first in enumerate(torch.tensor([0] + blocks).cumsum(0)[:-1].tolist()):
    table[s, :blocks[s]] = order[first:first + blocks[s]]
cu = torch.tensor([0] + queries).cumsum(0).to(torch.int32)
q = torch.randn(int(cu[-1]), Hq, D)
out = mha.torch.paged_attention(q, k_pages, v_pages, table, cu, torch.tensor(lengths))


def gathered(pages, s):
    idx = torch.arange(lengths[s])
    return pages[table[s].long()[idx // page], idx % page]


for s in range(len(lengths)):
    rows = slice(int(cu[s]), int(cu[s + 1]))
    check(f"sequence {s} ({queries[s]} queries over {lengths[s]} tokens)", out[rows], q[rows], gathered(k_pages, s),
          gathered(v_pages, s))

print("\nint8 pages (a scale per token and kv head; the queries rounded the same way), one decode row:")
k8, v8 = (torch.randint(-127, 128, k_pages.shape, dtype=torch.int8) for _ in range(2))
ks, vs = (torch.rand(k_pages.shape[:3]) * 0.02 for _ in range(2))
one = mha.torch.paged_attention(q[:1], k8, v8, table[:1], cu[:2], torch.tensor(lengths[:1]), k_scales=ks, v_scales=vs)
qs = q[:1].abs().amax(-1, keepdim=True) / 127
check("int8 sequence 0", one, torch.round(q[:1] / qs) * qs, gathered(k8, 0) * gathered(ks, 0)[..., None],
      gathered(v8, 0) * gathered(vs, 0)[..., None])

print("\nFlashAttention-2's flash_attn_with_kvcache: a new token appended in place, then attended:")
k_cache, v_cache = torch.zeros(8, page, Hkv, D), torch.zeros(8, page, Hkv, D)
kv_table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
k_cache[:], v_cache[:] = torch.randn_like(k_cache), torch.randn_like(v_cache)
k_new, v_new, q1 = torch.randn(2, 1, Hkv, D), torch.randn(2, 1, Hkv, D), torch.randn(2, 1, Hq, D)
seqlens = torch.tensor([300, 511], dtype=torch.int32)
o = mha.torch.flash_attn_with_kvcache(q1, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=kv_table,
                                      causal=True)
for b in range(2):
    n = int(seqlens[b]) + 1
    idx = torch.arange(n)
    K, V = k_cache[kv_table[b].long()[idx // page], idx % page], v_cache[kv_table[b].long()[idx // page], idx % page]
    check(f"row {b} ({n} tokens)", o[b], q1[b], K, V)

print("\ngenerate() of a Llama-shaped model (random weights) on mha.transformers.PagedCache, 64 greedy tokens:")
config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=2)
model = transformers.LlamaForCausalLM(config).eval()
model.set_attn_implementation("mha")
ids = torch.randint(1, 1024, (2, 24))
with torch.no_grad():
    dynamic = model.generate(input_ids=ids, max_new_tokens=64, do_sample=False, pad_token_id=0)
    for dtype in ("float32", "bfloat16", "int8"):
        cache = mha.transformers.PagedCache(config, dtype=dtype)
        tokens = model.generate(input_ids=ids, max_new_tokens=64, do_sample=False, pad_token_id=0, cache=cache)
        equal = [int((tokens[r, 24:] != dynamic[r, 24:]).nonzero()[0]) if (tokens[r, 24:] != dynamic[r, 24:]).any()
                 else 64 for r in range(2)]
        print(f"  {dtype:>8} pages: {cache.pool.pages_in_use} pages in use; greedy tokens equal to the dynamic "
              f"cache's for the first {equal} of 64")
        if dtype == "float32" and equal != [64, 64]:
            print("  MISMATCH: float32 pages must give the dynamic cache's tokens")
            failures += 1

print("\nContinuous batching (mha.transformers.generate_batch): 6 prompts of 9 to 300 tokens, 32 greedy tokens each,")
print("steps of at most 96 tokens (the decodes, then prompt chunks), float32 pages of 16:")
lengths = (9, 300, 40, 120, 17, 64)
prompts = [torch.randint(1, 1024, (n,)).tolist() for n in lengths]
start = time.perf_counter()
batched = mha.transformers.generate_batch(model, prompts, 32, dtype="float32", page_size=16, max_batch_tokens=96)
seconds = time.perf_counter() - start
for prompt, tokens in zip(prompts, batched):
    with torch.no_grad():
        alone = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0,
                               output_scores=True, return_dict_in_generate=True)
    expected = alone.sequences[0, len(prompt):].tolist()
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    if first is None:
        print(f"  prompt of {len(prompt):>3} tokens: the 32 tokens of generate() alone")
        continue
    # a difference at a near tie of the two best logits is float32's rounding deciding it, not a bug
    gap = float(alone.scores[first][0].topk(2).values.diff().abs())
    print(f"  prompt of {len(prompt):>3} tokens: equal to generate() alone for {first} tokens, then a tie within "
          f"{gap:.1e}")
    if gap > 1e-4:
        print("  MISMATCH: a step of the batch decided a token generate() alone decides otherwise")
        failures += 1
print(f"  {32 * len(prompts)} tokens in {seconds:.2f} s; scripts/bench/bench_serving.py times it beside transformers' "
      f"own continuous batching")

sys.exit(1 if failures else 0)
