"""mha for PyTorch: scaled dot-product attention and nn.MultiheadAttention as torch operators,
with autograd and torch.compile.

    import torch, mha.torch
    out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's signature
    attention = mha.torch.MultiheadAttention(512, 8, batch_first=True)     # an nn.MultiheadAttention
    with mha.torch.patch():            # F.scaled_dot_product_attention and nn.MultiheadAttention are mha's
        model(x)

The forward and backward are operators registered with torch.library (SDPA's from schemas that
mha/_fields.py builds from mha's own field lists, the module's with custom_op)
(torch.ops.mha.sdpa_forward / sdpa_backward / sdpa_weights, torch.ops.mha.multihead_attention_forward /
multihead_attention_backward), each with a fake (shape-only) kernel and the forwards with an
autograd formula, so autograd works and torch.compile(fullgraph=True)
keeps them in one graph. They run mha's C++ kernels on the tensors' own memory: a CPU tensor is
viewed as a numpy array (Tensor.numpy(), no copy) and goes through the same code as the numpy
API (mha/_core.py). mha is not linked against libtorch, so one build works with any PyTorch >= 2.4.

Attention and nn.MultiheadAttention take float32, float64, float16 and bfloat16 tensors (bfloat16
read in place as ml_dtypes.bfloat16 arrays). Inputs mha does not take (another device, nested or
sparse tensors, a float mask that needs a gradient) go to PyTorch's own
scaled_dot_product_attention or nn.MultiheadAttention.forward, with a warning the first time for
each reason.
"""

import contextlib
import operator
import warnings

import numpy as np
import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import _core, _fields, _mha

__all__ = ["scaled_dot_product_attention", "MultiheadAttention", "patch", "flash_attn_func", "flash_attn_varlen_func",
           "merge_attention_states"]

# PyTorch's own, taken at import: the fallback, and what patch() puts back.
_torch_sdpa = torch.nn.functional.scaled_dot_product_attention
_TorchMultiheadAttention = torch.nn.MultiheadAttention


def _numpy(t):
    # detach(): numpy() refuses a tensor that requires grad; the array shares the memory. numpy
    # has no bfloat16 of its own: a bfloat16 tensor's bits become an ml_dtypes.bfloat16 array.
    if t is None:
        return None
    t = t.detach()
    return t.view(torch.uint16).numpy().view(_core.BFLOAT16) if t.dtype == torch.bfloat16 else t.numpy()


def _tensor(x):
    # The inverse of _numpy: the array's memory as a tensor, no copy.
    return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16) if x.dtype == _core.BFLOAT16 else torch.from_numpy(x)


def _threads():
    # torch's thread count (at most mha's own in a forked child: _core.torch_threads)
    return _core.torch_threads(torch.get_num_threads())


def _seed(dropout_seed):
    # The seed tensor holds an int64 drawn by torch; mha takes the same 64 bits as unsigned.
    return None if dropout_seed is None else int(dropout_seed) % 2**64


# The operators' arguments: SDPA's nine, then every variant of mha._fields in its order (the
# schemas, the kernels, the fakes and autograd are built from that one list).
_SDPA_SCHEMA = ("Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, str causal, float? scale, "
                "bool enable_gqa, Tensor? dropout_seed")


def _named(values, keywords=None):
    """Every variant by name from an operator's arguments after SDPA's nine: positional `values`
    (torch may leave trailing defaults out), then `keywords`, then the defaults."""
    return {**_fields.DEFAULTS, **dict(zip(_fields.NAMES, values)), **(keywords or {})}


def _variants(values, keywords):
    """The variants an operator's arguments give (tensors as arrays; absent views left out)."""
    given = {**dict(zip(_fields.NAMES, values)), **keywords}
    return {name: _numpy(v) if isinstance(v, Tensor) else v for name, v in given.items() if v is not None}


torch.library.define("mha::sdpa_forward", _fields.schema(_SDPA_SCHEMA, "(Tensor, Tensor)"))
torch.library.define("mha::sdpa_weights", _fields.schema(_SDPA_SCHEMA, "Tensor"))
torch.library.define("mha::sdpa_backward", _fields.schema(
    "Tensor grad_output, Tensor query, Tensor key, Tensor value, Tensor output, Tensor logsumexp, Tensor? attn_mask, "
    "float dropout_p, str causal, float? scale, bool enable_gqa, Tensor? dropout_seed", "(Tensor, Tensor, Tensor, Tensor)"))


def _sdpa_forward(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, *variants,
                  **keywords):
    """(output, logsumexp): output (..., Hq, L, Ev) and the float64 log-sum-exp of each score
    row (..., Hq, L). causal is "none", "top_left" (torch's is_causal) or "bottom_right";
    dropout_seed an int64 scalar tensor (None without dropout); the variants as in
    mha.scaled_dot_product_attention, by their C++ names (the window as window_left, window_right)."""
    output, logsumexp, _ = _core.forward(_numpy(query), _numpy(key), _numpy(value), _numpy(attn_mask), dropout_p,
                                         causal, scale, enable_gqa, _seed(dropout_seed), _threads(), _variants(variants, keywords))
    return _tensor(output), torch.from_numpy(logsumexp)


@torch.library.register_fake("mha::sdpa_forward")
def _(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, *variants,
      **keywords):
    layout = _core.Layout(query.shape, key.shape, value.shape, enable_gqa)
    return query.new_empty(layout.output_shape()), query.new_empty(layout.logsumexp_shape(), dtype=torch.float64)


def _sdpa_weights(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, *variants,
                  **keywords):
    """The attention probabilities (..., Hq, L, S) of sdpa_forward's call with the same arguments
    (after its dropout, the sinks' share left out), in the query's dtype. No gradient."""
    _, _, weights = _core.forward(_numpy(query), _numpy(key), _numpy(value), _numpy(attn_mask), dropout_p, causal,
                                  scale, enable_gqa, _seed(dropout_seed), _threads(), _variants(variants, keywords),
                                  need_weights=True)
    return _tensor(weights)


@torch.library.register_fake("mha::sdpa_weights")
def _(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, *variants,
      **keywords):
    return query.new_empty(_core.Layout(query.shape, key.shape, value.shape, enable_gqa).mask_shape())


def _sdpa_backward(grad_output, query, key, value, output, logsumexp, attn_mask, dropout_p, causal, scale, enable_gqa,
                   dropout_seed, *variants, **keywords):
    """(grad_query, grad_key, grad_value, grad_sinks), given sdpa_forward's arguments and results;
    grad_sinks is empty (0,) without sinks."""
    grads = _core.backward(_numpy(grad_output), _numpy(query), _numpy(key), _numpy(value), _numpy(output),
                           _numpy(logsumexp), _numpy(attn_mask), dropout_p, causal, scale, enable_gqa,
                           _seed(dropout_seed), _threads(), _variants(variants, keywords))
    grads = tuple(_tensor(g) for g in grads)
    return grads if len(grads) == 4 else grads + (query.new_empty(0),)


@torch.library.register_fake("mha::sdpa_backward")
def _(grad_output, query, key, value, output, logsumexp, attn_mask, dropout_p, causal, scale, enable_gqa,
      dropout_seed, *variants, **keywords):
    sinks = _named(variants, keywords)["sinks"]
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            query.new_empty(sinks.shape if sinks is not None else (0,)))


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed, *variants = inputs
    out, logsumexp = output
    ctx.mark_non_differentiable(logsumexp)
    named = _named(variants)
    ctx.save_for_backward(query, key, value, attn_mask, out, logsumexp, dropout_seed,
                          *(named[name] for name, _ in _fields.VIEWS))
    ctx.options = (dropout_p, causal, scale, enable_gqa)
    ctx.settings = tuple(named[name] for name, _ in _fields.SETTINGS)


def _backward(ctx, grad_output, _grad_logsumexp):
    query, key, value, attn_mask, out, logsumexp, dropout_seed, *views = ctx.saved_tensors
    grad_query, grad_key, grad_value, grad_sinks = torch.ops.mha.sdpa_backward(
        grad_output, query, key, value, out, logsumexp, attn_mask, *ctx.options, dropout_seed, *ctx.settings, *views)
    # No gradient for the mask (a mask that needs one goes to PyTorch), the options, the seed or
    # the variants, but the sinks' when they were given (mha._fields.DIFFERENTIABLE).
    given = dict(zip((name for name, _ in _fields.VIEWS), views))
    return (grad_query, grad_key, grad_value) + (None,) * 6 + tuple(
        grad_sinks if name in _fields.DIFFERENTIABLE and given.get(name) is not None else None
        for name in _fields.NAMES)


for _name, _kernel in (("sdpa_forward", _sdpa_forward), ("sdpa_weights", _sdpa_weights),
                      ("sdpa_backward", _sdpa_backward)):
    torch.library.impl(f"mha::{_name}", "cpu", _kernel)
torch.library.register_autograd("mha::sdpa_forward", _backward, setup_context=_setup_context)


def _unsupported_tensors(tensors):
    """Why mha cannot read these tensors (None entries are absent arguments), or None."""
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, Tensor):
            return "an argument that is not a tensor"
        if t.device.type != "cpu":
            return f"tensors on {t.device} (mha runs on the CPU)"
        if t.is_nested:
            return "nested tensors"
        if t.layout != torch.strided:
            return "a layout other than strided (sparse tensors)"
        # mha's operators read the tensors' memory: torch.func's wrapped tensors have none, and a
        # dual tensor's tangent would be dropped (the operators have no batching rule or jvp).
        # (torch.compile traces the transforms itself, and calls the operators)
        if not torch.compiler.is_compiling() and (torch._C._functorch.is_functorch_wrapped_tensor(t)
                                                  or forward_ad.unpack_dual(t).tangent is not None):
            return "a torch.func transform or forward-mode AD (mha's operators have neither a batching rule nor a jvp)"
    return None


def _autocast(*tensors):
    """The tensors as PyTorch's CPU autocast gives them to its SDPA and nn.MultiheadAttention: inside
    torch.autocast("cpu"), each floating-point tensor but a float64 one in the autocast dtype."""
    if not torch.is_autocast_enabled("cpu"):
        return tensors
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


def _unsupported(query, key, value, attn_mask):
    """Why mha cannot run these inputs (PyTorch's SDPA then does), or None. One pass, attribute
    reads only: it runs on every call."""
    reason = _unsupported_tensors((query, key, value, attn_mask))
    if reason is not None:
        return reason
    if query.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return f"dtype {query.dtype} (mha takes float32, float64, float16 and bfloat16)"
    if attn_mask is not None and attn_mask.requires_grad:
        return "a float attn_mask that requires grad (mha computes no gradient for the mask)"
    return None


def _window_mask(query, key, attn_mask, causal, window):
    """The bool (L, S) mask (True = may attend) of a window and its causality, from its definition
    (mha.scaled_dot_product_attention), ANDed with a bool attn_mask or -inf where a float one is
    added: for PyTorch's SDPA, which has no window."""
    L, S = query.shape[-2], key.shape[-2]
    diagonal = 0 if causal == "top_left" else S - L
    i = torch.arange(L, device=query.device).unsqueeze(-1) + diagonal
    j = torch.arange(S, device=query.device)
    see = torch.ones(L, S, dtype=torch.bool, device=query.device)
    if window[0] >= 0:
        see &= j >= i - window[0]
    if window[1] >= 0:
        see &= j <= i + window[1]
    if causal != "none":
        see &= j <= i
    if attn_mask is None or isinstance(attn_mask, CausalBias):  # a CausalBias is in `causal`
        return see
    if attn_mask.dtype == torch.bool:
        return see & attn_mask
    return attn_mask.masked_fill(~see, float("-inf"))


_warned = set()


def _fall_back(reason, what="scaled_dot_product_attention"):
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        warnings.warn(f"mha.torch.{what}: {reason}; using PyTorch's {what} instead (this warning is shown once)",
                      stacklevel=3)


def _attention(query, key, value, mask, dropout_p, causal, scale, enable_gqa, variants, need_weights=False):
    """(output, logsumexp) of mha's operator on inputs mha runs, `variants` a dict by the C++ names
    (mha._fields): the seed drawn when dropout needs one, the operator when autograd or
    torch.compile needs it, else its body. With need_weights, (output, logsumexp, weights): the
    probabilities of the same call (the same dropout seed), by a second pass, without a gradient."""
    # Drawn from the default generator only when used, so that without dropout the random
    # stream is left as PyTorch's SDPA leaves it.
    seed = torch.randint(2**63 - 1, (), dtype=torch.int64) if dropout_p > 0 else None
    args = (query, key, value, mask, dropout_p, causal, scale, enable_gqa, seed, *_fields.arguments(variants))
    # The dispatcher's ~10 us per call are a twentieth of a small attention (bench_python.py).
    needs_op = torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (query, key, value, *(variants.get(name) for name in _fields.DIFFERENTIABLE))))
    output, logsumexp = torch.ops.mha.sdpa_forward(*args) if needs_op else _sdpa_forward(*args)
    if not need_weights:
        return output, logsumexp
    weights = torch.ops.mha.sdpa_weights(*(a.detach() if isinstance(a, Tensor) else a for a in args))
    return output, logsumexp, weights


def _check_variants_run(reason, variants):
    """Every variant but the window (a mask for PyTorch) exists in mha alone: inputs mha cannot run
    are refused when one is given."""
    given = [name for name, x in variants.items() if name not in ("window_left", "window_right") and x is not None
             and (name not in _fields.SETTING_NAMES or x != _fields.DEFAULTS[name])]
    if given and reason is not None:
        raise _core.ArgumentError(f"{', '.join(given)}: mha runs these only on floating-point CPU tensors, and "
                                  f"PyTorch's attention, which takes the rest, has no such argument; got {reason}")


@_fields.signature
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, **variants):
    """torch.nn.functional.scaled_dot_product_attention, computed by mha: same arguments, same
    shapes, same results up to rounding (bitwise the same for any thread count).

    mha's own variants, keyword-only, as in mha.scaled_dot_product_attention: window_size (left,
    right), a sliding window (FlashAttention-2's; keys outside it cost nothing); softcap (Gemma 2's
    logit soft-cap); chunk_size (Llama 4's chunked attention); sinks (Hq,), one logit per head in
    every row's softmax, with its gradient (gpt-oss); alibi_slopes (Hq,) or (*batch, Hq);
    query_lengths, key_lengths and key_starts (padding as lengths); cu_seqlens_q, cu_seqlens_k
    (packed sequences).

    attn_mask may be a torch.nn.attention.bias.CausalBias: upper-left is is_causal, lower-right
    is mha's bottom-right causal mask. With dropout_p > 0 the seed is drawn from torch's default
    generator (torch.manual_seed repeats a run) and kept for backward. mha uses
    torch.get_num_threads() threads.
    """
    causal = "top_left" if is_causal else "none"
    mask = attn_mask
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("CausalBias should not be used with causal=True")  # PyTorch's own check
        lower_right = attn_mask.variant == CausalVariant.LOWER_RIGHT and attn_mask.seq_len_q != attn_mask.seq_len_kv
        causal, mask = ("bottom_right" if lower_right else "top_left"), None
    variants = _fields.variants(variants, "scaled_dot_product_attention")
    window = (variants.get("window_left", -1), variants.get("window_right", -1))
    reason = _unsupported(query, key, value, mask)
    _check_variants_run(reason, variants)
    if reason is not None:
        _fall_back(reason)
        if window != (-1, -1):  # PyTorch has no window: the same keys as a dense bool mask
            attn_mask, is_causal = _window_mask(query, key, attn_mask, causal, window), False
        if isinstance(attn_mask, CausalBias) and torch.nn.functional.scaled_dot_product_attention is not _torch_sdpa:
            # Inside patch(), a CausalBias passed on as is would reach PyTorch's kernel as a plain
            # tensor of meaningless values: its __torch_function__ recognises
            # F.scaled_dot_product_attention by identity, and that is now this function. So it goes
            # as what it stands for, as CausalBias's own dispatch sends it: is_causal (top-left), or
            # the bottom-right mask, materialised as PyTorch does when no fused kernel takes it.
            if causal == "bottom_right":
                length, source = attn_mask.seq_len_q, attn_mask.seq_len_kv
                attn_mask = torch.ones(length, source, dtype=torch.bool, device=query.device).tril(source - length)
            else:
                attn_mask, is_causal = None, True
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    query, key, value, mask = _autocast(query, key, value, mask)
    output, _ = _attention(query, key, value, mask, dropout_p, causal, scale, enable_gqa, variants)
    return output


# ---------------------------------------------------------------------------------------------
# FlashAttention-2's functions (flash_attn.flash_attn_interface), on the CPU: the same arguments,
# layouts and semantics, so that code written for flash-attn runs unchanged. Its (B, S, H, D) and
# (total, H, D) tensors are read in place as mha's (B, H, S, D) and (1, H, total, D) views.

def _flash_checks(q, k, v, alibi_slopes, deterministic, return_attn_probs, dims):
    """dims: the tensors' dimensions, "(batch, seqlen, nheads, headdim)" or "(total, nheads, headdim)"."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise _core.ArgumentTypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != dims.count(",") + 1:
            raise _core.ArgumentError(f"{name}: expected {dims.count(',') + 1} dimensions {dims}, got shape "
                                      f"{_core._shape(tuple(x.shape))}")
    reason = _unsupported(q, k, v, None)
    if reason is not None:
        raise _core.ArgumentError(f"q, k, v: expected floating-point CPU tensors mha can read, got {reason}")
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
    (out, softmax_lse (Hq, total_q) float32, None). block_table (paged KV) is not supported.
    """
    alibi_slopes = _flash_checks(q, k, v, alibi_slopes, deterministic, return_attn_probs, "(total, nheads, headdim)")
    if block_table is not None:
        raise _core.ArgumentError("block_table: expected None (mha does not read paged KV caches), got a tensor")
    for name, cu, longest in (("cu_seqlens_q", cu_seqlens_q, max_seqlen_q), ("cu_seqlens_k", cu_seqlens_k, max_seqlen_k)):
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            raise _core.ArgumentTypeError(f"{name}: expected a 1-D int32 or int64 tensor of N + 1 offsets, got "
                                          f"{type(cu).__name__ if not isinstance(cu, Tensor) else cu.dtype}"
                                          f"{'' if not isinstance(cu, Tensor) else ' ' + _core._shape(tuple(cu.shape))}")
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


def merge_attention_states(output_a, lse_a, output_b, lse_b):
    """The attention over two disjoint sets of keys from each set's output (..., D) and
    log-sum-exp (...) (= output.shape[:-1]; FlashAttention's (B, H, L) lse is
    softmax_lse.transpose(1, 2) for its (B, L, H, D) out): shared prefixes (cascade attention),
    chunked prefill, context parallelism. Returns (output, lse) in the inputs' dtypes, merged in
    float64 by mha's merge_partial; a row neither set sees stays 0 with -inf. No autograd.
    """
    for name, x in (("output_a", output_a), ("lse_a", lse_a), ("output_b", output_b), ("lse_b", lse_b)):
        if not isinstance(x, Tensor) or x.device.type != "cpu":
            raise _core.ArgumentTypeError(f"{name}: expected a CPU torch.Tensor, got "
                                          f"{type(x).__name__ if not isinstance(x, Tensor) else x.device}")
    output, lse = _core.merge_attention_states((_numpy(output_a), _numpy(output_b)), (_numpy(lse_a), _numpy(lse_b)))
    return _tensor(output), torch.from_numpy(lse).to(lse_a.dtype)


# ---------------------------------------------------------------------------------------------
# nn.MultiheadAttention.
#
# The operators take the module's parameters as tensors (None where the module has none) and run
# mha::nn::multihead_attention_forward / _backward on their memory. Custom operators cannot carry
# a C++ object from forward to backward, so the forward also returns what backward needs, as
# tensors that own mha's buffers (no copy): the projections q (N, L, E), k and v (N, S', E) (S'
# counting the add_bias_kv / add_zero_attn keys), the float64 logsumexp (N, H, L) and the merged
# heads (N, L, E). torch saves them with the inputs; backward views them again and recomputes the
# canonical masks from the module's masks (cheap next to the attention).

_PARAMETERS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k",
               "bias_v", "out_proj_weight", "out_proj_bias")
# The same by their state_dict names, for messages.
_PARAMETER_NAMES = tuple(name.replace("out_proj_", "out_proj.") for name in _PARAMETERS)


def _memory(t):
    # mha reads row-major memory: a tensor that is not is copied once here (torch's parameters and
    # batch-first inputs already are). float16 and bfloat16 go as their uint16 bits.
    return None if t is None else _core._bits(_numpy(t.detach().contiguous()))


def _from_mha(array, dtype):
    # An array the binding returned as a tensor of `dtype` (a half type's uint16 bits viewed as it).
    return torch.from_numpy(array).view(dtype) if array.dtype == np.uint16 else torch.from_numpy(array)


# The binding's functions take the dtype's numpy counterpart (bfloat16: ml_dtypes').
_NUMPY_DTYPE = {torch.float32: _core.DTYPES[0], torch.float64: _core.DTYPES[1], torch.float16: _core.DTYPES[2],
                torch.bfloat16: _core.BFLOAT16}


def _mha_call(fn, *arguments):
    # mha's own checks come back as ValueError: argument errors, also RuntimeErrors as in PyTorch.
    try:
        return fn(*arguments)
    except ValueError as e:
        raise _core.ArgumentError(str(e)) from None


# The operators' arguments: the module's own (its inputs, parameters, masks and options), then
# its variants of mha._fields (MODULE_NAMES: its settings, then a call's views).
_MODULE_SCHEMA = ", ".join(["Tensor query, Tensor key, Tensor value"] + [
    f"Tensor{'' if name == 'out_proj_weight' else '?'} {name}" for name in _PARAMETERS] + [
    "Tensor? key_padding_mask, Tensor? attn_mask, int embed_dim, int kdim, int vdim, int num_heads, "
    "bool add_zero_attn, bool batch_first, bool need_weights"])
torch.library.define("mha::multihead_attention_forward", _fields.schema(
    _MODULE_SCHEMA + ", bool average_attn_weights, bool is_causal, float dropout_p, Tensor? dropout_seed",
    "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", _fields.MODULE_SETTINGS, _fields.MODULE_VIEWS))
torch.library.define("mha::multihead_attention_backward", _fields.schema(
    "Tensor grad_output, " + _MODULE_SCHEMA + ", bool is_causal, float dropout_p, Tensor? dropout_seed, Tensor q, "
    "Tensor k, Tensor v, Tensor logsumexp, Tensor merged", "(" + ", ".join(["Tensor"] * 13) + ")",
    _fields.MODULE_SETTINGS, _fields.MODULE_VIEWS))


def _module_named(values, keywords=None):
    """Every module variant by name from an operator's arguments after its own: positional
    `values` (torch may leave trailing defaults out), then `keywords`, then the defaults."""
    return {**_fields.MODULE_DEFAULTS, **dict(zip(_fields.MODULE_NAMES, values)), **(keywords or {})}


def _module_variants(values, keywords):
    """(scoring, views) of a module operator's variants as the binding takes them: an _mha.Scoring
    of the module's settings, and the call's views in order (their memory, None where absent)."""
    named = _module_named(values, keywords)
    return (_fields.scoring("none", named["scale"], 0.0, None, named),
            [_memory(named[name]) for name in _fields.MODULE_VIEWS])


def _multihead_attention_forward(query, key, value, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight,
                                 in_proj_bias, bias_k, bias_v, out_proj_weight, out_proj_bias, key_padding_mask,
                                 attn_mask, embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first,
                                 need_weights, average_attn_weights, is_causal, dropout_p, dropout_seed, *variants,
                                 **keywords):
    """(output, attn_weights, q, k, v, logsumexp, merged): nn.MultiheadAttention's output and
    weights (an empty tensor when need_weights is False), then what the backward takes. dropout_p
    is the module's in training and 0 otherwise; dropout_seed an int64 scalar tensor (None
    without dropout); the variants by mha._fields.MODULE_NAMES."""
    scoring, views = _module_variants(variants, keywords)
    results = _mha_call(
        _core._function("multihead_attention_forward", _NUMPY_DTYPE[query.dtype]), _memory(query), _memory(key),
        _memory(value), _memory(in_proj_weight), _memory(q_proj_weight), _memory(k_proj_weight),
        _memory(v_proj_weight), _memory(in_proj_bias), _memory(bias_k), _memory(bias_v), _memory(out_proj_weight),
        _memory(out_proj_bias), _memory(key_padding_mask), _memory(attn_mask), embed_dim, kdim, vdim, num_heads,
        add_zero_attn, batch_first, need_weights, average_attn_weights, is_causal, dropout_p,
        _seed(dropout_seed) or 0, scoring, views, _threads())
    output, weights, *saved = (None if r is None else _from_mha(r, query.dtype) for r in results)
    return (output, query.new_empty((0,)) if weights is None else weights, *saved)


def _sizes(query, key, batch_first, num_heads, bias_k, add_zero_attn):
    """(unbatched, N, L, S') of the forward's inputs; S' counts the appended keys."""
    unbatched = query.dim() == 2
    if unbatched:
        n, length, source = 1, query.shape[0], key.shape[0]
    elif batch_first:
        n, length, source = query.shape[0], query.shape[1], key.shape[1]
    else:
        n, length, source = query.shape[1], query.shape[0], key.shape[0]
    return unbatched, n, length, source + (bias_k is not None) + bool(add_zero_attn)


@torch.library.register_fake("mha::multihead_attention_forward")
def _(query, key, value, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v,
      out_proj_weight, out_proj_bias, key_padding_mask, attn_mask, embed_dim, kdim, vdim, num_heads, add_zero_attn,
      batch_first, need_weights, average_attn_weights, is_causal, dropout_p, dropout_seed, *variants, **keywords):
    unbatched, n, length, keys = _sizes(query, key, batch_first, num_heads, bias_k, add_zero_attn)
    weights = (length, keys) if average_attn_weights else (num_heads, length, keys)
    weights = query.new_empty(((() if unbatched else (n,)) + weights) if need_weights else (0,))
    projections = [query.new_empty((n, s, embed_dim)) for s in (length, keys, keys)]
    return (query.new_empty(query.shape), weights, *projections,
            query.new_empty((n, num_heads, length), dtype=torch.float64), query.new_empty((n, length, embed_dim)))


def _multihead_attention_backward(grad_output, query, key, value, in_proj_weight, q_proj_weight, k_proj_weight,
                                  v_proj_weight, in_proj_bias, bias_k, bias_v, out_proj_weight, out_proj_bias,
                                  key_padding_mask, attn_mask, embed_dim, kdim, vdim, num_heads, add_zero_attn,
                                  batch_first, need_weights, is_causal, dropout_p, dropout_seed, q, k, v, logsumexp,
                                  merged, *variants, **keywords):
    """(grad_query, grad_key, grad_value, then one gradient per parameter in the forward's order,
    then grad_sinks: an empty tensor where the module has no such parameter, or the call no sinks),
    given the forward's arguments and its saved results."""
    scoring, views = _module_variants(variants, keywords)
    parameters = (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v,
                  out_proj_weight, out_proj_bias)
    # mha adds the parameter gradients into these.
    grads = [None if p is None else torch.zeros(p.shape, dtype=p.dtype) for p in parameters]
    *inputs, grad_sinks = _mha_call(
        _core._function("multihead_attention_backward", _NUMPY_DTYPE[query.dtype]), _memory(grad_output),
        _memory(query), _memory(key), _memory(value), *(_memory(p) for p in parameters), _memory(key_padding_mask),
        _memory(attn_mask), embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first, need_weights, is_causal,
        dropout_p, _seed(dropout_seed) or 0, scoring, views, _memory(q), _memory(k), _memory(v), _memory(logsumexp),
        _memory(merged), *(None if g is None else _core._bits(_numpy(g)) for g in grads), _threads())
    return (*(_from_mha(g, query.dtype) for g in inputs), *(query.new_empty((0,)) if g is None else g for g in grads),
            query.new_empty((0,)) if grad_sinks is None else _from_mha(grad_sinks, query.dtype))


@torch.library.register_fake("mha::multihead_attention_backward")
def _(grad_output, query, key, value, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias,
      bias_k, bias_v, out_proj_weight, out_proj_bias, *rest, **keywords):
    parameters = (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v,
                  out_proj_weight, out_proj_bias)
    sinks = _module_named(rest[17:], keywords)["sinks"]
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            *(query.new_empty((0,)) if p is None else p.new_empty(p.shape) for p in parameters),
            query.new_empty((0,) if sinks is None else sinks.shape))


for _name, _kernel in (("multihead_attention_forward", _multihead_attention_forward),
                      ("multihead_attention_backward", _multihead_attention_backward)):
    torch.library.impl(f"mha::{_name}", "cpu", _kernel)

# The module operators' own arguments after the inputs and parameters: the masks, ten options and
# the seed (the forward's), which get no gradient.
_MODULE_OWN = 13


def _mha_setup_context(ctx, inputs, output):
    (query, key, value, *parameters) = inputs[:12]
    key_padding_mask, attn_mask = inputs[12:14]
    (embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first, need_weights, _average, is_causal, dropout_p,
     dropout_seed) = inputs[14:25]
    named = _module_named(inputs[25:])
    _output, weights, *saved = output
    # mha computes gradients of the output only: the attention weights carry none.
    ctx.mark_non_differentiable(weights, *saved)
    ctx.save_for_backward(query, key, value, *parameters, key_padding_mask, attn_mask, dropout_seed, *saved,
                          *(named[name] for name in _fields.MODULE_VIEWS))
    ctx.options = (embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first, need_weights, is_causal, dropout_p)
    ctx.settings = tuple(named[name] for name, _ in _fields.MODULE_SETTINGS)
    ctx.parameter_count = len(parameters)


def _mha_backward(ctx, grad_output, *_grads_of_non_differentiable):
    query, key, value, *rest = ctx.saved_tensors
    parameters, rest = rest[:ctx.parameter_count], rest[ctx.parameter_count:]
    key_padding_mask, attn_mask, dropout_seed, *rest = rest
    saved, views = rest[:5], rest[5:]
    grads = torch.ops.mha.multihead_attention_backward(grad_output, query, key, value, *parameters,
                                                       key_padding_mask, attn_mask, *ctx.options, dropout_seed,
                                                       *saved, *ctx.settings, *views)
    grad_inputs, grad_parameters, grad_sinks = grads[:3], grads[3:-1], grads[-1]
    grad_parameters = tuple(None if p is None else g for p, g in zip(parameters, grad_parameters))
    # No gradient for the masks (a mask that needs one goes to PyTorch), the options, the seed or the
    # settings; the sinks' when they were given (mha._fields.DIFFERENTIABLE).
    given = dict(zip(_fields.MODULE_VIEWS, views))
    return (*grad_inputs, *grad_parameters) + (None,) * _MODULE_OWN + tuple(
        grad_sinks if name in _fields.DIFFERENTIABLE and given.get(name) is not None else None
        for name in _fields.MODULE_NAMES)


torch.library.register_autograd("mha::multihead_attention_forward", _mha_backward, setup_context=_mha_setup_context)
multihead_attention_forward = torch.ops.mha.multihead_attention_forward
multihead_attention_backward = torch.ops.mha.multihead_attention_backward


class MultiheadAttention(_TorchMultiheadAttention):
    """torch.nn.MultiheadAttention whose forward runs mha: the same constructor, parameters,
    state_dict and initialisation (it is a subclass and adds no parameter), and the same forward
    arguments and results.

    mha's variants, keyword-only: the module's settings at construction, applied by every call
    (window_size=(left, right), a sliding window; softcap, Gemma 2's logit soft-cap; chunk_size,
    Llama 4's chunked attention; scale, q·k's multiplier instead of 1/sqrt(head_dim)), and a call's
    views in forward (sinks (num_heads,), one logit per head in every row's softmax, with its
    gradient; alibi_slopes (num_heads,) or (N, num_heads)), all as in
    mha.scaled_dot_product_attention. Built from mha's own lists (mha._fields).

    Differences: a query whose keys are all masked gets zero attention (weights 0, output
    out_proj.bias) where PyTorch's need_weights=True path gives NaN; the attention weights carry
    no gradient (the output does, to the inputs and every parameter). bfloat16 and float16 modules
    run mha's module in that type (bfloat16 products on the CPU's bf16 instructions where it has
    them; float16 stored in float16, computed in float). Inputs mha does not take (another device,
    nested or sparse tensors, a float mask that requires grad) run PyTorch's forward instead, with a
    warning the first time for each reason.
    """

    def __init__(self, *args, **kwargs):
        settings = {name: kwargs.pop(name) for name in list(kwargs) if name in _fields.MODULE_KEYWORDS}
        super().__init__(*args, **kwargs)
        # The settings by their C++ names (MultiheadAttentionOptions::scoring), checked now.
        self.scoring = _fields.module_settings(settings, "MultiheadAttention")
        _mha_call(_mha.check_module_scoring,
                  _fields.scoring("none", self.scoring.get("scale"), 0.0, None, self.scoring))

    def extra_repr(self):
        given = {name: value for name, value in self.scoring.items() if value != _fields.MODULE_DEFAULTS[name]}
        return ", ".join([super().extra_repr()] + [f"{name}={value!r}" for name, value in given.items()])

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, **views):
        for name in views:
            if name not in _fields.MODULE_VIEWS:
                raise _core.ArgumentTypeError(f"MultiheadAttention.forward() got an unexpected keyword argument "
                                              f"{name!r} (mha's views: {', '.join(_fields.MODULE_VIEWS)})")
        views = {name: view for name, view in views.items() if view is not None}
        # (A module unpickled from before the settings has none.)
        settings = {n: v for n, v in getattr(self, "scoring", {}).items() if v != _fields.MODULE_DEFAULTS[n]}
        parameters = (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight,
                      self.in_proj_bias, self.bias_k, self.bias_v, self.out_proj.weight, self.out_proj.bias)
        reason = _unsupported_tensors((query, key, value, key_padding_mask, attn_mask, *parameters, *views.values()))
        if reason is None:
            reason = _mha_unsupported_types(query, parameters, key_padding_mask, attn_mask)
        if reason is not None:
            if settings or views:
                raise _core.ArgumentError(f"{', '.join([*settings, *views])}: mha runs these only on inputs it takes, "
                                          f"and PyTorch's MultiheadAttention, which takes the rest, has no such "
                                          f"argument; got {reason}")
            _fall_back(reason, "MultiheadAttention")
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        query, key, value, *parameters = _autocast(query, key, value, *parameters)
        _mha_check_dtypes(query, key, value, parameters)
        for name, view in views.items():  # the call's views, of the query's dtype as its parameters
            if not view.is_floating_point():
                raise _core.ArgumentTypeError(f"{name}: expected a floating-point tensor, got dtype {view.dtype}")
            views[name] = view.to(query.dtype)
        key_padding_mask = _mha_mask("key_padding_mask", key_padding_mask, query.dtype)
        attn_mask = _mha_mask("attn_mask", attn_mask, query.dtype)
        dropout_p = self.dropout if self.training else 0.0
        # Drawn from the default generator only with dropout, as torch's forward draws only then.
        seed = torch.randint(2**63 - 1, (), dtype=torch.int64) if dropout_p > 0 else None
        args = (query, key, value, *parameters, key_padding_mask, attn_mask, self.embed_dim, self.kdim, self.vdim,
                self.num_heads, self.add_zero_attn, self.batch_first, need_weights, average_attn_weights, is_causal,
                dropout_p, seed, *(({**settings, **views}).get(n, _fields.MODULE_DEFAULTS[n]) for n in _fields.MODULE_NAMES))
        # The operator when autograd or torch.compile needs it; otherwise its body, directly (as
        # scaled_dot_product_attention does).
        needs_op = torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (query, key, value, *parameters, *views.values())))
        output, weights, *_ = (torch.ops.mha.multihead_attention_forward(*args) if needs_op
                               else _multihead_attention_forward(*args))
        return output, (weights if need_weights else None)


def _mha_unsupported_types(query, parameters, key_padding_mask, attn_mask):
    """Why mha cannot run these dtypes (PyTorch's forward then does), or None."""
    if query.dtype not in _NUMPY_DTYPE:
        return f"dtype {query.dtype} (mha takes float32, float64, float16 and bfloat16)"
    for mask in (key_padding_mask, attn_mask):
        if mask is not None and mask.requires_grad:
            return "a float mask that requires grad (mha computes no gradient for the masks)"
    return None


def _mha_check_dtypes(query, key, value, parameters):
    # PyTorch refuses these too (a RuntimeError from its matmul); mha says which argument.
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise _core.ArgumentTypeError(f"key, value: expected the dtype of query ({query.dtype}), got key {key.dtype} "
                                      f"and value {value.dtype}")
    dtypes = {p.dtype for p in parameters if p is not None}
    if dtypes == {query.dtype}:
        return
    if len(dtypes) == 1:
        raise _core.ArgumentTypeError(f"query: expected the dtype of the module's parameters ({dtypes.pop()}), got "
                                      f"{query.dtype} (convert the module with .to(dtype) or the inputs)")
    # Parameters of different dtypes (one submodule converted): each named with its own.
    named = ", ".join(f"{name} {p.dtype}" for name, p in zip(_PARAMETER_NAMES, parameters) if p is not None)
    raise _core.ArgumentTypeError(f"the module's parameters: expected one dtype, that of query ({query.dtype}), got "
                                  f"{named} (convert the module with .to(dtype))")


def _mha_mask(name, mask, dtype):
    """The mask as mha takes it: bool (True = blocked) or float of the query's dtype (added)."""
    if mask is None or mask.dtype == torch.bool or mask.dtype == dtype:
        return mask
    if not mask.is_floating_point():
        raise _core.ArgumentTypeError(f"{name}: expected dtype bool (True = blocked) or floating point (added to the "
                                      f"scores), got {mask.dtype}")
    return mask.to(dtype)


# What patch() replaces: (owner, attribute, mha's version). One line per routed entry point.
_PATCHES = [
    (torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention),
    # Construct-time routing: code that calls nn.MultiheadAttention(...) inside the block gets mha's.
    (torch.nn, "MultiheadAttention", MultiheadAttention),
]


@contextlib.contextmanager
def patch():
    """Routes PyTorch's entry points to mha inside the block and restores them on the way out,
    exception or not: torch.nn.functional.scaled_dot_product_attention, and torch.nn.
    MultiheadAttention (a module constructed as nn.MultiheadAttention(...) inside the block is
    mha's; one made before it stays PyTorch's). Code that bound a name before the block
    (`from torch.nn import MultiheadAttention`) keeps PyTorch's."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _PATCHES]
    try:
        for owner, name, replacement in _PATCHES:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
