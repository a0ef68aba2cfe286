"""mha.torch's scaled dot-product attention: the torch operators (torch.ops.mha.sdpa_forward,
sdpa_backward, sdpa_weights) with their fakes and autograd, built from mha._fields' lists, and the
door with PyTorch's signature."""
import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant

from .. import _core, _fields, _layout, _policy
from ._tensors import _autocast, _numpy, _seed, _tensor, _threads

# PyTorch's own, taken at import: the fallback, and what patch() puts back.
_torch_sdpa = torch.nn.functional.scaled_dot_product_attention


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
    layout = _layout.Layout(query.shape, key.shape, value.shape, enable_gqa)
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
    return query.new_empty(_layout.Layout(query.shape, key.shape, value.shape, enable_gqa).mask_shape())


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
    reason = _policy.unsupported(query, key, value, mask)
    if reason is not None:
        # Every variant but the window (a mask for PyTorch) exists in mha alone.
        _policy.refuse_variants([name for name, x in variants.items() if name not in ("window_left", "window_right")
                                 and x is not None and (name not in _fields.SETTING_NAMES or x != _fields.DEFAULTS[name])],
                                reason, "scaled_dot_product_attention")
        _policy.fall_back(reason, "scaled_dot_product_attention")
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

