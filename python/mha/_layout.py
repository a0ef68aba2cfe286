"""SDPA's shapes brought to mha's; shared by mha (numpy, _core) and mha.torch (its fake kernels too).

mha's kernels take query (B, Hq, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev) with Hq a
multiple of Hkv, and strided memory whose last dimension is contiguous. PyTorch's
scaled_dot_product_attention takes more: any number of leading dimensions (rank 2 and up),
broadcast between query, key and value like a matmul, and with enable_gqa key and value heads
that each divide the query heads. Each input is brought to the 4-D form by

    (*b, h, n, d) -> (*b, h, 1, n, d)         a new axis for the head repeat (a view)
                  -> (*batch, h, r, n, d)      np.broadcast_to: stride 0, no copy
                  -> (B, h * r, n, d)          a reshape: a view, unless numpy must copy

and its gradient comes back the same way reversed: reshape, sum over what was broadcast,
reshape to the input's shape. An input of rank <= 4 that broadcasts only where its own size is 1
is never copied; numpy copies only to merge broadcast batch dimensions of rank > 4, or to repeat
heads when key and value have different head counts.

Shapes are checked here with errors that name the argument, what was expected and what came;
everything is checked again by mha itself.
"""
from __future__ import annotations

import functools
import math

from ._fields import ArgumentError

# Plain tuples and integers only, so mha.torch's fake (shape-only) kernels use them too,
# with torch's symbolic sizes.

def _shape(shape):
    return "(" + ", ".join(str(s) for s in shape) + ")"


def broadcast_shapes(*named, what):
    """numpy's broadcasting of the named shapes, aligned on the right; an error names them all."""
    first = named[0][1]
    if all(s == first for _, s in named):  # the common case, in a fraction of the time
        return tuple(first)
    rank = max(len(s) for _, s in named)
    out = []
    for i in range(rank):
        sizes = [s[len(s) - rank + i] for _, s in named if len(s) - rank + i >= 0]
        size = 1
        for s in sizes:
            if s != 1:
                if size != 1 and s != size:
                    got = ", ".join(f"{name} {_shape(s)}" for name, s in named)
                    raise ArgumentError(f"{what}: expected shapes that broadcast, got {got}")
                size = s
        out.append(size)
    return tuple(out)


class Layout:
    """Where SDPA's inputs go in mha's (B, H, L, D) form, from their shapes alone.

    lead: the output's leading dimensions (batch..., heads), () for rank-2 inputs; batch: the
    broadcast batch dimensions; heads: Hq; kv_heads: the Hkv mha runs with; repeats: how many
    times each of query, key, value is repeated along the heads (1 = as it is).
    """

    def __init__(self, query_shape, key_shape, value_shape, enable_gqa):
        shapes = {"query": tuple(query_shape), "key": tuple(key_shape), "value": tuple(value_shape)}
        for name, s in shapes.items():
            if len(s) < 2:
                raise ArgumentError(f"{name}: expected at least 2 dimensions (..., sequence, head_dim), "
                                    f"got shape {_shape(s)}")
        q, k, v = shapes.values()
        if k[-1] != q[-1]:
            raise ArgumentError(f"key: expected head size {q[-1]} (the last dimension of query {_shape(q)}), "
                                f"got shape {_shape(k)}")
        if v[-2] != k[-2]:
            raise ArgumentError(f"value: expected sequence length {k[-2]} (as key {_shape(k)}), got shape {_shape(v)}")
        self.rank = max(len(q), len(k), len(v))
        # Rank 2 has no heads dimension: it is treated as one head.
        padded = {name: (1,) * (max(self.rank, 3) - len(s)) + s for name, s in shapes.items()}
        self.padded = padded
        self.batch = broadcast_shapes(*((name, s[:-3]) for name, s in padded.items()), what="batch dimensions")
        hq, hk, hv = (padded[n][-3] for n in ("query", "key", "value"))
        if enable_gqa:
            if hk == 0 or hv == 0 or hq % hk or hq % hv:
                raise ArgumentError(f"enable_gqa: the numbers of key and value heads must divide the number of "
                                    f"query heads {hq}, got key {hk} and value {hv}")
            heads = hq
        else:
            heads = broadcast_shapes(("query", (hq,)), ("key", (hk,)), ("value", (hv,)),
                                     what="heads (dimension -3; enable_gqa=True allows fewer key/value heads)")[0]
        # Key and value with the same head count run as they are (mha's grouped-query attention
        # maps query head h to key/value head h / (Hq / Hkv)); otherwise both are repeated to Hq.
        # Equal counts divide Hq in both modes (broadcasting allows only 1 or Hq).
        self.kv_heads = hk if hk == hv else heads
        self.heads = heads
        self.repeats = {"query": heads // hq if hq else 1, "key": self.kv_heads // hk if hk else 1,
                        "value": self.kv_heads // hv if hv else 1}
        self.lead = self.batch + (heads,) if self.rank >= 3 else ()
        self.query_len, self.key_len, self.value_dim = q[-2], k[-2], v[-1]
        self.batch_size = math.prod(self.batch)
        self.flat_shapes = {name: (self.batch_size, s[-3] * self.repeats[name]) + s[-2:] for name, s in padded.items()}

    def output_shape(self):
        return self.lead + (self.query_len, self.value_dim)

    def logsumexp_shape(self):
        return self.lead + (self.query_len,)

    def mask_shape(self):
        return self.lead + (self.query_len, self.key_len)

    def expanded(self, name):
        """The shape (*batch, h, r, n, d) the named input is broadcast to."""
        s = self.padded[name]
        return self.batch + (s[-3], self.repeats[name]) + s[-2:]

    def flat(self, name):
        """Its 4-D shape (B, h * r, n, d) for mha."""
        return self.flat_shapes[name]

    def broadcasts(self):
        """Whether some input is broadcast over the batch or repeated over the heads (its gradient
        a sum over the copies)."""
        return any(math.prod(self.expanded(n)) != math.prod(self.padded[n]) for n in ("query", "key", "value"))


# Layouts of concrete shapes, reused: most programs call attention with a handful of shapes, and
# working one out costs more than the rest of the Python side of a small call. (The fake kernels
# of mha.torch build Layout directly: symbolic sizes are not hashable.)
layout_of = functools.lru_cache(maxsize=256)(Layout)
