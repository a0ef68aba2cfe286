"""mha.torch's tensors as the binding's arrays and back: the tensors' own memory, no copy where
they are row-major (a half type's as its uint16 bits), and the settings every door shares (the
thread count, the dropout seed, autocast)."""
import numpy as np
import torch

from .. import _core
from .._threads import torch_threads


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
    # torch's thread count (at most mha's own in a forked child: _threads.torch_threads)
    return torch_threads(torch.get_num_threads())


def _seed(dropout_seed):
    # The seed tensor holds an int64 drawn by torch; mha takes the same 64 bits as unsigned.
    return None if dropout_seed is None else int(dropout_seed) % 2**64




def _autocast(*tensors):
    """The tensors as PyTorch's CPU autocast gives them to its SDPA and nn.MultiheadAttention: inside
    torch.autocast("cpu"), each floating-point tensor but a float64 one in the autocast dtype."""
    if not torch.is_autocast_enabled("cpu"):
        return tensors
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)



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
