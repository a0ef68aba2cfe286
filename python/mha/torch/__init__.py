"""mha for PyTorch: scaled dot-product attention and nn.MultiheadAttention as torch operators,
with autograd and torch.compile.

    import torch, mha.torch
    out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's signature
    attention = mha.torch.MultiheadAttention(512, 8, batch_first=True)     # an nn.MultiheadAttention
    with mha.torch.patch():            # F.scaled_dot_product_attention and nn.MultiheadAttention are mha's
        model(x)

The forward and backward are operators registered with torch.library from schemas that
mha/_fields.py builds from mha's own field lists (torch.ops.mha.sdpa_forward / sdpa_backward /
sdpa_weights in _sdpa.py, torch.ops.mha.multihead_attention_forward / multihead_attention_backward
in _module.py), each with a fake (shape-only) kernel and the forwards with an autograd formula, so
autograd works and torch.compile(fullgraph=True) keeps them in one graph. FlashAttention-2's
functions are _flash.py's, and _paged.py's over KV caches (flash_attn_with_kvcache, and
paged_attention: paged float and int8 caches, prefill chunks and decode rows in one call). They
run mha's C++ kernels on the tensors' own memory: a CPU tensor is viewed as a numpy array
(Tensor.numpy(), no copy) and goes through the same code as the numpy API (mha/_core.py). mha is
not linked against libtorch, so one build works with any PyTorch >= 2.4.

Attention and nn.MultiheadAttention take float32, float64, float16 and bfloat16 tensors (bfloat16
read in place as ml_dtypes.bfloat16 arrays). Inputs mha does not take (another device, nested or
sparse tensors, a float mask that needs a gradient) go to PyTorch's own
scaled_dot_product_attention or nn.MultiheadAttention.forward, with a warning the first time for
each reason (mha/_policy.py holds the table of where a call goes).
"""
import contextlib

import torch

from ._flash import flash_attn_func, flash_attn_varlen_func
from ._paged import flash_attn_with_kvcache, paged_attention
from ._module import MultiheadAttention
from ._sdpa import merge_attention_states, scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention", "MultiheadAttention", "patch", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "paged_attention", "merge_attention_states"]


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
