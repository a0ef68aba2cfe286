"""mha.PagedKVCache: mha::nn::PagedKVCache (include/mha/nn/paged_kv_cache.h) from Python, for numpy
arrays; mha.torch's and mha.transformers' paged caches are built on it. The pool, its sequences
and the int8 rounding are the C++ class's; this module picks the class by dtype and calls
mha's paged attention on its pages (docs/generation.md, "Serving")."""
from __future__ import annotations

import numpy as np

from . import _core, _mha, _threads
from ._fields import ArgumentTypeError

_NAMES = ("float32", "bfloat16", "float16", "int8")


def _dtype_name(dtype):
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if name not in _NAMES:
        raise ArgumentTypeError(f"dtype: expected float32, bfloat16, float16 or int8, got {dtype!r}")
    return name


class PagedKVCache:
    """Every layer's keys and values of many sequences in one pool of `pages` pages of `page_size`
    tokens (mha::nn::PagedKVCache): add() a sequence, fork() one sharing another's pages, extend()
    sequences by their new tokens' count, write() each layer's new keys and values, attend() with
    their queries, release() a finished one. dtype: "float32", "bfloat16", "float16" or "int8" (a
    float32 scale per token and kv head; the queries are rounded the same way when they meet it).
    The pool's memory is the system's only where written."""

    def __init__(self, layers, pages, page_size, kv_heads, head_dim, v_head_dim=None, dtype="bfloat16"):
        self.dtype = _dtype_name(dtype)
        cls = getattr(_mha, "PagedKVCache_" + self.dtype)
        try:
            self._cache = cls(layers, pages, page_size, kv_heads, head_dim, head_dim if v_head_dim is None else v_head_dim)
        except ValueError as e:
            raise _core.ArgumentError(str(e)) from None

    def __getattr__(self, name):  # the sizes and counts: layers, page_size, pages_in_use, free_pages, ...
        return getattr(self._cache, name)

    def _call(self, name, *arguments):
        try:
            return getattr(self._cache, name)(*arguments)
        except ValueError as e:
            raise _core.ArgumentError(str(e)) from None

    def add(self):
        return self._call("add")

    def fork(self, sequence):
        return self._call("fork", sequence)

    def release(self, sequence):
        self._call("release", sequence)

    def length(self, sequence):
        return self._call("length", sequence)

    def extend(self, seqs, counts):
        """Room for counts[i] more tokens in sequence seqs[i]; all or nothing."""
        self._call("extend", [int(s) for s in seqs], [int(c) for c in counts])

    def write(self, layer, seqs, key, value, cu_seqlens):
        """Layer `layer`'s keys and values (1, Hkv, T, D) of the sequences' newest tokens, sequence
        seqs[i]'s at [cu_seqlens[i], cu_seqlens[i + 1]) (converted to float32 when they are not)."""
        key, value = (np.ascontiguousarray(_core._array(n, x), dtype=np.float32)
                      for n, x in (("key", key), ("value", value)))
        self._call("write", layer, [int(s) for s in seqs], key, value, [int(c) for c in cu_seqlens])

    def block_table(self, seqs):
        return self._call("block_table", [int(s) for s in seqs])

    def pages(self, layer):
        """(key_pages (pages, Hkv, P, Dqk), value_pages, key_scales (pages, Hkv, P) or None,
        value_scales): the pool's own memory, read-only (bfloat16 as ml_dtypes.bfloat16)."""
        pages = self._call("pages", layer)
        if self.dtype == "bfloat16":
            pages = (pages[0].view(_core.BFLOAT16), pages[1].view(_core.BFLOAT16)) + pages[2:]
        elif self.dtype == "float16":
            pages = (pages[0].view(np.float16), pages[1].view(np.float16)) + pages[2:]
        return pages

    def attend(self, layer, seqs, query, cu_seqlens_q, *, scale=None, causal=True, key_starts=None, **variants):
        """Attention of the sequences' newest tokens over layer `layer`: query (1, Hq, T, Dqk)
        float32, sequence seqs[i]'s queries at [cu_seqlens_q[i], cu_seqlens_q[i + 1]) its last
        tokens; causal (bottom-right, each sequence's own), key_starts (left padding), and the
        variants by mha's names (window_left/right, softcap, chunk_size, sinks, alibi_slopes).
        Returns (output (1, Hq, T, Dv) float32, logsumexp (1, Hq, T) float64)."""
        key_pages, value_pages, key_scales, value_scales = self.pages(layer)
        lengths = np.array([self.length(s) for s in seqs], dtype=np.int64)
        variants = dict(variants)
        if key_starts is not None:
            variants["key_starts"] = key_starts
        return _core.paged_forward(query, key_pages, value_pages, self.block_table(seqs), cu_seqlens_q, lengths,
                                   "bottom_right" if causal else "none", scale, _threads.get_num_threads(), variants,
                                   key_scales, value_scales)
