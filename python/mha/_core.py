"""The numpy door's calls, shared by mha (numpy) and mha.torch: arrays checked (errors that name
the argument, what was expected and what came; mha checks everything again), brought to mha's
(B, H, L, D) form as _layout works it out, and handed to the binding (_mha) by dtype.
"""
from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

from . import _fields, _mha, _policy
from ._fields import ArgumentError, ArgumentTypeError
from ._layout import _shape, layout_of

CAUSAL = ("none", "top_left", "bottom_right")
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16)
_DTYPE_NAMES = "float32, float64, float16 or bfloat16 (ml_dtypes.bfloat16)"
# The binding's functions per dtype: float32 and float64 share overloaded names; float16 and
# bfloat16 arrays go as their bits (uint16, see _bits) to functions named after their type.
_SUFFIX = {DTYPES[0]: "", DTYPES[1]: "", DTYPES[2]: "_float16", BFLOAT16: "_bfloat16"}
_HALF = (DTYPES[2], BFLOAT16)


def _function(name, dtype):
    return getattr(_mha, name + _SUFFIX[dtype])


def _bits(x):
    """A float16 or bfloat16 array as its uint16 bits (the same memory), what the binding takes;
    other arrays (and None) as they are."""
    return x.view(np.uint16) if x is not None and x.dtype in _HALF else x


# ---------------------------------------------------------------------------------------------
# Arrays.

def viewable(x):
    """x when mha can read it in place: aligned, strides that are whole non-negative multiples
    of the element size, the last dimension contiguous; otherwise a contiguous copy."""
    flags = x.flags
    if flags.c_contiguous and flags.aligned and x.size:  # the common case, checked first: it is per call
        # numpy calls an array contiguous whatever the stride of a size-1 dimension, negative too
        return x if all(s >= 0 for s in x.strides) else x.copy()
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)  # no memory to share; fresh strides are never negative
    item = x.itemsize
    ok = x.flags.aligned and all(s >= 0 and s % item == 0 for s in x.strides)
    if ok and x.ndim and x.shape[-1] > 1:
        ok = x.strides[-1] == item
    return x if ok else np.ascontiguousarray(x)


def _to_flat(layout, name, x):
    x = viewable(x)
    if x.shape == layout.flat(name):  # already (B, H, n, d): nothing to broadcast (the common case)
        return x
    s = layout.padded[name]
    x5 = x.reshape(s[:-2] + (1,) + s[-2:])
    return np.broadcast_to(x5, layout.expanded(name)).reshape(layout.flat(name))


def _fold_gradient(layout, name, grad, shape):
    """The gradient of the original input from the gradient of its 4-D form: what was broadcast
    (batch dimensions of size 1, repeated heads) is summed."""
    g = grad.reshape(layout.expanded(name))
    s = layout.padded[name]
    own = s[:-2] + (1,) + s[-2:]
    axes = tuple(i for i, (a, b) in enumerate(zip(own, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _array(name, x):
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # anything numpy cannot take is the caller's type error
        raise ArgumentTypeError(f"{name}: expected an array, got {type(x).__name__} ({e})") from None


def check_inputs(query, key, value):
    query, key, value = (_array(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    if query.dtype not in DTYPES:
        raise ArgumentTypeError(f"query: expected dtype {_DTYPE_NAMES}, got {query.dtype}")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ArgumentTypeError(f"key, value: expected the dtype of query ({query.dtype}), "
                                f"got key {key.dtype} and value {value.dtype}")
    return query, key, value


def _finite(x):
    """Whether the real number x is finite (an int past float's range is not: mha takes doubles)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def check_options(attn_mask, dropout_p, causal, scale, dropout_seed, dtype):
    """Validates the options shared by forward and backward; returns the mask as an array."""
    if causal not in CAUSAL:
        raise ArgumentError(f"causal: expected one of {', '.join(CAUSAL)}, got {causal!r}")
    if attn_mask is not None:
        # PyTorch's rule for is_causal (top-left); bottom-right causality (FlashAttention's, that of
        # transformers' caches) combines with a mask: mha.transformers passes the padding that way.
        if causal == "top_left":
            raise ArgumentError("attn_mask: expected None when is_causal=True (PyTorch's rule: the causal "
                                "mask replaces it), got a mask")
        attn_mask = _array("attn_mask", attn_mask)
        # PyTorch's rule: bool, the query's dtype, or float32 (with a float64 query widened exactly)
        if attn_mask.dtype not in (np.bool_, dtype, np.float32):
            also = "" if dtype == np.float32 else " or float32"
            raise ArgumentTypeError(f"attn_mask: expected dtype bool (True = may attend) or {dtype}{also} (added to "
                                    f"the scores), got {attn_mask.dtype}")
        if dtype == np.float64 and attn_mask.dtype == np.float32:
            attn_mask = attn_mask.astype(np.float64)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p <= 1.0:
        raise ArgumentError(f"dropout_p: expected a probability in [0, 1], got {dropout_p!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not _finite(scale)):
        raise ArgumentError(f"scale: expected None (1/sqrt(head_dim)) or a finite number, got {scale!r}")
    if dropout_seed is None and dropout_p > 0:
        raise ArgumentError("dropout_seed: expected an integer seed when dropout_p > 0 (backward needs the "
                            "forward's seed to drop the same entries), got None")
    if dropout_seed is not None and (isinstance(dropout_seed, bool) or not isinstance(dropout_seed, numbers.Integral)
                                     or not 0 <= dropout_seed < 2**64):
        raise ArgumentError(f"dropout_seed: expected an integer in [0, 2**64), got {dropout_seed!r}")
    return attn_mask


def _masks(layout, attn_mask):
    """(attend_mask, additive_mask) for the binding: the mask broadcast to (B, H, L, S)."""
    if attn_mask is None:
        return None, None
    full = layout.mask_shape()
    m = attn_mask.shape
    if len(m) > len(full) or any(a not in (1, b) for a, b in zip(m[::-1], full[::-1])):
        raise ArgumentError(f"attn_mask: expected a shape broadcastable to (..., L, S) = {_shape(full)}, "
                            f"got {_shape(m)}")
    flat = (layout.batch_size, layout.heads, layout.query_len, layout.key_len)
    mask = np.broadcast_to(viewable(attn_mask), full).reshape(flat)
    return (mask, None) if mask.dtype == np.bool_ else (None, mask)


def _widened(x):
    """A half array widened to float32 (None and bool masks as they are)."""
    return x if x is None or x.dtype == np.bool_ else np.asarray(x, dtype=np.float32)  # (a float32 one as it is)


def _views(dtype, layout, given, attend=None, additive=None):
    """Options' typed views as the binding takes them (every view in its order, None where absent;
    mha checks their shapes): the masks; those of kind "value" (sinks (Hq), ALiBi slopes (Hq) or
    (*batch, Hq)) in the query's dtype as its bits, batch dimensions flattened; those of kind
    "index" (per-sequence lengths and starts (*batch), packed offsets (N + 1)) int32 or int64, as
    int64, batch dimensions flattened."""
    if not any(given.get(name) is not None for name, _ in _fields.VIEWS):  # the common case, per call
        return tuple({"attend_mask": attend, "additive_mask": additive}.get(name) for name, _ in _fields.ALL_VIEWS)
    given = {**given, "attend_mask": attend, "additive_mask": additive}
    packed = given.get("cu_seqlens_q") is not None or given.get("cu_seqlens_k") is not None
    out = []
    for name, kind in _fields.ALL_VIEWS:
        x = given.get(name)
        if x is None or name in _fields.MASKS:
            out.append(x)
        elif kind == "value":
            x = _bits(_value_view(name, x, dtype))
            if name == "alibi_slopes":
                _check_slopes(x, layout.batch, packed)
            out.append(x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x)
        else:
            x = _array(name, x)
            if x.dtype not in (np.int32, np.int64):
                raise ArgumentTypeError(f"{name}: expected int32 or int64 values, got dtype {x.dtype}")
            x = np.ascontiguousarray(x, dtype=np.int64)
            out.append(x.reshape(-1) if x.ndim > 1 else x)
    return tuple(out)


def _value_view(name, x, dtype):
    """A view of kind "value" (sinks, ALiBi slopes): a floating-point array, in `dtype`."""
    x = _array(name, x)
    if not (np.issubdtype(x.dtype, np.floating) or x.dtype == BFLOAT16):
        raise ArgumentTypeError(f"{name}: expected a floating-point array, got dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=dtype)


def _check_slopes(slopes, batch, packed):
    """ALiBi slopes (Hq), or (N, Hq) for N packed sequences (mha checks N), else (*batch, Hq): the
    call's batch dimensions."""
    if slopes.ndim > 1 and (slopes.ndim > 2 if packed else slopes.shape[:-1] != tuple(batch)):
        want = ("(Hq,) or (N, Hq) for N packed sequences" if packed else
                f"(Hq,) or (*batch, Hq) = ({', '.join(map(str, batch))}, Hq)" if batch else
                "(Hq,) (the inputs have no batch dimension)")
        raise ArgumentError(f"alibi_slopes: expected shape {want}, got {_shape(slopes.shape)}")


def _widened_variants(given, dtype):
    """The variants of a half call run as the float call: the views of kind "value", in the
    query's dtype, widened."""
    kinds = dict(_fields.VIEWS)
    return {n: _widened(_value_view(n, v, dtype)) if kinds.get(n) == "value" and v is not None else v
            for n, v in given.items()}


def _call(fn, *arguments):
    # mha's own checks come back as ValueError; they are argument errors like the ones above.
    # Positional: nanobind matches keywords by name, which costs microseconds on a small call.
    try:
        fn(*arguments)
    except ValueError as e:
        raise ArgumentError(str(e)) from None


def forward(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, num_threads,
            variants=None, need_weights=False):
    """(output, logsumexp, weights) of SDPA's shapes: output (*lead, L, Ev), logsumexp (*lead, L)
    float64, and with need_weights the probabilities (after dropout, sinks left out) (*lead, L, S)
    in the query's dtype, else None. variants: a dict of the call's variants by their C++ names
    (mha._fields)."""
    variants = variants or {}
    query, key, value = check_inputs(query, key, value)
    attn_mask = check_options(attn_mask, dropout_p, causal, scale, dropout_seed, query.dtype)
    scoring = _fields.scoring(causal, scale, dropout_p, dropout_seed, variants)
    layout = layout_of(query.shape, key.shape, value.shape, bool(enable_gqa))
    if _policy.as_float_call(query.dtype in _HALF, query, key, value, attn_mask):
        output, logsumexp, weights = forward(
            _widened(query), _widened(key), _widened(value), attn_mask, dropout_p, causal, scale, enable_gqa,
            dropout_seed, num_threads, _widened_variants(variants, query.dtype), need_weights)
        return output.astype(query.dtype), logsumexp, None if weights is None else weights.astype(query.dtype)
    attend, additive = _masks(layout, attn_mask)
    views = _views(query.dtype, layout, variants, attend, _bits(additive))
    output = np.empty(layout.output_shape(), query.dtype)
    logsumexp = np.empty(layout.logsumexp_shape(), np.float64)
    weights = np.empty(layout.mask_shape(), query.dtype) if need_weights else None
    B, H, L = layout.batch_size, layout.heads, layout.query_len
    _call(_function("sdpa_forward", query.dtype), _bits(_to_flat(layout, "query", query)),
          _bits(_to_flat(layout, "key", key)), _bits(_to_flat(layout, "value", value)),
          _bits(output.reshape(B, H, L, layout.value_dim)), logsumexp.reshape(B, H, L), scoring, views,
          num_threads, None if weights is None else _bits(weights.reshape(B, H, L, layout.key_len)))
    return output, logsumexp, weights


def _check_like(name, x, shape, dtype, source="the forward's inputs"):
    """x as an array of `shape` and `dtype` (from `source`): a wrong dtype is a type error."""
    x = _array(name, x)
    if tuple(x.shape) != tuple(shape) or x.dtype != dtype:
        error = ArgumentTypeError if x.dtype != dtype else ArgumentError
        raise error(f"{name}: expected shape {_shape(shape)} and dtype {dtype} (from {source}), "
                    f"got shape {_shape(x.shape)} and dtype {x.dtype}")
    return x


def backward(grad_output, query, key, value, output, logsumexp, attn_mask, dropout_p, causal, scale, enable_gqa,
             dropout_seed, num_threads, variants=None):
    """(grad_query, grad_key, grad_value), each of its input's shape, and grad_sinks (Hq) when
    sinks are given. output and logsumexp are the forward's; None for both recomputes them."""
    variants = variants or {}
    query, key, value = check_inputs(query, key, value)
    attn_mask = check_options(attn_mask, dropout_p, causal, scale, dropout_seed, query.dtype)
    scoring = _fields.scoring(causal, scale, dropout_p, dropout_seed, variants)
    layout = layout_of(query.shape, key.shape, value.shape, bool(enable_gqa))
    if (output is None) != (logsumexp is None):
        raise ArgumentError("output, logsumexp: expected both (the forward's results) or neither (recomputed), "
                            f"got {'output' if output is not None else 'logsumexp'} only")
    if output is None:
        output, logsumexp, _ = forward(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa,
                                       dropout_seed, num_threads, variants)
    grad_output = _check_like("grad_output", grad_output, layout.output_shape(), query.dtype)
    output = _check_like("output", output, layout.output_shape(), query.dtype)
    logsumexp = _check_like("logsumexp", logsumexp, layout.logsumexp_shape(), np.dtype(np.float64))
    if _policy.as_float_call(query.dtype in _HALF, query, key, value, attn_mask, layout):
        grads = backward(_widened(grad_output), _widened(query), _widened(key), _widened(value), _widened(output),
                         logsumexp, _widened(attn_mask), dropout_p, causal, scale, enable_gqa, dropout_seed,
                         num_threads, _widened_variants(variants, query.dtype))
        return tuple(g.astype(query.dtype) for g in grads)
    attend, additive = _masks(layout, attn_mask)
    views = _views(query.dtype, layout, variants, attend, _bits(additive))
    B, H, L = layout.batch_size, layout.heads, layout.query_len
    grads = {name: np.empty(layout.flat(name), query.dtype) for name in ("query", "key", "value")}
    sinks = variants.get("sinks")
    grad_sinks = None if sinks is None else np.empty(np.shape(sinks), query.dtype)
    _call(_function("sdpa_backward", query.dtype), _bits(_to_flat(layout, "query", query)),
          _bits(_to_flat(layout, "key", key)), _bits(_to_flat(layout, "value", value)),
          _bits(viewable(output).reshape(B, H, L, layout.value_dim)), viewable(logsumexp).reshape(B, H, L),
          _bits(viewable(grad_output).reshape(B, H, L, layout.value_dim)),
          _bits(grads["query"]), _bits(grads["key"]), _bits(grads["value"]), scoring, views, num_threads,
          _bits(grad_sinks))
    grads = tuple(_fold_gradient(layout, name, grads[name], x.shape)
                  for name, x in (("query", query), ("key", key), ("value", value)))
    return grads if grad_sinks is None else grads + (grad_sinks,)


def merge_attention_states(outputs, logsumexps):
    """The attention over the union of disjoint sets of keys from each set's (output (..., Dv),
    logsumexp (...)): mha::attention::merge_partial, in float64, sets in order. Returns (output in
    the outputs' dtype, logsumexp float64); a row no set sees stays 0 with -inf."""
    first = _array("output_a", outputs[0])
    if first.dtype not in DTYPES:
        raise ArgumentTypeError(f"output_a: expected dtype {_DTYPE_NAMES}, got {first.dtype}")
    shape = first.shape
    if len(shape) < 1:
        raise ArgumentError(f"output_a: expected at least 1 dimension (..., head_dim), got shape {_shape(shape)}")
    rows = math.prod(shape[:-1])
    merged = np.zeros((1, 1, rows, shape[-1]))
    merged_lse = np.full((1, 1, rows), -np.inf)
    for n, (out, lse) in enumerate(zip(outputs, logsumexps)):
        name = "ab"[n] if n < 2 else str(n)
        out = _check_like(f"output_{name}", out, shape, first.dtype, "output_a")
        lse = _array(f"lse_{name}", lse)
        floating = np.issubdtype(lse.dtype, np.floating) or lse.dtype == BFLOAT16
        if tuple(lse.shape) != tuple(shape[:-1]) or not floating:
            error = ArgumentError if floating else ArgumentTypeError
            raise error(f"lse_{name}: expected a floating-point array of shape {_shape(shape[:-1])} (the output's "
                        f"without its last dimension), got shape {_shape(lse.shape)} and dtype {lse.dtype}")
        _call(_function("merge_partial", first.dtype), merged, merged_lse,
              _bits(np.ascontiguousarray(out).reshape(1, 1, rows, shape[-1])),
              np.ascontiguousarray(lse, dtype=np.float64).reshape(1, 1, rows))
    return merged.reshape(shape).astype(first.dtype), merged_lse.reshape(shape[:-1])


# ---------------------------------------------------------------------------------------------
# Paged keys and values (a paged KV cache).

# The pages' storage dtypes, by the binding's names (paged_forward_<name>).
PAGED_DTYPES = {DTYPES[0]: "float32", BFLOAT16: "bfloat16", DTYPES[2]: "float16", np.dtype(np.int8): "int8"}


class _Packed:
    batch = ()  # (a paged call's queries are packed: _views' slope check needs no batch)


def paged_forward(query, key_pages, value_pages, block_table, cu_seqlens_q, key_lengths, causal, scale, num_threads,
                  variants=None, key_scales=None, value_scales=None):
    """Attention of N sequences' newest tokens over paged keys and values (mha::attention::
    paged_forward_into): query (1, Hq, T, Dqk) float32 with the sequences' queries back to back,
    cu_seqlens_q (N + 1) where each starts and key_lengths (N) its tokens in the pages (int32 or
    int64); key_pages / value_pages (pages, Hkv, P, D) float32, bfloat16, float16 or int8, any
    strides with rows contiguous; block_table (N, blocks) int32; int8 pages with key_scales /
    value_scales (pages, Hkv, P) float32. causal: "none" or "bottom_right". variants: the window,
    softcap, chunk_size, sinks (Hq), alibi_slopes ((Hq) or (N, Hq)). Returns (output (1, Hq, T, Dv)
    float32, logsumexp (1, Hq, T) float64)."""
    query = _array("query", query)
    if query.dtype != DTYPES[0]:
        raise ArgumentTypeError(f"query: expected float32 (a paged call computes in float32), got {query.dtype}")
    key_pages, value_pages = _array("key_pages", key_pages), _array("value_pages", value_pages)
    if key_pages.dtype not in PAGED_DTYPES:
        raise ArgumentTypeError(f"key_pages: expected dtype float32, bfloat16, float16 or int8, got {key_pages.dtype}")
    if value_pages.dtype != key_pages.dtype:
        raise ArgumentTypeError(f"value_pages: expected the dtype of key_pages ({key_pages.dtype}), got "
                                f"{value_pages.dtype}")
    block_table = _array("block_table", block_table)
    if block_table.dtype not in (np.int32, np.int64):
        raise ArgumentTypeError(f"block_table: expected int32 (or int64) page ids, got dtype {block_table.dtype}")
    if block_table.dtype == np.int64:  # (page ids past int32 are refused by mha, which names them)
        if block_table.size and (block_table.max() > np.iinfo(np.int32).max or block_table.min() < np.iinfo(np.int32).min):
            raise ArgumentError("block_table: expected page ids that fit int32, got values past it")
        block_table = block_table.astype(np.int32)
    scales = []
    for name, x in (("key_scales", key_scales), ("value_scales", value_scales)):
        if x is not None:
            x = _array(name, x)
            if x.dtype != DTYPES[0]:
                raise ArgumentTypeError(f"{name}: expected float32 scales, got dtype {x.dtype}")
            x = viewable(x)
        scales.append(x)
    given = {**(variants or {}), "cu_seqlens_q": cu_seqlens_q, "key_lengths": key_lengths}
    scoring = _fields.scoring(causal, scale, 0.0, None, given)
    views = _views(DTYPES[0], _Packed, given)
    if query.ndim != 4 or key_pages.ndim != 4 or value_pages.ndim != 4:  # (mha names the shapes)
        shape = query.shape if query.ndim != 4 else key_pages.shape if key_pages.ndim != 4 else value_pages.shape
        name = "query" if query.ndim != 4 else "key_pages" if key_pages.ndim != 4 else "value_pages"
        raise ArgumentError(f"{name}: expected 4 dimensions, got shape {_shape(shape)}")
    output = np.empty(query.shape[:3] + value_pages.shape[3:], np.float32)
    logsumexp = np.empty(query.shape[:3], np.float64)
    _call(getattr(_mha, "paged_forward_" + PAGED_DTYPES[key_pages.dtype]), viewable(query),
          _bits(viewable(key_pages)), _bits(viewable(value_pages)), viewable(block_table), scales[0], scales[1],
          output, logsumexp, scoring, views, num_threads)
    return output, logsumexp
