"""mha for PyTorch: scaled dot-product attention as torch operators, with autograd and torch.compile.

    import torch, mha.torch
    out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's signature
    with mha.torch.patch():            # torch.nn.functional.scaled_dot_product_attention is mha's
        model(x)

The forward and backward are operators registered with torch.library.custom_op
(torch.ops.mha.sdpa_forward, torch.ops.mha.sdpa_backward), each with a fake (shape-only) kernel
and the forward with an autograd formula, so autograd works and torch.compile(fullgraph=True)
keeps them in one graph. They run mha's C++ kernels on the tensors' own memory: a CPU tensor is
viewed as a numpy array (Tensor.numpy(), no copy) and goes through the same code as the numpy
API (mha/_core.py). mha is not linked against libtorch, so one build works with any PyTorch >= 2.4.

Inputs mha does not take (another device, float16/bfloat16, nested or sparse tensors, a float
mask that needs a gradient) go to PyTorch's own scaled_dot_product_attention, with a warning the
first time for each reason.
"""

import contextlib
import warnings
from typing import Optional

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import _core

__all__ = ["scaled_dot_product_attention", "patch"]

# PyTorch's own, taken at import: the fallback, and what patch() puts back.
_torch_sdpa = torch.nn.functional.scaled_dot_product_attention


def _numpy(t):
    # detach(): numpy() refuses a tensor that requires grad; the array shares the memory.
    return None if t is None else t.detach().numpy()


def _seed(dropout_seed):
    # The seed tensor holds an int64 drawn by torch; mha takes the same 64 bits as unsigned.
    return None if dropout_seed is None else int(dropout_seed) % 2**64


def _sdpa_forward(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
                  causal: str, scale: Optional[float], enable_gqa: bool,
                  dropout_seed: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """(output, logsumexp): output (..., Hq, L, Ev) and the float64 log-sum-exp of each score
    row (..., Hq, L). causal is "none", "top_left" (torch's is_causal) or "bottom_right";
    dropout_seed an int64 scalar tensor (None without dropout)."""
    output, logsumexp = _core.forward(_numpy(query), _numpy(key), _numpy(value), _numpy(attn_mask), dropout_p,
                                      causal, scale, enable_gqa, _seed(dropout_seed), torch.get_num_threads())
    return torch.from_numpy(output), torch.from_numpy(logsumexp)


sdpa_forward = torch.library.custom_op("mha::sdpa_forward", _sdpa_forward, mutates_args=(), device_types="cpu")


@sdpa_forward.register_fake
def _(query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed):
    layout = _core.Layout(query.shape, key.shape, value.shape, enable_gqa)
    return query.new_empty(layout.output_shape()), query.new_empty(layout.logsumexp_shape(), dtype=torch.float64)


@torch.library.custom_op("mha::sdpa_backward", mutates_args=(), device_types="cpu")
def sdpa_backward(grad_output: Tensor, query: Tensor, key: Tensor, value: Tensor, output: Tensor,
                  logsumexp: Tensor, attn_mask: Optional[Tensor], dropout_p: float, causal: str,
                  scale: Optional[float], enable_gqa: bool,
                  dropout_seed: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_query, grad_key, grad_value), given sdpa_forward's arguments and results."""
    grads = _core.backward(_numpy(grad_output), _numpy(query), _numpy(key), _numpy(value), _numpy(output),
                           _numpy(logsumexp), _numpy(attn_mask), dropout_p, causal, scale, enable_gqa,
                           _seed(dropout_seed), torch.get_num_threads())
    return tuple(torch.from_numpy(g) for g in grads)


@sdpa_backward.register_fake
def _(grad_output, query, key, value, output, logsumexp, attn_mask, dropout_p, causal, scale, enable_gqa,
      dropout_seed):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, dropout_p, causal, scale, enable_gqa, dropout_seed = inputs
    out, logsumexp = output
    ctx.mark_non_differentiable(logsumexp)
    ctx.save_for_backward(query, key, value, attn_mask, out, logsumexp, dropout_seed)
    ctx.options = (dropout_p, causal, scale, enable_gqa)


def _backward(ctx, grad_output, _grad_logsumexp):
    query, key, value, attn_mask, out, logsumexp, dropout_seed = ctx.saved_tensors
    dropout_p, causal, scale, enable_gqa = ctx.options
    grads = torch.ops.mha.sdpa_backward(grad_output, query, key, value, out, logsumexp, attn_mask, dropout_p,
                                        causal, scale, enable_gqa, dropout_seed)
    # No gradient for the mask (a mask that needs one goes to PyTorch), the options or the seed.
    return (*grads, None, None, None, None, None, None)


sdpa_forward.register_autograd(_backward, setup_context=_setup_context)


def _unsupported(query, key, value, attn_mask):
    """Why mha cannot run these inputs (PyTorch's SDPA then does), or None. One pass, attribute
    reads only: it runs on every call."""
    for t in (query, key, value, attn_mask):
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
    if query.dtype not in (torch.float32, torch.float64):
        return f"dtype {query.dtype} (mha computes in float32 and float64)"
    if attn_mask is not None and attn_mask.requires_grad:
        return "a float attn_mask that requires grad (mha computes no gradient for the mask)"
    return None


_warned = set()


def _fall_back(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"mha.torch.scaled_dot_product_attention: {reason}; using PyTorch's "
                      "scaled_dot_product_attention instead (this warning is shown once)", stacklevel=3)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by mha: same arguments, same
    shapes, same results up to rounding (bitwise the same for any thread count).

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
    reason = _unsupported(query, key, value, mask)
    if reason is not None:
        _fall_back(reason)
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    # Drawn from the default generator only when used, so that without dropout the random
    # stream is left as PyTorch's SDPA leaves it.
    seed = torch.randint(2**63 - 1, (), dtype=torch.int64) if dropout_p > 0 else None
    args = (query, key, value, mask, dropout_p, causal, scale, enable_gqa, seed)
    # The operator when autograd or torch.compile needs it; otherwise its body, directly: the
    # dispatcher's ~10 us per call are a twentieth of a small attention (bench_python.py).
    needs_op = torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
    output, _ = torch.ops.mha.sdpa_forward(*args) if needs_op else _sdpa_forward(*args)
    return output


# What patch() replaces: (owner, attribute, mha's version). One line per routed entry point.
_PATCHES = [
    (torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention),
]


@contextlib.contextmanager
def patch():
    """Routes PyTorch's entry points to mha inside the block (torch.nn.functional.
    scaled_dot_product_attention, which nn.MultiheadAttention's need_weights=False path calls too)
    and restores them on the way out, exception or not. Code that bound the name before the
    block (`from torch.nn.functional import scaled_dot_product_attention`) keeps PyTorch's."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _PATCHES]
    try:
        for owner, name, replacement in _PATCHES:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
