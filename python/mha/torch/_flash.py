"""FlashAttention-2's functions (flash_attn.flash_attn_interface), on the CPU: the same arguments,
layouts and semantics, so that code written for flash-attn runs unchanged. Its (B, S, H, D) and
(total, H, D) tensors are read in place as mha's (B, H, S, D) and (1, H, total, D) views."""
import operator

import torch
from torch import Tensor

from .. import _core, _fields, _layout, _policy
from ._paged import paged_attention
from ._sdpa import _attention


def _flash_checks(q, k, v, alibi_slopes, deterministic, return_attn_probs, dims):
    """dims: the tensors' dimensions, "(batch, seqlen, nheads, headdim)" or "(total, nheads, headdim)"."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise _core.ArgumentTypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != dims.count(",") + 1:
            raise _core.ArgumentError(f"{name}: expected {dims.count(',') + 1} dimensions {dims}, got shape "
                                      f"{_layout._shape(tuple(x.shape))}")
    _policy.refuse_inputs("q, k, v", _policy.unsupported(q, k, v, None))
    for name, flag in (("deterministic", deterministic), ("return_attn_probs", return_attn_probs)):
        if not isinstance(flag, bool):
            raise _core.ArgumentTypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if isinstance(alibi_slopes, Tensor):
        alibi_slopes = alibi_slopes.to(q.dtype)
    return alibi_slopes


@_fields.signature
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, **variants):
    """FlashAttention-2's flash_attn_func: q (B, L, Hq, D), k and v (B, S, Hkv, D) with Hkv dividing
    Hq (GQA); causal and the window on the bottom-right diagonal (query i's own key is i + S - L);
    softcap, alibi_slopes ((Hq,) or (B, Hq), FlashAttention's -slope * |i + S - L - j|) and dropout
    as FlashAttention's. mha's other variants, keyword-only, as in mha.torch.scaled_dot_product_attention
    (sinks (Hq,): gpt-oss's sink logits, with a gradient; chunk_size; key_lengths, key_starts, ...).

    Returns out (B, L, Hq, D); with return_attn_probs, (out, softmax_lse (B, Hq, L) float32, None):
    mha never builds the probabilities, so the third is None where FlashAttention returns them for
    its tests. deterministic: mha's backward is always deterministic (bitwise the same for any
    thread count). Differentiable in q, k, v and sinks; torch.compile(fullgraph=True) keeps it whole.
    """
    alibi_slopes = _flash_checks(q, k, v, alibi_slopes, deterministic, return_attn_probs,
                                 "(batch, seqlen, nheads, headdim)")
    variants = _fields.variants({**variants, "window_size": window_size, "softcap": softcap,
                                 "alibi_slopes": alibi_slopes}, "flash_attn_func")
    out, lse = _attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, dropout_p,
                          "bottom_right" if causal else "none", softmax_scale, True, variants)
    out = out.transpose(1, 2).contiguous()
    return (out, lse.to(torch.float32), None) if return_attn_probs else out


@_fields.signature
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, **variants):
    """FlashAttention-2's flash_attn_varlen_func: q (total_q, Hq, D), k and v (total_k, Hkv, D) hold
    N sequences back to back, cu_seqlens_q / cu_seqlens_k (N + 1,) int32 their offsets, each
    sequence attending to its own keys alone (causality, the window and ALiBi on each sequence's
    own bottom-right diagonal; alibi_slopes (Hq,) or (N, Hq)). max_seqlen_q / max_seqlen_k must be
    at least the longest sequence's. Returns out (total_q, Hq, D); with return_attn_probs,
    (out, softmax_lse (Hq, total_q) float32, None).

    With block_table (N, max_blocks) int32, as FlashAttention's paged varlen call: k and v are paged
    caches (num_blocks, page_block_size, Hkv, D), sequence i having cu_seqlens_k[i + 1] -
    cu_seqlens_k[i] tokens in them, its queries its last ones; mha.torch.paged_attention runs it
    (prefill chunks and decode rows in one call; inference only, no dropout, no gradient).
    """
    if block_table is not None:
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, Tensor) or x.dim() != 4:
                raise _core.ArgumentError(f"{name}: expected a paged cache (num_blocks, page_block_size, nheads_k, "
                                          f"headdim) with block_table, got "
                                          f"{_layout._shape(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__}")
        if dropout_p != 0.0:
            raise _core.ArgumentError(f"dropout_p: expected 0 with a block_table (a paged call has no dropout), "
                                      f"got {dropout_p}")
        if not isinstance(cu_seqlens_k, Tensor) or cu_seqlens_k.dim() != 1:
            raise _core.ArgumentTypeError(f"cu_seqlens_k: expected a 1-D int32 or int64 tensor of N + 1 offsets, got "
                                          f"{_layout._shape(tuple(cu_seqlens_k.shape)) if isinstance(cu_seqlens_k, Tensor) else type(cu_seqlens_k).__name__}")
        out = paged_attention(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k[1:] - cu_seqlens_k[:-1],
                              softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                              alibi_slopes=alibi_slopes, return_softmax_lse=return_attn_probs, **variants)
        return (*out, None) if return_attn_probs else out
    alibi_slopes = _flash_checks(q, k, v, alibi_slopes, deterministic, return_attn_probs, "(total, nheads, headdim)")
    for name, cu, longest in (("cu_seqlens_q", cu_seqlens_q, max_seqlen_q), ("cu_seqlens_k", cu_seqlens_k, max_seqlen_k)):
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            raise _core.ArgumentTypeError(f"{name}: expected a 1-D int32 or int64 tensor of N + 1 offsets, got "
                                          f"{type(cu).__name__ if not isinstance(cu, Tensor) else cu.dtype}"
                                          f"{'' if not isinstance(cu, Tensor) else ' ' + _layout._shape(tuple(cu.shape))}")
        if torch.compiler.is_compiling():  # (the offsets' values are not known while tracing)
            continue
        try:  # an int or what stands for one (np.int64, a 0-d integer tensor), as flash-attn takes
            length = None if isinstance(longest, bool) else operator.index(longest)
        except TypeError:
            length = None
        if length is None:
            raise _core.ArgumentTypeError(f"max_seqlen_{name[-1]}: expected an integer, got {type(longest).__name__}")
        # Offsets that decrease are refused by mha, which names them.
        if cu.numel() > 1 and bool((cu[1:] >= cu[:-1]).all()):
            needed = int((cu[1:] - cu[:-1]).max())
            if length < needed:
                raise _core.ArgumentError(f"max_seqlen_{name[-1]}: expected at least the longest sequence's {needed}, "
                                          f"got {length}")
    variants = _fields.variants({**variants, "window_size": window_size, "softcap": softcap,
                                 "alibi_slopes": alibi_slopes, "cu_seqlens_q": cu_seqlens_q,
                                 "cu_seqlens_k": cu_seqlens_k}, "flash_attn_varlen_func")
    out, lse = _attention(q.permute(1, 0, 2).unsqueeze(0), k.permute(1, 0, 2).unsqueeze(0),
                          v.permute(1, 0, 2).unsqueeze(0), None, dropout_p, "bottom_right" if causal else "none",
                          softmax_scale, True, variants)
    out = out[0].transpose(0, 1).contiguous()
    return (out, lse[0].to(torch.float32), None) if return_attn_probs else out

