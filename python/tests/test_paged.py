"""KV-cache attention from Python: FlashAttention-2's flash_attn_with_kvcache (paged and
contiguous caches, new tokens written in place, rotary, cache_batch_idx), flash_attn_varlen_func
with a block_table, and mha.torch.paged_attention (a prefill chunk and decode rows in one call,
int8 pages). Each against a float64 reference computed here from the definition on the keys and
values gathered out of the cache, under FlashAttention's rule with PyTorch's float32 SDPA on the
same values as the budget (conftest.assert_flash_rule); and every bad argument."""
import math

import numpy as np
import pytest
import torch

import mha.torch
from conftest import assert_flash_rule

torch.manual_seed(0)


def reference(q, k, v, causal, scale=None, window=(-1, -1), softcap=0.0, slopes=None, dtype=torch.float64):
    """One sequence: q (L, Hq, D), k and v (S, Hkv, D), the definition in `dtype` (GQA by repeating
    the kv heads; bottom-right diagonal; FlashAttention's window, softcap and ALiBi)."""
    L, Hq, D = q.shape
    S, Hkv, _ = k.shape
    q, k, v = (x.to(dtype).transpose(0, 1) for x in (q, k, v))
    k, v = (x.repeat_interleave(Hq // Hkv, dim=0) for x in (k, v))
    s = (q @ k.transpose(1, 2)) * (scale if scale is not None else 1 / math.sqrt(D))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L).unsqueeze(1) + (S - L)  # each query's own key
    j = torch.arange(S).unsqueeze(0)
    if slopes is not None:
        s = s - slopes.to(dtype).view(-1, 1, 1) * (i - j).abs()
    hidden = torch.zeros(L, S, dtype=torch.bool)
    if causal:
        hidden |= j > i
    if window[0] >= 0:
        hidden |= j < i - window[0]
    if window[1] >= 0:
        hidden |= j > i + window[1]
    s = s.masked_fill(hidden, -math.inf)
    out = torch.softmax(s, dim=-1) @ v
    return out.transpose(0, 1)  # (L, Hq, Dv)


def gather(cache, table_row, page, n):
    """The first n tokens of a sequence from a cache in FlashAttention's paged layout."""
    idx = torch.arange(n)
    return cache[table_row.long()[idx // page], idx % page]


def check(ours, expected64, peer32, what):
    assert_flash_rule(ours.to(torch.float64).numpy(), expected64.numpy(), peer32.to(torch.float64).numpy(), what)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attn_with_kvcache_paged_writes_the_new_tokens_and_attends(causal, dtype):
    B, Hq, Hkv, D, page = 3, 8, 2, 64, 32
    lengths = torch.tensor([5, 70, 33], dtype=torch.int32)
    pages = 16
    k_cache, v_cache = (torch.randn(pages, page, Hkv, D).to(dtype) for _ in range(2))
    table = torch.randperm(pages)[:B * 4].reshape(B, 4).to(torch.int32)
    q = torch.randn(B, 2, Hq, D).to(dtype)
    k, v = (torch.randn(B, 2, Hkv, D).to(dtype) for _ in range(2))
    before = k_cache.clone()
    out, lse = mha.torch.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=table,
                                                 causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, Hq, 2) and lse.dtype == torch.float32
    changed = 0
    for b in range(B):
        n = int(lengths[b]) + 2
        K, V = gather(k_cache, table[b], page, n), gather(v_cache, table[b], page, n)
        assert torch.equal(K[-2:], k[b]) and torch.equal(V[-2:], v[b])  # written in place
        assert torch.equal(K[:-2], gather(before, table[b], page, n)[:-2])  # the rest untouched
        changed += 2
        expected = reference(q[b], K, V, causal)
        peer = reference(q[b], K, V, causal, dtype=torch.float32)
        if dtype == torch.float32:
            check(out[b], expected, peer, f"sequence {b}")
        else:  # the output rounded to bfloat16: within half a bfloat16 step of the float64 result
            assert (out[b].double() - expected).abs().max() <= expected.abs().max() * 2**-8 + 1e-6
    assert int((k_cache != before).any(dim=(2, 3)).sum()) == changed


def test_flash_attn_with_kvcache_contiguous_cache_with_the_variants():
    # A (B_cache, S_cache, Hkv, D) cache read through cache_batch_idx, an int cache_seqlens, the
    # window, softcap, ALiBi (B, Hq) and a scale, no new tokens.
    B, Hq, Hkv, D, S = 2, 4, 4, 32, 300
    k_cache, v_cache = torch.randn(5, S, Hkv, D), torch.randn(5, S, Hkv, D)
    q = torch.randn(B, 3, Hq, D)
    rows = torch.tensor([4, 1], dtype=torch.int32)
    slopes = torch.rand(B, Hq)
    kw = dict(causal=True, window_size=(40, 0), softcap=3.0, softmax_scale=0.2)
    out = mha.torch.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=250, cache_batch_idx=rows,
                                            alibi_slopes=slopes, **kw)
    for b in range(B):
        K, V = k_cache[rows[b], :250], v_cache[rows[b], :250]
        args = dict(causal=True, window=(40, 0), softcap=3.0, scale=0.2, slopes=slopes[b])
        check(out[b], reference(q[b], K, V, **args), reference(q[b], K, V, dtype=torch.float32, **args), f"row {b}")
    # No cache_seqlens: the whole cache.
    whole = mha.torch.flash_attn_with_kvcache(q, k_cache[:2], v_cache[:2])
    for b in range(B):
        check(whole[b], reference(q[b], k_cache[b], v_cache[b], False),
              reference(q[b], k_cache[b], v_cache[b], False, dtype=torch.float32), f"whole cache, row {b}")


def test_flash_attn_with_kvcache_cache_leftpad():
    # FlashAttention's cache_leftpad: sequence b's tokens are slots [leftpad[b], cache_seqlens[b]) of
    # its cache row (a left-padded batch), the new token written at cache_seqlens[b].
    B, Hq, Hkv, D, S = 2, 4, 2, 32, 64
    k_cache, v_cache = torch.randn(B, S, Hkv, D), torch.randn(B, S, Hkv, D)
    q, k, v = torch.randn(B, 1, Hq, D), torch.randn(B, 1, Hkv, D), torch.randn(B, 1, Hkv, D)
    lengths, left = torch.tensor([20, 9], dtype=torch.int32), torch.tensor([5, 0], dtype=torch.int32)
    out = mha.torch.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, cache_leftpad=left,
                                            causal=True)
    for b in range(B):
        K, V = k_cache[b, int(left[b]):int(lengths[b]) + 1], v_cache[b, int(left[b]):int(lengths[b]) + 1]
        assert torch.equal(K[-1], k[b, 0])
        check(out[b], reference(q[b], K, V, True), reference(q[b], K, V, True, dtype=torch.float32), f"row {b}")


@pytest.mark.parametrize("interleaved", [False, True])
def test_flash_attn_with_kvcache_rotary(interleaved):
    # FlashAttention's rotary on q and the new k at their positions (cache_seqlens + t, causal),
    # written here from its definition: pairs (x_a, x_b) of the first rotary_dim dimensions, halves
    # (GPT-NeoX) or neighbours (GPT-J), turned by the angle of position p: (a·cos − b·sin, a·sin + b·cos).
    B, H, D, S, rd = 2, 2, 32, 64, 16
    k_cache, v_cache = torch.zeros(B, S, H, D), torch.zeros(B, S, H, D)
    q, k, v = torch.randn(B, 1, H, D), torch.randn(B, 1, H, D), torch.randn(B, 1, H, D)
    angles = torch.arange(S, dtype=torch.float64).unsqueeze(1) * torch.rand(rd // 2, dtype=torch.float64)
    cos, sin = angles.cos().float(), angles.sin().float()
    lengths = torch.tensor([3, 10], dtype=torch.int32)
    mha.torch.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=lengths, causal=True,
                                      rotary_interleaved=interleaved)

    def turned(x, p):
        x = x.double().clone()
        a_idx = torch.arange(0, rd, 2) if interleaved else torch.arange(rd // 2)
        b_idx = a_idx + 1 if interleaved else a_idx + rd // 2
        a, b = x[..., a_idx].clone(), x[..., b_idx].clone()
        c, s = angles[p].cos(), angles[p].sin()
        x[..., a_idx], x[..., b_idx] = a * c - b * s, a * s + b * c
        return x

    for b in range(B):
        p = int(lengths[b])
        torch.testing.assert_close(k_cache[b, p].double(), turned(k[b, 0], p), rtol=0, atol=1e-6)
        assert torch.equal(v_cache[b, p], v[b, 0])


def test_paged_attention_one_call_for_a_prefill_chunk_and_decode_rows():
    # Decode rows of 1 and 3 queries and a 40-query prefill chunk, pages of 16 in shuffled order,
    # in one call, each sequence against its own reference; flash_attn_varlen_func with a
    # block_table is the same call.
    Hq, Hkv, D, page = 8, 2, 64, 16
    q_lens, k_lens = [1, 40, 3, 1], [1, 100, 57, 300]
    blocks = [-(-n // page) for n in k_lens]
    order = torch.randperm(sum(blocks) + 4)
    k_pages, v_pages = torch.randn(len(order), page, Hkv, D), torch.randn(len(order), page, Hkv, D)
    table = torch.zeros(4, max(blocks), dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks):
        table[s, :n] = order[used:used + n]
        used += n
    cu_q = torch.tensor([0] + np.cumsum(q_lens).tolist(), dtype=torch.int32)
    q = torch.randn(sum(q_lens), Hq, D)
    sinks = torch.randn(Hq)
    out = mha.torch.paged_attention(q, k_pages, v_pages, table, cu_q, torch.tensor(k_lens), sinks=sinks)
    for s in range(4):
        K, V = gather(k_pages, table[s], page, k_lens[s]), gather(v_pages, table[s], page, k_lens[s])
        rows = slice(int(cu_q[s]), int(cu_q[s + 1]))
        # The definition with the sink written out: one more logit in each row's softmax, whose
        # value adds nothing.
        qq, KK, VV = (x.double().transpose(0, 1) for x in (q[rows], K, V))
        KK, VV = KK.repeat_interleave(Hq // Hkv, 0), VV.repeat_interleave(Hq // Hkv, 0)
        sc = qq @ KK.transpose(1, 2) / math.sqrt(D)
        L, S = sc.shape[1], sc.shape[2]
        sc = sc.masked_fill(torch.arange(S).unsqueeze(0) > torch.arange(L).unsqueeze(1) + S - L, -math.inf)
        full = torch.cat((sinks.double().view(Hq, 1, 1).expand(Hq, L, 1), sc), dim=2)
        expected = (torch.softmax(full, -1)[..., 1:] @ VV).transpose(0, 1)
        sc32 = sc.float()
        peer = (torch.softmax(torch.cat((sinks.view(Hq, 1, 1).expand(Hq, L, 1), sc32), 2), -1)[..., 1:] @
                VV.float()).transpose(0, 1)
        check(out[rows], expected, peer, f"sequence {s}")
    cu_k = torch.tensor([0] + np.cumsum(k_lens).tolist(), dtype=torch.int32)
    plain = mha.torch.paged_attention(q, k_pages, v_pages, table, cu_q, torch.tensor(k_lens))
    same = mha.torch.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 40, 300, causal=True, block_table=table)
    assert torch.equal(same, plain)


def round_int8(x):
    """mha's int8 rule written out (mha/core/int8.h): per row, scale = max|x|/127 in float32,
    q = round(x/scale) in float64; returns (q int8, scale float32)."""
    scale = (x.abs().amax(-1) / 127).float()
    q = torch.round(x.double() / scale.double().unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def test_paged_attention_int8_pages():
    Hq, Hkv, D, page = 4, 2, 64, 32
    k_lens = [200, 1, 77]
    pages = sum(-(-n // page) for n in k_lens) + 1
    k_float, v_float = torch.randn(pages, page, Hkv, D), torch.randn(pages, page, Hkv, D)
    (k8, ks), (v8, vs) = round_int8(k_float), round_int8(v_float)
    table = torch.arange(pages - 1, dtype=torch.int32).reshape(-1)
    rows = [table[0:7], table[7:8], table[8:11]]
    table = torch.zeros(3, 7, dtype=torch.int32)
    for s, r in enumerate(rows):
        table[s, :len(r)] = r
    q = torch.randn(3, Hq, D)
    cu = torch.arange(4, dtype=torch.int32)
    out = mha.torch.paged_attention(q, k8, v8, table, cu, torch.tensor(k_lens), k_scales=ks, v_scales=vs)
    q8, qs = round_int8(q)
    for s in range(3):
        n = k_lens[s]
        K = gather(k8, table[s], page, n).double() * gather(ks, table[s], page, n).double().unsqueeze(-1)
        V = gather(v8, table[s], page, n).double() * gather(vs, table[s], page, n).double().unsqueeze(-1)
        Q = q8[s:s + 1].double() * qs[s:s + 1].double().unsqueeze(-1)  # the query rounded as the call rounds it
        check(out[s:s + 1], reference(Q, K, V, True), reference(Q.float(), K.float(), V.float(), True, dtype=torch.float32),
              f"int8 sequence {s}")


def test_paged_bad_arguments():
    k_cache = torch.randn(4, 16, 2, 8)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    q = torch.randn(1, 1, 4, 8)
    f = mha.torch.flash_attn_with_kvcache
    with pytest.raises(ValueError, match=r"block_table\[0, 0\]: expected a page 0 to 3"):
        f(q, k_cache, k_cache, cache_seqlens=5, block_table=torch.tensor([[7, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"options.key_lengths\[0\]: expected 1 to 32"):
        f(q, k_cache, k_cache, cache_seqlens=40, block_table=table)
    with pytest.raises(ValueError, match=r"options.key_starts\[0\]: expected 0 to 5"):
        f(q, k_cache, k_cache, cache_seqlens=5, block_table=table, cache_leftpad=torch.tensor([6], dtype=torch.int32))
    with pytest.raises(ValueError, match="k, v: expected both or neither"):
        f(q, k_cache, k_cache, k=torch.randn(1, 1, 2, 8), cache_seqlens=5, block_table=table)
    with pytest.raises(ValueError, match="cache_seqlens: expected 0 to 31"):
        f(q, k_cache, k_cache, torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8), cache_seqlens=32, block_table=table)
    with pytest.raises(TypeError, match="block_table: expected dtype int32, int64, got float32"):
        f(q, k_cache, k_cache, cache_seqlens=5, block_table=table.float())
    with pytest.raises(TypeError, match="k_cache: expected dtype float32, bfloat16, float16, got int8"):
        f(q, k_cache.to(torch.int8), k_cache, cache_seqlens=5, block_table=table)
    with pytest.raises(ValueError, match="q: expected 4 dimensions"):
        f(q[0], k_cache, k_cache, cache_seqlens=5, block_table=table)
    with pytest.raises(ValueError, match="multiple of the 2 kv heads"):
        f(torch.randn(1, 1, 3, 8), k_cache, k_cache, cache_seqlens=5, block_table=table)
    with pytest.raises(ValueError, match="rotary_cos: rotary embedding is applied only with k and v"):
        f(q, k_cache, k_cache, rotary_cos=torch.ones(4, 2), rotary_sin=torch.ones(4, 2), cache_seqlens=5,
          block_table=table)
    with pytest.raises(TypeError, match=r"k_cache: expected a CPU tensor mha can read, got tensors on meta"):
        f(q, k_cache.to("meta"), k_cache, cache_seqlens=5, block_table=table)
    with pytest.raises(TypeError, match=r"block_table: expected a CPU tensor mha can read, got a layout other than "
                                        r"strided"):
        f(q, k_cache, k_cache, cache_seqlens=5, block_table=table.to_sparse())
    p = mha.torch.paged_attention
    cu = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"key_scales: expected \(pages, Hkv, P\)"):
        p(q[0], k_cache.to(torch.int8), k_cache.to(torch.int8), table, cu, torch.tensor([5]))
    with pytest.raises(ValueError, match="key_scales: expected none"):
        p(q[0], k_cache, k_cache, table, cu, torch.tensor([5]), k_scales=torch.ones(4, 16, 2))
    with pytest.raises(ValueError, match="options.query_lengths: expected none in a paged call"):
        p(q[0], k_cache, k_cache, table, cu, torch.tensor([5]), query_lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="seqused_k: expected 1 values"):
        p(q[0], k_cache, k_cache, table, cu, torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="dropout_p: expected 0 with a block_table"):
        mha.torch.flash_attn_varlen_func(q[0], k_cache, k_cache, cu, torch.tensor([0, 5], dtype=torch.int32), 1, 5,
                                         dropout_p=0.1, block_table=table)


def test_numpy_paged_kv_cache():
    # mha.PagedKVCache (the C++ class): two sequences and a fork, written in two steps, attended with
    # their newest tokens' queries; each against the definition on the tokens written (float32
    # storage: the float32 rule; int8: the rounded numbers read back from the pages, the queries
    # rounded as the call rounds them).
    rng = np.random.default_rng(7)
    for dtype in ("float32", "int8"):
        cache = mha.PagedKVCache(layers=2, pages=16, page_size=8, kv_heads=2, head_dim=16, dtype=dtype)
        a, b = cache.add(), cache.add()
        written = {a: [], b: []}
        for counts in ((11, 3), (1, 1)):
            cache.extend([a, b], counts)
            k = rng.standard_normal((1, 2, sum(counts), 16)).astype(np.float32)
            v = rng.standard_normal((1, 2, sum(counts), 16)).astype(np.float32)
            cache.write(1, [a, b], k, v, [0, counts[0], sum(counts)])
            written[a].append((k[:, :, :counts[0]], v[:, :, :counts[0]]))
            written[b].append((k[:, :, counts[0]:], v[:, :, counts[0]:]))
        c = cache.fork(a)
        assert cache.length(c) == 12 and cache.pages_in_use == 2 + 1  # the fork shares a's two pages
        q = rng.standard_normal((1, 4, 3, 16)).astype(np.float32)  # a's last 2 tokens, b's last 1
        out, lse = cache.attend(1, [a, b], q, [0, 2, 3])
        key_pages, value_pages, key_scales, value_scales = cache.pages(1)
        table = cache.block_table([a, b])
        for s, rows in ((0, slice(0, 2)), (1, slice(2, 3))):
            n = cache.length([a, b][s])
            idx = np.arange(n)
            pages, slots = table[s][idx // 8], idx % 8
            K = key_pages[pages, :, slots].astype(np.float64)  # (n, Hkv, D)
            V = value_pages[pages, :, slots].astype(np.float64)
            Q = q[0, :, rows].astype(np.float64)  # (Hq, L, D)
            if dtype == "int8":
                K *= key_scales[pages, :, slots][..., None]
                V *= value_scales[pages, :, slots][..., None]
                scale = (np.abs(Q).max(-1, keepdims=True).astype(np.float32) / np.float32(127)).astype(np.float64)
                Q = np.round(Q / scale) * scale
            else:
                own = np.concatenate([x for x, _ in written[[a, b][s]]], axis=2)[0].transpose(1, 0, 2)
                assert np.array_equal(K, own)  # float32 pages hold what was written
            K, V = np.repeat(K, 2, axis=1).transpose(1, 0, 2), np.repeat(V, 2, axis=1).transpose(1, 0, 2)
            scores = Q @ K.transpose(0, 2, 1) / 4.0
            L = Q.shape[1]
            scores[:, np.arange(n)[None, :] > np.arange(L)[:, None] + n - L] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            expected = (p / p.sum(-1, keepdims=True)) @ V
            peer = (p.astype(np.float32) / p.astype(np.float32).sum(-1, keepdims=True)) @ V.astype(np.float32)
            assert_flash_rule(out[0, :, rows], expected, peer, f"{dtype} sequence {s}")
        cache.release(a)
        assert cache.length(c) == 12 and cache.pages_in_use == 2 + 1
        with pytest.raises(mha.ArgumentError, match="PagedKVCache::length: sequence: expected the id of a live"):
            cache.length(a)
