"""mha.torch.MultiheadAttention: torch.nn.MultiheadAttention whose forward runs mha's module, and
its operators (torch.ops.mha.multihead_attention_forward / _backward) with their fakes and
autograd, built from mha._fields' lists."""
import torch

from .. import _core, _fields, _mha, _policy
from ._tensors import _autocast, _from_mha, _memory, _mha_call, _NUMPY_DTYPE, _numpy, _seed, _threads

_TorchMultiheadAttention = torch.nn.MultiheadAttention

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
        given = {name: value for name, value in getattr(self, "scoring", {}).items()
                 if value != _fields.MODULE_DEFAULTS[name]}
        return ", ".join(part for part in [super().extra_repr(), *(f"{n}={v!r}" for n, v in given.items())] if part)

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
        reason = _policy.unsupported_module(query, key, value, key_padding_mask, attn_mask, parameters,
                                            views.values())
        if reason is not None:
            _policy.refuse_variants([*settings, *views], reason, "MultiheadAttention")
            _policy.fall_back(reason, "MultiheadAttention")
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


