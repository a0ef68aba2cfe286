"""Attention over KV caches for serving, on mha's paged call (mha::attention::paged_forward_into):
FlashAttention-2's flash_attn_with_kvcache, flash_attn_varlen_func's block_table (_flash.py calls
paged_attention), and mha's own paged_attention, which also reads int8 pages. Inference only: no
gradient flows through these calls (as FlashAttention's kvcache call has none)."""
import numbers

import torch
from torch import Tensor

from .. import _core, _fields, _layout, _policy
from ._tensors import _numpy, _threads

_STORAGE = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


def _tensor_arg(name, x, dims, dtypes=None):
    if not isinstance(x, Tensor):
        raise _core.ArgumentTypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    reason = _policy.unsupported_tensors([x])  # another device, nested, sparse, torch.func's
    if reason is not None:
        raise _core.ArgumentTypeError(f"{name}: expected a CPU tensor mha can read, got {reason}")
    ndim = len([d for d in dims.strip("()").split(",") if d.strip()])
    if x.dim() != ndim:
        raise _core.ArgumentError(f"{name}: expected {ndim} dimension{'s' * (ndim > 1)} {dims}, got shape "
                                  f"{_layout._shape(tuple(x.shape))}")
    if dtypes is not None and x.dtype not in dtypes:
        raise _core.ArgumentTypeError(f"{name}: expected dtype {', '.join(str(d)[6:] for d in dtypes)}, got "
                                      f"{str(x.dtype)[6:]}")
    return x


def _lengths(name, x, n):
    """Per-sequence int32/int64 values as an int64 tensor of n, or an int for all."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return torch.full((n,), int(x), dtype=torch.int64)
    _tensor_arg(name, x, "(batch,)", (torch.int32, torch.int64))
    if x.numel() != n:
        raise _core.ArgumentError(f"{name}: expected {n} values (one per sequence), got {x.numel()}")
    return x.to(torch.int64)


@_fields.signature
def paged_attention(q, k_pages, v_pages, block_table, cu_seqlens_q, seqused_k, *, k_scales=None, v_scales=None,
                    softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    return_softmax_lse=False, **variants):
    """N sequences' newest tokens against their paged keys and values, prefill chunks and decode rows
    in one call (vLLM's mixed batches): q (total_q, Hq, D) holds the sequences' queries back to back
    (FlashAttention's varlen layout), cu_seqlens_q (N + 1,) where each starts; seqused_k (N,) how
    many tokens each sequence has in the pages, its queries being its last ones (causal: each sees
    its sequence's tokens up to itself, bottom-right). k_pages, v_pages (num_pages, page_size, Hkv,
    D) in FlashAttention's paged layout (any strides with rows contiguous, so mha's own
    (num_pages, Hkv, page_size, D) transposed works too), float32, bfloat16, float16, or int8 with
    k_scales, v_scales (num_pages, page_size, Hkv) float32 (a token's numbers x stand for scale·x;
    the queries are then rounded to int8 the same way, docs/generation.md); block_table (N,
    max_blocks) int32. window_size, softcap, alibi_slopes ((Hq,) or (N, Hq)) as FlashAttention's;
    mha's variants keyword-only (sinks, chunk_size). Computes in float32; returns out (total_q, Hq,
    Dv) in q's dtype, and with return_softmax_lse (out, softmax_lse (Hq, total_q) float32)."""
    _tensor_arg("q", q, "(total_q, nheads, headdim)", (torch.float32, torch.bfloat16, torch.float16))
    _tensor_arg("k_pages", k_pages, "(num_pages, page_size, nheads_k, headdim)", _STORAGE)
    _tensor_arg("v_pages", v_pages, "(num_pages, page_size, nheads_k, headdim)", _STORAGE)
    _tensor_arg("block_table", block_table, "(batch, max_blocks)", (torch.int32, torch.int64))
    _tensor_arg("cu_seqlens_q", cu_seqlens_q, "(batch + 1,)", (torch.int32, torch.int64))
    n = block_table.shape[0]
    seqused_k = _lengths("seqused_k", seqused_k, n)
    scales = []
    for name, x in (("k_scales", k_scales), ("v_scales", v_scales)):
        if x is not None:
            x = _tensor_arg(name, x, "(num_pages, page_size, nheads_k)", (torch.float32,)).detach().transpose(1, 2)
        scales.append(None if x is None else _numpy(x))
    if not isinstance(causal, bool):
        raise _core.ArgumentTypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if isinstance(alibi_slopes, Tensor):
        alibi_slopes = alibi_slopes.detach().to(torch.float32)
    given = _fields.variants({**variants, "window_size": window_size, "softcap": softcap,
                              "alibi_slopes": alibi_slopes}, "paged_attention")
    given = {k: _numpy(v.detach().to(torch.float32)) if isinstance(v, Tensor) and k in ("sinks", "alibi_slopes") else
             _numpy(v.detach()) if isinstance(v, Tensor) else v for k, v in given.items()}
    query = q.detach().to(torch.float32).permute(1, 0, 2).unsqueeze(0)
    output, lse = _core.paged_forward(
        _numpy(query), _numpy(k_pages.detach().transpose(1, 2)), _numpy(v_pages.detach().transpose(1, 2)),
        _numpy(block_table.detach()), _numpy(cu_seqlens_q.detach()), _numpy(seqused_k),
        "bottom_right" if causal else "none", softmax_scale, _threads(), given, scales[0], scales[1])
    out = torch.from_numpy(output)[0].permute(1, 0, 2).to(q.dtype).contiguous()
    return (out, torch.from_numpy(lse)[0].to(torch.float32)) if return_softmax_lse else out


def _rotary(x, cos, sin, positions, interleaved):
    """x (B, L, H, D) with its first rotary_dim = 2·cos.shape[1] dimensions rotated at `positions`
    (B, L) as FlashAttention's apply_rotary_emb: GPT-NeoX's halves, or GPT-J's interleaved pairs."""
    half = cos.shape[1]
    c, s = cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)  # (B, L, 1, half)
    rot = x[..., :2 * half].to(torch.float32)
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    else:
        a, b = rot[..., :half], rot[..., half:]
        rotated = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """FlashAttention-2's flash_attn_with_kvcache on the CPU, the same arguments and semantics:
    q (B, Lq, Hq, D); k_cache, v_cache (B_cache, S_cache, Hkv, D), or with block_table (B,
    max_blocks) int32 a paged cache (num_blocks, page_block_size, Hkv, D) (any page size);
    cache_seqlens (int or (B,) int32) the tokens each sequence has; k, v (B, L_new, Hkv, D), when
    given, are written into the cache in place after them (at cache_seqlens[b] + t), rotated first
    by rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2) at their positions, as q is (at
    cache_seqlens + t when causal or windowed, else at cache_seqlens); cache_batch_idx (B,) the
    cache row of each sequence (no block_table). Then each query attends to its sequence's
    cache_seqlens + L_new tokens: causal and the window on the bottom-right diagonal, softcap,
    alibi_slopes ((Hq,) or (B, Hq)). The caches may be float32, bfloat16 or float16 (q any of
    them: mha computes in float32). cache_leftpad (B,) int32: where each sequence's tokens begin
    (left padding: the slots before it are seen by no query, and positions count from it).
    num_splits is FlashAttention's scheduling hint and is ignored. Returns out (B, Lq, Hq, D) in
    q's dtype, and with return_softmax_lse (out, softmax_lse (B, Hq, Lq) float32)."""
    _tensor_arg("q", q, "(batch, seqlen, nheads, headdim)", (torch.float32, torch.bfloat16, torch.float16))
    storage = (torch.float32, torch.bfloat16, torch.float16)
    _tensor_arg("k_cache", k_cache, "(batch_cache, seqlen_cache, nheads_k, headdim)", storage)
    _tensor_arg("v_cache", v_cache, "(batch_cache, seqlen_cache, nheads_k, headdim)", storage)
    if not isinstance(num_splits, numbers.Integral):
        raise _core.ArgumentTypeError(f"num_splits: expected an int, got {type(num_splits).__name__}")
    B, Lq = q.shape[0], q.shape[1]
    paged = block_table is not None
    if paged:
        _tensor_arg("block_table", block_table, "(batch, max_blocks)", (torch.int32, torch.int64))
        if cache_batch_idx is not None:
            raise _core.ArgumentError("cache_batch_idx: expected None with a block_table (the table says where each "
                                      "sequence's pages are)")
        page = k_cache.shape[1]
        capacity = block_table.shape[1] * page
        table = block_table
    else:
        rows = torch.arange(B, dtype=torch.int64) if cache_batch_idx is None else _lengths(
            "cache_batch_idx", cache_batch_idx, B)
        page = capacity = k_cache.shape[1]
        table = rows.to(torch.int32).unsqueeze(1)  # a contiguous cache: one page of S_cache tokens a row
    lengths = torch.full((B,), capacity, dtype=torch.int64) if cache_seqlens is None else _lengths(
        "cache_seqlens", cache_seqlens, B)
    if (k is None) != (v is None):
        raise _core.ArgumentError("k, v: expected both or neither (the new tokens' keys and values)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise _core.ArgumentError("rotary_cos, rotary_sin: expected both or neither")
    if rotary_cos is not None and k is None:
        raise _core.ArgumentError("rotary_cos: rotary embedding is applied only with k and v (the new tokens)")
    new = 0
    if k is not None:
        _tensor_arg("k", k, "(batch, seqlen_new, nheads_k, headdim)")
        _tensor_arg("v", v, "(batch, seqlen_new, nheads_k, headdim)")
        new = k.shape[1]
        if k.shape[0] != B or v.shape[:2] != k.shape[:2]:
            raise _core.ArgumentError(f"k, v: expected ({B}, seqlen_new, nheads_k, headdim) each, got "
                                      f"{_layout._shape(tuple(k.shape))} and {_layout._shape(tuple(v.shape))}")
        if int((lengths + new).max()) > capacity or int(lengths.min()) < 0:
            raise _core.ArgumentError(f"cache_seqlens: expected 0 to {capacity - new} (the cache holds {capacity} "
                                      f"tokens a sequence and {new} are new), got "
                                      f"{lengths.min().item()} to {lengths.max().item()}")
        positions = lengths.unsqueeze(1) + torch.arange(new)  # (B, new)
        if rotary_cos is not None:
            cos, sin = rotary_cos.to(torch.float32), rotary_sin.to(torch.float32)
            k = _rotary(k, cos, sin, positions, rotary_interleaved)
            q_positions = (lengths.unsqueeze(1) + torch.arange(Lq) if causal or tuple(window_size) != (-1, -1)
                           else lengths.unsqueeze(1).expand(B, Lq))
            q = _rotary(q, cos, sin, q_positions, rotary_interleaved)
        pages = table.to(torch.int64).gather(1, positions // page)  # (B, new)
        slots = positions % page
        with torch.no_grad():
            k_cache[pages, slots] = k.to(k_cache.dtype)
            v_cache[pages, slots] = v.to(v_cache.dtype)
    cu = torch.arange(B + 1, dtype=torch.int64) * Lq
    left = {} if cache_leftpad is None else {"key_starts": _lengths("cache_leftpad", cache_leftpad, B)}
    out = paged_attention(q.reshape(B * Lq, q.shape[2], q.shape[3]), k_cache, v_cache, table, cu, lengths + new,
                          softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                          alibi_slopes=alibi_slopes, return_softmax_lse=return_softmax_lse, **left)
    if return_softmax_lse:
        out, lse = out
        return out.reshape(B, Lq, *out.shape[1:]), lse.reshape(lse.shape[0], B, Lq).transpose(0, 1).contiguous()
    return out.reshape(B, Lq, *out.shape[1:])
