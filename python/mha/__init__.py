"""mha: scaled dot-product attention from the mha C++ library, for numpy arrays.

    import numpy as np, mha
    q, k, v = (np.random.rand(2, 8, 128, 64).astype(np.float32) for _ in range(3))
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=True)

Shapes, defaults and masks are PyTorch's torch.nn.functional.scaled_dot_product_attention's;
float32, float64, float16 and bfloat16 (ml_dtypes.bfloat16). Arrays are read in place (no copy) when their last dimension is contiguous;
outputs are new arrays. mha.torch (imported on its own, `import mha.torch`) has the PyTorch
operators, autograd and torch.compile included. docs/python.md has the details.
"""
from __future__ import annotations

from . import _core, _fields, _threads
from ._fields import ArgumentError, ArgumentTypeError
from ._threads import get_num_threads, set_num_threads
from ._paged import PagedKVCache
from ._sentence import SentenceEncoder

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_backward", "SentenceEncoder", "PagedKVCache",
           "set_num_threads", "get_num_threads", "ArgumentError", "ArgumentTypeError"]
__version__ = "0.1.0"


@_fields.signature
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, dropout_seed=None, return_logsumexp=False, **variants):
    """softmax(query · keyᵀ · scale + mask) · value, as torch.nn.functional.scaled_dot_product_attention.

    query (..., Hq, L, E), key (..., Hkv, S, E), value (..., Hkv, S, Ev): rank 2 or more, leading
    dimensions broadcast; Hkv must equal Hq (or broadcast) unless enable_gqa, which lets it be any
    divisor of Hq. float32, float64, float16 or bfloat16 (ml_dtypes.bfloat16), all three the same;
    the result has their dtype (half types computed in float, docs/bfloat16.md).
    attn_mask: broadcastable to (..., L, S); bool (True = may attend) or query's dtype (added to
    the scores, -inf blocks). Not allowed together with is_causal.
    is_causal: query i sees keys j <= i (top-left aligned, as PyTorch).
    scale: defaults to 1/sqrt(E).
    dropout_p: dropout on the attention probabilities, always applied when > 0; it needs
    dropout_seed (an integer in [0, 2**64)): the dropped entries are a function of the seed
    alone, so backward given the same seed drops the same ones.
    return_logsumexp: also return the float64 log-sum-exp of each score row, (..., Hq, L), which
    scaled_dot_product_attention_backward can take instead of recomputing it.
    window_size: (left, right), FlashAttention-2's sliding window: query i sees key j when
    i + d - left <= j <= i + d + right, -1 = unbounded on that side; d = 0 with is_causal, S - L
    without (FlashAttention's diagonal). Hugging Face's sliding_window = W is (W - 1, 0) with
    is_causal. The keys outside a row's window cost nothing.
    softcap: c > 0 makes each scaled score c * tanh(score / c) before the mask is added (Gemma 2,
    FlashAttention's softcap); 0 = none.
    sinks: (Hq,) one logit per query head that joins every row's softmax denominator and is left
    out of the output (gpt-oss); the logsumexp includes it. -inf = no sink.
    alibi_slopes: (Hq,) or (*batch, Hq): -slope * |i + d - j| is added to score (i, j), d as for
    window_size (FlashAttention-2's alibi_slopes).
    cu_seqlens_q, cu_seqlens_k: packed sequences (FlashAttention's varlen), int32 or int64 offsets
    (N + 1,): query (Hq, total_q, E), key and value (Hkv, total_k, E) (or with a batch of 1)
    hold N sequences back to back; sequence s has queries cu_seqlens_q[s]:cu_seqlens_q[s + 1] and
    keys cu_seqlens_k[s]:cu_seqlens_k[s + 1], and no query sees another sequence's keys.
    chunk_size: C > 0, Llama 4's chunked attention: the keys fall into chunks of C positions and
    query i sees only the chunk of its own key i + d (d as for window_size); 0 = none.
    query_lengths, key_lengths: (*batch,) int32 or int64, padding by lengths (FlashAttention's
    seqused_q / seqused_k): sequence b has its first query_lengths[b] queries and key_lengths[b]
    keys, the rest padding (a padding query gives 0); one per packed sequence with cu_seqlens.
    key_starts: (*batch,) left padding (FlashAttention's cache_leftpad): sequence b's keys begin at
    key_starts[b]; its positions (causality's diagonal, windows, chunks, ALiBi) are its own.

    Returns output (..., Hq, L, Ev) (and logsumexp). A row whose keys are all masked gives 0.
    """
    output, logsumexp, _ = _core.forward(query, key, value, attn_mask, dropout_p, _causal(is_causal), scale,
                                         enable_gqa, dropout_seed, _threads.get_num_threads(),
                                         _fields.variants(variants, "scaled_dot_product_attention"))
    return (output, logsumexp) if return_logsumexp else output


@_fields.signature
def scaled_dot_product_attention_backward(grad_output, query, key, value, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False, *, dropout_seed=None,
                                          output=None, logsumexp=None, **variants):
    """Gradients (grad_query, grad_key, grad_value) of sum(output · grad_output), each of its
    input's shape (summed over what was broadcast), and grad_sinks (Hq,) when sinks are given.

    The arguments are the forward's, plus grad_output (the output's shape and dtype). Pass the
    forward's output and logsumexp (scaled_dot_product_attention(..., return_logsumexp=True))
    to save a forward pass, or neither to have them recomputed. With dropout, dropout_seed must
    be the forward's.
    """
    return _core.backward(grad_output, query, key, value, output, logsumexp, attn_mask, dropout_p,
                          _causal(is_causal), scale, enable_gqa, dropout_seed, _threads.get_num_threads(),
                          _fields.variants(variants, "scaled_dot_product_attention_backward"))


def _causal(is_causal):
    if not isinstance(is_causal, (bool, _core.np.bool_)):
        raise ArgumentTypeError(f"is_causal: expected a bool, got {type(is_causal).__name__}")
    return "top_left" if is_causal else "none"
