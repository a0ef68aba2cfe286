"""Where a call that mha does not run as given goes: each of the package's policies is one
function here, and this is their one table (docs/python.md, "Policies", cites it beside the C++
rules).

| policy | when | what happens | here | the C++ rule beside it |
|---|---|---|---|---|
| to PyTorch | PyTorch's own signatures (mha.torch.scaled_dot_product_attention, MultiheadAttention) given inputs mha cannot read: another device, nested or sparse tensors, a torch.func transform or forward-mode AD, a dtype other than float32, float64, float16 and bfloat16, a float mask that requires grad | PyTorch's own function runs them, with a UserWarning once per door and reason | unsupported, unsupported_module, fall_back | none: the C++ API takes views of memory and has no other engine to hand a call to |
| raise | such inputs with one of mha's variants (PyTorch has none of them), and any such input at a door with no PyTorch twin (FlashAttention's functions, mha.transformers) | mha.ArgumentError naming the variants or the door's tensors, and the reason | refuse_variants, refuse_inputs | every check of the core: mha::Error naming the argument, what was expected and what was received (include/mha/core/error.h) |
| in float | a bfloat16 or float16 call where PyTorch's SDPA computes in float32: a float32 mask; the backward where PyTorch takes its math backend (pytorch_computes_in_float) or an input is broadcast over the batch or heads | the float call on the widened values, each result rounded once to the half type | as_float_call | cpu_flash's backward runs its products on float panels, not bfloat16 pairs, where the query and value heads differ (backward_on_pairs, src/attention/cpu_flash/blocks.h), as PyTorch's math backend computes those in float32 |

The predicates of the first two rows read torch tensors and run only under mha.torch, which has
imported torch; this module imports nothing of torch itself, so that the numpy API stays free of it.
"""
import warnings

from ._fields import ArgumentError

# ---------------------------------------------------------------------------------------------
# To PyTorch.

class _Torch:
    """torch's names the predicates read, bound at their first call (mha.torch has imported torch):
    they run on every call, where a module attribute's lookup costs what a global's does."""

    def __init__(self):
        import torch
        self.Tensor, self.strided, self.is_compiling = torch.Tensor, torch.strided, torch.compiler.is_compiling
        self.wrapped, self.unpack_dual = torch._C._functorch.is_functorch_wrapped_tensor, torch.autograd.forward_ad.unpack_dual
        self.floats = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


_torch = None


def _names():
    global _torch
    if _torch is None:
        _torch = _Torch()
    return _torch


def unsupported_tensors(tensors):
    """Why mha cannot read these torch tensors (None entries are absent arguments), or None."""
    torch = _names()
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
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
        if not torch.is_compiling() and (torch.wrapped(t) or torch.unpack_dual(t).tangent is not None):
            return "a torch.func transform or forward-mode AD (mha's operators have neither a batching rule nor a jvp)"
    return None


def _unsupported_dtype(query, masks):
    if query.dtype not in _names().floats:
        return f"dtype {query.dtype} (mha takes float32, float64, float16 and bfloat16)"
    for name, mask in masks:
        if mask is not None and mask.requires_grad:
            return f"a float {name} that requires grad (mha computes no gradient for the mask)"
    return None


def unsupported(query, key, value, attn_mask):
    """Why mha cannot run this attention call (PyTorch's SDPA then does), or None. One pass,
    attribute reads only: it runs on every call."""
    return (unsupported_tensors((query, key, value, attn_mask))
            or _unsupported_dtype(query, (("attn_mask", attn_mask),)))


def unsupported_module(query, key, value, key_padding_mask, attn_mask, parameters, views):
    """Why mha cannot run this MultiheadAttention call (PyTorch's forward then does), or None."""
    return (unsupported_tensors((query, key, value, key_padding_mask, attn_mask, *parameters, *views))
            or _unsupported_dtype(query, (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask))))


_warned = set()


def fall_back(reason, what):
    """Warns, once per door and reason, that PyTorch's `what` runs the call instead."""
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        warnings.warn(f"mha.torch.{what}: {reason}; using PyTorch's {what} instead (this warning is shown once)",
                      stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Raise.

def refuse_variants(names, reason, what):
    """Raises when inputs that would go to PyTorch's `what` come with mha's own variants `names`."""
    if names and reason is not None:
        raise ArgumentError(f"{', '.join(names)}: mha runs these only on inputs it can read, and PyTorch's {what}, "
                            f"which takes the rest, has no such argument; got {reason}")


def refuse_inputs(arguments, reason, door=""):
    """Raises for inputs mha cannot read at a door with no PyTorch twin (`door`: its prefix)."""
    if reason is not None:
        raise ArgumentError(f"{door}{arguments}: expected floating-point CPU tensors mha can read, got {reason}")


# ---------------------------------------------------------------------------------------------
# In float.

def pytorch_computes_in_float(query, key, value, attn_mask):
    """Whether PyTorch's CPU SDPA takes these arrays to its math backend, which computes a half call
    in float32: where the checks of its flash kernel fail (use_flash_attention_cpp in
    sdp_utils_cpp.cpp, as torch._fused_sdp_choice reports them in PyTorch 2.15, and
    test_half_precision.py holds this to it): inputs of other than 3 or 4 dimensions, a head
    dimension whose stride is not 1, value heads of another size than the query's, a mask of other
    than 2 dimensions or the inputs' own. (Dropout as well, left out here: no two implementations
    draw the same mask, so there is no common result to be within, and the half call keeps its
    speed.)"""
    return (query.ndim not in (3, 4) or any(x.strides[-1] != x.itemsize for x in (query, key, value))
            or value.shape[-1] != query.shape[-1] or (attn_mask is not None and attn_mask.ndim not in (2, query.ndim)))


def as_float_call(half, query, key, value, attn_mask, layout=None):
    """Whether a bfloat16/float16 call (`half`) runs as the float call on its widened values, each
    result rounded once, where PyTorch's SDPA computes in float too:
    - with a float32 attn_mask (added to the scores in float: rounded to the half type, a mask would
      add its rounding to every score);
    - given the layout (the backward), where PyTorch takes the call to its math backend
      (pytorch_computes_in_float), whose gradients then carry their final rounding alone (as
      cpu_flash's own backward does for value heads of another size, docs/bfloat16.md): the half
      call's were up to 2.3x PyTorch's error (a strided head dimension, 8 seeds). The forward keeps
      the half call: its output's error is its own rounding either way (1.00-1.12x);
    - given the layout, with an input broadcast over the batch or repeated over the heads (PyTorch's
      math backend takes those shapes in float32; in the half type each copy's gradient would be
      rounded before the sum over the copies, and the sum after each addition: measured up to 4x
      PyTorch's error, against 1x this way)."""
    return half and ((attn_mask is not None and attn_mask.dtype == "float32") or (
        layout is not None and (layout.broadcasts() or pytorch_computes_in_float(query, key, value, attn_mask))))
