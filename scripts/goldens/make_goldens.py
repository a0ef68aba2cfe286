#!/usr/bin/env python3
"""Generate the PyTorch golden data used by the mha C++ tests.

    python3 scripts/goldens/make_goldens.py            # writes tests/goldens/{module,sdpa}/<case>/ and README.md
    python3 scripts/goldens/make_goldens.py --out DIR  # write somewhere else (e.g. to compare two runs)

Every case is a folder of safetensors files:

    module/<case>/weights.safetensors       state_dict of a torch.nn.MultiheadAttention (F32)
    <kind>/<case>/inputs.safetensors        query/key/value, optional masks, grad_output (F32/BOOL)
    <kind>/<case>/expected_f64.safetensors  PyTorch run in float64 (the reference)
    <kind>/<case>/torch_f32.safetensors     PyTorch run in float32 (sets the error budget)

The script is deterministic: every case draws from its own torch.Generator seeded from the
case name, PyTorch runs single-threaded, and the safetensors metadata is written in sorted key
order (safetensors itself serialises the metadata map in a random order), so re-running it gives
byte-identical files. See tests/goldens/README.md (written by this script) for the file scheme.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import sys
import warnings
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from canonical_writer import peers_dir, save_canonical

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "goldens")
# The command recorded in the files is where this script lived when the committed goldens were
# written; it is kept so that a re-run stays byte-identical (tests/goldens/README.md maps it).
REGENERATE = "python3 scripts/make_goldens.py"
TORCH_VERSION = torch.__version__

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def case_generator(kind: str, name: str) -> torch.Generator:
    """Each case has its own stream, so adding or editing a case never changes the others."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{kind}/{name}".encode()) + 20240601)
    return g


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def uniform(g, lo, hi, *shape):
    return (torch.rand(*shape, generator=g, dtype=torch.float32) * (hi - lo) + lo).to(torch.float32)


def bernoulli(g, p, *shape):
    return torch.rand(*shape, generator=g) < p


def float_mask_from_blocked(g, blocked: torch.Tensor) -> torch.Tensor:
    """Additive float mask: random finite values where allowed, -inf where blocked."""
    vals = randn(g, *blocked.shape) * 0.75
    return vals.masked_fill(blocked, NEG_INF)


def is_blocked(mask: Optional[torch.Tensor], mha_polarity: bool) -> Optional[torch.Tensor]:
    """Bool tensor, True where the mask blocks. MHA bool: True = blocked; SDPA bool: True = attend."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask.clone() if mha_polarity else ~mask
    return torch.isneginf(mask)


def max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def all_finite(d: dict) -> list:
    return [k for k, v in d.items() if v.is_floating_point() and not torch.isfinite(v).all()]


class WarningLog:
    """Collects the distinct warnings PyTorch raised, per case."""

    def __init__(self):
        self.by_case: dict[str, list[str]] = {}

    def add(self, case: str, caught) -> None:
        for w in caught:
            msg = f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
            lst = self.by_case.setdefault(case, [])
            if msg not in lst:
                lst.append(msg)


WARNINGS = WarningLog()


# ---------------------------------------------------------------------------------------------
# Module (torch.nn.MultiheadAttention) cases
# ---------------------------------------------------------------------------------------------

@dataclass
class ModuleCase:
    name: str
    description: str
    E: int
    H: int
    L: int
    S: Optional[int] = None          # None: self-attention (key = value = query values, S = L)
    N: Optional[int] = 2             # None: unbatched 2-D input
    kdim: Optional[int] = None
    vdim: Optional[int] = None
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    batch_first: bool = False
    dropout: float = 0.0
    train: bool = False
    need_weights: bool = True
    average: bool = True
    is_causal: bool = False
    # key_padding_mask: None | "bool" | "float";  attn_mask: None | "bool2d" | "float2d" |
    # "bool3d" | "float3d" | "causal_bool" | "causal_float"
    kpm: Optional[str] = None
    am: Optional[str] = None
    # Edits the masks after generation (to make rows fully masked on purpose).
    post: Optional[Callable] = None
    expect_full_rows: bool = False   # the case has fully masked rows on purpose

    @property
    def self_attention(self) -> bool:
        return self.S is None and self.kdim is None and self.vdim is None

    @property
    def seq_k(self) -> int:
        return self.L if self.S is None else self.S

    def args(self) -> str:
        """The `mha attention` flags of the case, in this order."""
        flags = [(f"--embed-dim {self.E}", True), (f"--num-heads {self.H}", True),
                 (f"--kdim {self.kdim}", self.kdim is not None),
                 (f"--vdim {self.vdim}", self.vdim is not None),
                 (f"--dropout {self.dropout}", bool(self.dropout)),
                 ("--no-bias", not self.bias),
                 ("--batch-first", self.batch_first),
                 ("--add-bias-kv", self.add_bias_kv),
                 ("--add-zero-attn", self.add_zero_attn),
                 ("--no-need-weights", not self.need_weights),
                 ("--no-average-attn-weights", self.need_weights and not self.average),
                 ("--is-causal", self.is_causal),
                 ("--train", self.train),
                 ("--backward", True)]
        return " ".join(flag for flag, given in flags if given)


def fully_mask_kpm_batch0(kpm, am, c):
    """Every key of batch element 0 is padded."""
    kpm = kpm.clone()
    if kpm.dtype == torch.bool:
        kpm[0] = True
    else:
        kpm[0] = NEG_INF
    return kpm, am


def fully_mask_kpm_all(kpm, am, c):
    kpm = kpm.clone()
    kpm[...] = True if kpm.dtype == torch.bool else NEG_INF
    return kpm, am


def fully_mask_am_row1(kpm, am, c):
    """Query 1 may attend to no key (2-D mask: in every batch element and head)."""
    am = am.clone()
    am[..., 1, :] = True if am.dtype == torch.bool else NEG_INF
    return kpm, am


def fully_mask_am3d_one_head(kpm, am, c):
    """Batch element 1, head 0, query 2 (3-D mask row n*H + h = H) may attend to no key."""
    am = am.clone()
    am[c.H * 1 + 0, 2, :] = True if am.dtype == torch.bool else NEG_INF
    return kpm, am


def module_cases() -> list[ModuleCase]:
    C = ModuleCase
    return [
        # --- basics -------------------------------------------------------------------------
        C("self_basic", "self-attention, seq-first, averaged weights", E=8, H=2, L=5),
        C("self_no_need_weights", "self-attention, need_weights=False (SDPA path)", E=8, H=2, L=5,
          need_weights=False),
        C("self_per_head_weights", "self-attention, per-head weights (average_attn_weights=False)",
          E=8, H=2, L=5, average=False),
        C("cross_l_ne_s", "cross-attention with L=3 != S=6", E=8, H=2, L=3, S=6),
        C("cross_l_gt_s_no_need_weights", "cross-attention L=7 > S=4, need_weights=False",
          E=12, H=3, L=7, S=4, N=3, need_weights=False),
        C("kdim_vdim", "kdim=5, vdim=7 (separate q/k/v_proj_weight), cross-attention", E=8, H=2,
          L=4, S=6, kdim=5, vdim=7),
        C("kdim_vdim_no_need_weights", "kdim=5, vdim=7, need_weights=False", E=8, H=2, L=4, S=6,
          kdim=5, vdim=7, need_weights=False),
        C("kdim_only", "kdim=6 only (vdim = embed_dim), separate projection weights", E=8, H=2,
          L=4, S=5, kdim=6),
        C("vdim_only", "vdim=3 only (kdim = embed_dim), per-head weights", E=8, H=4, L=3, S=5,
          vdim=3, average=False),
        C("no_bias", "bias=False (no in_proj_bias, no out_proj.bias)", E=8, H=2, L=5),
        C("no_bias_kdim_vdim_no_need_weights", "bias=False with kdim/vdim, need_weights=False",
          E=8, H=2, L=3, S=4, kdim=4, vdim=6, need_weights=False),
        C("add_bias_kv", "add_bias_kv=True (S grows by 1)", E=8, H=2, L=4, S=5,
          add_bias_kv=True),
        C("add_zero_attn", "add_zero_attn=True (S grows by 1)", E=8, H=2, L=4, S=5,
          add_zero_attn=True),
        C("add_bias_kv_zero_attn", "add_bias_kv and add_zero_attn together, per-head weights",
          E=8, H=2, L=4, S=5, add_bias_kv=True, add_zero_attn=True, average=False),
        C("add_bias_kv_no_bias", "add_bias_kv with bias=False, need_weights=False", E=8, H=2, L=4,
          add_bias_kv=True, bias=False, need_weights=False),
        C("batch_first", "batch_first=True self-attention", E=8, H=2, L=5, N=3, batch_first=True),
        C("batch_first_cross_no_need_weights", "batch_first cross-attention, need_weights=False",
          E=8, H=2, L=3, S=6, N=3, batch_first=True, need_weights=False),
        C("batch_first_kdim_vdim_masks", "batch_first, kdim/vdim, bool kpm + 3-D bool attn_mask,"
          " per-head weights", E=12, H=3, L=4, S=6, N=2, kdim=5, vdim=9, batch_first=True,
          average=False, kpm="bool", am="bool3d"),
        # --- unbatched ------------------------------------------------------------------------
        C("unbatched", "unbatched 2-D input (L, E)", E=8, H=2, L=5, N=None),
        C("unbatched_batch_first", "unbatched input with batch_first=True (flag ignored)",
          E=8, H=2, L=3, S=5, N=None, batch_first=True),
        C("unbatched_masks", "unbatched, 1-D bool key_padding_mask (S) + 3-D bool attn_mask "
          "(num_heads, L, S)", E=8, H=2, L=4, S=6, N=None, kpm="bool", am="bool3d"),
        C("unbatched_masks_no_need_weights", "unbatched, 1-D float kpm + 3-D float attn_mask, "
          "need_weights=False", E=8, H=2, L=4, S=6, N=None, kpm="float", am="float3d",
          need_weights=False),
        C("unbatched_2d_float_mask", "unbatched, 2-D float attn_mask, per-head weights",
          E=8, H=4, L=5, N=None, am="float2d", average=False),
        # --- masks ----------------------------------------------------------------------------
        C("kpm_bool", "bool key_padding_mask (N, S)", E=8, H=2, L=4, S=6, N=3, kpm="bool"),
        C("kpm_float", "float additive key_padding_mask (N, S) with -inf", E=8, H=2, L=4, S=6,
          N=3, kpm="float"),
        C("kpm_bool_no_need_weights", "bool key_padding_mask, need_weights=False", E=8, H=2, L=4,
          S=6, N=3, kpm="bool", need_weights=False),
        C("attn_mask_2d_bool", "2-D bool attn_mask (L, S)", E=8, H=2, L=5, S=6, am="bool2d"),
        C("attn_mask_2d_float", "2-D float attn_mask (L, S) with -inf", E=8, H=2, L=5, S=6,
          am="float2d"),
        C("attn_mask_3d_bool", "3-D bool attn_mask (N*num_heads, L, S), per-head weights",
          E=8, H=2, L=4, S=5, N=3, am="bool3d", average=False),
        C("attn_mask_3d_float", "3-D float attn_mask (N*num_heads, L, S)", E=8, H=2, L=4, S=5,
          N=3, am="float3d"),
        C("attn_mask_3d_float_no_need_weights", "3-D float attn_mask, need_weights=False",
          E=12, H=3, L=4, S=5, N=2, am="float3d", need_weights=False),
        C("both_masks_bool", "bool kpm + 2-D bool attn_mask", E=8, H=2, L=5, S=6, N=2,
          kpm="bool", am="bool2d"),
        C("both_masks_bool_no_need_weights", "bool kpm + 3-D bool attn_mask, need_weights=False",
          E=8, H=2, L=5, S=6, N=2, kpm="bool", am="bool3d", need_weights=False),
        C("float_mask_bool_kpm", "2-D float attn_mask + bool kpm (mixed types: PyTorch warns)",
          E=8, H=2, L=5, S=6, N=2, kpm="bool", am="float2d"),
        C("float_masks_both", "float kpm + 3-D float attn_mask, per-head weights", E=8, H=2, L=4,
          S=6, N=2, kpm="float", am="float3d", average=False),
        # --- is_causal ------------------------------------------------------------------------
        C("is_causal_no_need_weights", "is_causal=True + causal bool attn_mask, need_weights="
          "False: SDPA is_causal path (the mask is dropped)", E=8, H=2, L=6, am="causal_bool",
          is_causal=True, need_weights=False),
        C("is_causal_need_weights", "is_causal=True + causal bool attn_mask, need_weights=True "
          "(the mask is used)", E=8, H=2, L=6, am="causal_bool", is_causal=True),
        C("is_causal_float_mask_no_need_weights", "is_causal=True + causal float attn_mask "
          "(0/-inf), need_weights=False, batch_first", E=8, H=4, L=5, N=3, am="causal_float",
          is_causal=True, need_weights=False, batch_first=True),
        C("is_causal_cross_no_need_weights", "is_causal=True with L=4 < S=6 (top-left), "
          "need_weights=False", E=8, H=2, L=4, S=6, am="causal_bool", is_causal=True,
          need_weights=False),
        C("is_causal_with_kpm_no_need_weights", "is_causal=True + causal mask + bool kpm, "
          "need_weights=False (hint turned off, merged mask used)", E=8, H=2, L=6, N=3,
          am="causal_bool", kpm="bool", is_causal=True, need_weights=False),
        # --- dropout / train ------------------------------------------------------------------
        C("dropout_eval", "dropout=0.3 in eval mode (no dropout applied)", E=8, H=2, L=4, S=5,
          dropout=0.3),
        C("dropout_eval_no_need_weights", "dropout=0.5 in eval mode, need_weights=False", E=8,
          H=2, L=4, dropout=0.5, need_weights=False),
        C("train_mode", "train mode with dropout=0 (same math as eval)", E=8, H=2, L=4, S=5,
          train=True),
        # --- extreme sizes --------------------------------------------------------------------
        C("single_head", "num_heads=1", E=8, H=1, L=4, S=6),
        C("single_head_no_need_weights", "num_heads=1, need_weights=False", E=6, H=1, L=4, S=3,
          need_weights=False),
        C("head_dim_1", "num_heads = embed_dim = 6 (head_dim 1), per-head weights", E=6, H=6,
          L=4, S=5, average=False),
        C("head_dim_1_no_need_weights", "num_heads = embed_dim = 4, need_weights=False", E=4,
          H=4, L=3, need_weights=False),
        C("l1", "L=1 (one query), cross-attention", E=8, H=2, L=1, S=5),
        C("l1_s1", "L=S=1 self-attention", E=8, H=2, L=1),
        C("batch1", "batch size 1", E=8, H=2, L=5, N=1),
        C("batch1_batch_first_no_need_weights", "batch 1, batch_first, need_weights=False",
          E=8, H=2, L=5, S=3, N=1, batch_first=True, need_weights=False),
        # --- bias_kv / zero_attn with masks ---------------------------------------------------
        C("add_bias_kv_masks", "add_bias_kv + bool kpm + 2-D bool attn_mask", E=8, H=2, L=4,
          S=5, add_bias_kv=True, kpm="bool", am="bool2d"),
        C("add_bias_kv_masks_no_need_weights", "add_bias_kv + float kpm + 3-D float attn_mask, "
          "need_weights=False", E=8, H=2, L=4, S=5, add_bias_kv=True, kpm="float",
          am="float3d", need_weights=False),
        C("add_zero_attn_kpm", "add_zero_attn + bool key_padding_mask", E=8, H=2, L=4, S=5, N=3,
          add_zero_attn=True, kpm="bool"),
        C("add_zero_attn_all_keys_padded", "add_zero_attn + kpm padding every key of batch 0 "
          "(only the zero key is left: finite even with need_weights)", E=8, H=2, L=4, S=5,
          add_zero_attn=True, kpm="bool", post=fully_mask_kpm_batch0),
        C("add_bias_kv_zero_attn_masks", "add_bias_kv + add_zero_attn + bool kpm + 3-D bool "
          "attn_mask, per-head weights, batch_first", E=8, H=2, L=4, S=5, N=2, batch_first=True,
          add_bias_kv=True, add_zero_attn=True, kpm="bool", am="bool3d", average=False),
        # --- fully masked rows (need_weights=False only: SDPA gives 0) ------------------------
        C("full_kpm_no_need_weights", "all keys of batch 0 padded (bool kpm), need_weights=False:"
          " rows give out_proj.bias", E=8, H=2, L=4, S=5, N=2, kpm="bool", need_weights=False,
          post=fully_mask_kpm_batch0, expect_full_rows=True),
        C("full_kpm_float_no_need_weights", "all keys of batch 0 padded (float -inf kpm), "
          "need_weights=False", E=8, H=2, L=4, S=5, N=2, kpm="float", need_weights=False,
          post=fully_mask_kpm_batch0, expect_full_rows=True),
        C("full_attn_mask_row_no_need_weights", "2-D bool attn_mask row 1 all True, "
          "need_weights=False", E=8, H=2, L=4, S=5, N=2, am="bool2d", need_weights=False,
          post=fully_mask_am_row1, expect_full_rows=True),
        C("full_attn_mask_3d_float_no_need_weights", "3-D float attn_mask with one -inf row "
          "(one batch, one head), need_weights=False", E=8, H=2, L=4, S=5, N=2, am="float3d",
          need_weights=False, post=fully_mask_am3d_one_head, expect_full_rows=True),
        C("full_unbatched_kpm_no_need_weights", "unbatched, every key padded (1-D bool kpm), "
          "need_weights=False", E=8, H=2, L=3, S=4, N=None, kpm="bool", need_weights=False,
          post=fully_mask_kpm_all, expect_full_rows=True),
        # --- larger ---------------------------------------------------------------------------
        C("mixed_e16", "E=16, 4 heads, N=3, cross-attention, bool kpm + 2-D float attn_mask",
          E=16, H=4, L=7, S=5, N=3, kpm="bool", am="float2d"),
        C("large", "E=64, 8 heads, L=S=33, N=2, bool kpm, averaged weights", E=64, H=8, L=33,
          N=2, kpm="bool"),
        C("large_no_need_weights", "E=32, 4 heads, L=S=20, N=2, batch_first, 3-D float "
          "attn_mask, need_weights=False", E=32, H=4, L=20, N=2, batch_first=True,
          am="float3d", need_weights=False),
    ]


def randomize_module(mod: torch.nn.MultiheadAttention, g: torch.Generator) -> None:
    """Every parameter gets fresh random values (biases included: they are zero at init).

    Weight matrices: uniform(-b, b), b = sqrt(3 / fan_in) (unit-variance outputs, so scores stay
    O(1)); in_proj_bias / out_proj.bias: uniform(-0.5, 0.5); bias_k / bias_v: uniform(-1, 1).
    """
    with torch.no_grad():
        for name, p in mod.named_parameters():
            if p.dim() == 2:
                b = math.sqrt(3.0 / p.shape[1])
                p.copy_(uniform(g, -b, b, *p.shape))
            elif name in ("bias_k", "bias_v"):
                p.copy_(uniform(g, -1.0, 1.0, *p.shape))
            else:
                p.copy_(uniform(g, -0.5, 0.5, *p.shape))


def module_masks(c: ModuleCase, g: torch.Generator):
    L, S, H, N = c.L, c.seq_k, c.H, c.N
    unbatched = N is None
    nb = 1 if unbatched else N

    def gen():
        kpm = am = None
        if c.kpm is not None:
            blocked = bernoulli(g, 0.3, nb, S)
            if c.kpm == "bool":
                kpm = blocked
            else:
                kpm = float_mask_from_blocked(g, blocked)
            if unbatched:
                kpm = kpm[0]
        if c.am is not None:
            if c.am.startswith("causal"):
                blocked = ~torch.ones(L, S, dtype=torch.bool).tril()
            elif c.am.endswith("2d"):
                blocked = bernoulli(g, 0.3, L, S)
            else:
                blocked = bernoulli(g, 0.3, H if unbatched else N * H, L, S)
            if c.am in ("bool2d", "bool3d", "causal_bool"):
                am = blocked
            elif c.am == "causal_float":
                am = torch.zeros(L, S).masked_fill(blocked, NEG_INF)
            else:
                am = float_mask_from_blocked(g, blocked)
        return kpm, am

    for _ in range(1000):
        kpm, am = gen()
        if module_full_rows(c, kpm, am) == 0:
            break
    else:
        raise RuntimeError(f"{c.name}: could not draw masks without fully masked rows")
    if c.post is not None:
        kpm, am = c.post(kpm, am, c)
    return kpm, am


def module_full_rows(c: ModuleCase, kpm, am) -> int:
    """Number of (batch, head, query) rows where every key is blocked."""
    if c.add_bias_kv or c.add_zero_attn:
        return 0  # the extra key column is never masked
    L, S, H = c.L, c.seq_k, c.H
    nb = 1 if c.N is None else c.N
    blocked = torch.zeros(nb, H, L, S, dtype=torch.bool)
    kb = is_blocked(kpm, True)
    if kb is not None:
        blocked |= kb.reshape(nb, 1, 1, S)
    ab = is_blocked(am, True)
    if ab is not None:
        blocked |= ab.reshape(L, S) if ab.dim() == 2 else ab.reshape(nb, H, L, S)
    return int(blocked.all(dim=-1).sum())


def module_inputs(c: ModuleCase, g: torch.Generator) -> dict:
    E, L, S = c.E, c.L, c.seq_k
    kd = c.kdim or E
    vd = c.vdim or E

    def shape(seq, dim):
        if c.N is None:
            return (seq, dim)
        return (c.N, seq, dim) if c.batch_first else (seq, c.N, dim)

    q = randn(g, *shape(L, E))
    if c.self_attention:
        k = q.clone()
        v = q.clone()
    else:
        k = randn(g, *shape(S, kd))
        v = randn(g, *shape(S, vd))
    kpm, am = module_masks(c, g)
    go = randn(g, *shape(L, E))
    out = {"query": q, "key": k, "value": v}
    if kpm is not None:
        out["key_padding_mask"] = kpm
    if am is not None:
        out["attn_mask"] = am
    out["grad_output"] = go
    return out


def run_module(c: ModuleCase, mod32: torch.nn.MultiheadAttention, inputs: dict, dtype) -> dict:
    mod = copy.deepcopy(mod32).to(dtype)
    mod.train(c.train)
    q = inputs["query"].to(dtype).clone().requires_grad_(True)
    k = inputs["key"].to(dtype).clone().requires_grad_(True)
    v = inputs["value"].to(dtype).clone().requires_grad_(True)

    def cast_mask(m):
        if m is None or m.dtype == torch.bool:
            return m
        return m.to(dtype)

    kpm = cast_mask(inputs.get("key_padding_mask"))
    am = cast_mask(inputs.get("attn_mask"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, weights = mod(q, k, v, key_padding_mask=kpm, need_weights=c.need_weights,
                           attn_mask=am, average_attn_weights=c.average, is_causal=c.is_causal)
        loss = (out * inputs["grad_output"].to(dtype)).sum()
        loss.backward()
    WARNINGS.add(f"module/{c.name}", caught)
    res = {"output": out.detach()}
    if c.need_weights:
        res["attn_weights"] = weights.detach()
    else:
        assert weights is None
    res["grad_query"] = q.grad
    res["grad_key"] = k.grad
    res["grad_value"] = v.grad
    for name, p in mod.named_parameters():
        assert p.grad is not None, f"{c.name}: no gradient for {name}"
        res[f"grad.{name}"] = p.grad
    return res


# ---------------------------------------------------------------------------------------------
# SDPA (F.scaled_dot_product_attention) cases
# ---------------------------------------------------------------------------------------------

@dataclass
class SdpaCase:
    name: str
    description: str
    B: int
    Hq: int
    L: int
    S: int
    Dqk: int
    Hkv: Optional[int] = None        # None: = Hq
    Dv: Optional[int] = None         # None: = Dqk
    # None | ("bool", shape) | ("float", shape); bool polarity True = MAY attend
    mask: Optional[tuple] = None
    causal: str = "none"             # none | top_left | bottom_right
    scale: str = ""                  # "" = default 1/sqrt(Dqk)
    gqa: bool = False
    post: Optional[Callable] = None
    expect_full_rows: bool = False
    window: tuple = (-1, -1)         # (left, right): FlashAttention-2's window_size

    @property
    def hkv(self):
        return self.Hq if self.Hkv is None else self.Hkv

    @property
    def dv(self):
        return self.Dqk if self.Dv is None else self.Dv


def sdpa_block_row(mask):
    """Query row 1 may attend to nothing (in every broadcast position of the mask)."""
    mask = mask.clone()
    if mask.dtype == torch.bool:
        mask[..., 1, :] = False
    else:
        mask[..., 1, :] = NEG_INF
    return mask


def sdpa_block_b1_h0_row2(mask):
    mask = mask.clone()
    if mask.dtype == torch.bool:
        mask[1, 0, 2, :] = False
    else:
        mask[1, 0, 2, :] = NEG_INF
    return mask


def sdpa_cases() -> list[SdpaCase]:
    C = SdpaCase
    return [
        C("plain", "B=2, H=2, L=S=4, D=8, no mask", B=2, Hq=2, L=4, S=4, Dqk=8),
        C("l_ne_s", "L=3 != S=6", B=2, Hq=3, L=3, S=6, Dqk=8),
        C("l_gt_s", "L=7 > S=2", B=1, Hq=2, L=7, S=2, Dqk=4),
        C("dv_ne_dqk", "Dv=4 != Dqk=6", B=2, Hq=2, L=4, S=5, Dqk=6, Dv=4),
        C("scale_custom", "custom scale 0.3", B=2, Hq=2, L=4, S=5, Dqk=8, scale="0.3"),
        C("scale_negative", "negative scale -0.45 with a bool mask (1,1,L,S)", B=2, Hq=2, L=4,
          S=5, Dqk=8, scale="-0.45", mask=("bool", (1, 1, 4, 5))),
        C("scale_large", "scale 2.5 (peaked softmax), Dv != Dqk", B=1, Hq=2, L=5, S=5, Dqk=4,
          Dv=3, scale="2.5"),
        C("bool_mask_11ls", "bool mask broadcast (1, 1, L, S)", B=2, Hq=3, L=4, S=6, Dqk=8,
          mask=("bool", (1, 1, 4, 6))),
        C("bool_mask_b11s", "bool mask broadcast (B, 1, 1, S) (key padding)", B=3, Hq=2, L=4,
          S=6, Dqk=8, mask=("bool", (3, 1, 1, 6))),
        C("bool_mask_ls", "bool mask (L, S), rank 2", B=2, Hq=2, L=5, S=4, Dqk=8,
          mask=("bool", (5, 4))),
        C("bool_mask_bhls", "bool mask full rank (B, Hq, L, S)", B=2, Hq=2, L=4, S=5, Dqk=6,
          mask=("bool", (2, 2, 4, 5))),
        C("float_mask_bhls", "float additive mask (B, Hq, L, S) with some -inf", B=2, Hq=2, L=4,
          S=6, Dqk=8, mask=("float", (2, 2, 4, 6))),
        C("float_mask_hls", "float additive mask rank 3 (Hq, L, S)", B=2, Hq=3, L=4, S=5, Dqk=4,
          mask=("float", (3, 4, 5))),
        C("float_mask_b1ls", "float additive mask (B, 1, L, S), Dv != Dqk, custom scale", B=2,
          Hq=2, L=3, S=5, Dqk=6, Dv=5, scale="0.7", mask=("float", (2, 1, 3, 5))),
        C("top_left_square", "is_causal (top-left), L=S=6", B=2, Hq=2, L=6, S=6, Dqk=8,
          causal="top_left"),
        C("top_left_l_lt_s", "is_causal (top-left), L=3 < S=6", B=2, Hq=2, L=3, S=6, Dqk=8,
          causal="top_left"),
        C("top_left_l_gt_s", "is_causal (top-left), L=6 > S=3", B=2, Hq=2, L=6, S=3, Dqk=8,
          causal="top_left"),
        C("bottom_right_l_lt_s", "bottom-right causal (causal_lower_right), L=3 < S=6", B=2,
          Hq=2, L=3, S=6, Dqk=8, causal="bottom_right"),
        C("bottom_right_l_gt_s", "bottom-right causal, L=6 > S=3: first L-S query rows are fully"
          " masked (PyTorch gives 0)", B=2, Hq=2, L=6, S=3, Dqk=8, causal="bottom_right",
          expect_full_rows=True),
        C("gqa_4_2_top_left", "GQA Hq=4, Hkv=2, is_causal top-left", B=2, Hq=4, Hkv=2, L=5, S=5,
          Dqk=8, gqa=True, causal="top_left"),
        C("gqa_6_1_top_left", "GQA Hq=6, Hkv=1 (multi-query), is_causal top-left, L<S", B=1,
          Hq=6, Hkv=1, L=4, S=6, Dqk=4, gqa=True, causal="top_left"),
        C("gqa_6_1_bottom_right", "GQA Hq=6, Hkv=1, bottom-right causal, L<S, Dv != Dqk", B=2,
          Hq=6, Hkv=1, L=3, S=5, Dqk=4, Dv=6, gqa=True, causal="bottom_right"),
        C("gqa_4_2_float_mask", "GQA Hq=4, Hkv=2 with float mask (B, Hq, L, S)", B=2, Hq=4,
          Hkv=2, L=4, S=5, Dqk=4, gqa=True, mask=("float", (2, 4, 4, 5))),
        C("fully_masked_bool", "bool mask (1, 1, L, S) with query row 1 fully masked (0 output)",
          B=2, Hq=2, L=4, S=5, Dqk=8, mask=("bool", (1, 1, 4, 5)), post=sdpa_block_row,
          expect_full_rows=True),
        C("fully_masked_bool_bhls", "bool mask (B, Hq, L, S), one (batch, head, row) fully "
          "masked", B=2, Hq=2, L=4, S=5, Dqk=4, mask=("bool", (2, 2, 4, 5)),
          post=sdpa_block_b1_h0_row2, expect_full_rows=True),
        C("fully_masked_float", "float mask (B, Hq, L, S), one row all -inf", B=2, Hq=2, L=4, S=5,
          Dqk=4, mask=("float", (2, 2, 4, 5)), post=sdpa_block_b1_h0_row2,
          expect_full_rows=True),
        C("l1", "L=1 (single query, decode)", B=2, Hq=2, L=1, S=6, Dqk=8),
        C("l1_bottom_right", "L=1 with bottom-right causal (sees every key)", B=2, Hq=4, Hkv=2,
          L=1, S=6, Dqk=8, gqa=True, causal="bottom_right"),
        C("s1", "S=1 (single key)", B=2, Hq=2, L=4, S=1, Dqk=8),
        C("head_dim_1", "Dqk = Dv = 1", B=2, Hq=3, L=4, S=5, Dqk=1),
        C("head_dim_13", "Dqk = Dv = 13 with bool mask (L, S)", B=2, Hq=2, L=5, S=6, Dqk=13,
          mask=("bool", (5, 6))),
        C("window_left_right", "window (2, 1) without causality, L=5 < S=9 (FlashAttention's "
          "construct_local_mask: the bottom-right diagonal)", B=2, Hq=2, L=5, S=9, Dqk=8, window=(2, 1)),
        C("window_left_bottom_right", "window (3, -1) with bottom-right causality (FlashAttention's "
          "causal local attention), GQA 4:2, L=6 < S=11", B=2, Hq=4, Hkv=2, L=6, S=11, Dqk=8, gqa=True,
          causal="bottom_right", window=(3, -1)),
        C("window_right_only", "window (-1, 0) without causality: FlashAttention's causal as a window, "
          "L=7 > S=4 (first rows see nothing)", B=1, Hq=2, L=7, S=4, Dqk=4, window=(-1, 0),
          expect_full_rows=True),
        C("window_hf_sliding_4", "Hugging Face sliding_window = 4 (kv > q - 4, masking_utils' "
          "sliding_window_overlay) with is_causal: window (3, 0) top-left, L=S=10", B=2, Hq=2, L=10,
          S=10, Dqk=8, causal="top_left", window=(3, 0)),
    ]


def local_mask(c: "SdpaCase") -> torch.Tensor:
    """True where the window (and causality) lets query i see key j. FlashAttention's
    construct_local_mask (tests/test_flash_attn.py, which returns the blocked positions) on its
    bottom-right diagonal i + S - L; with is_causal (top-left) Hugging Face's
    sliding_window_overlay kv > q - W and causal kv <= q instead."""
    row = torch.arange(c.L).unsqueeze(-1)
    col = torch.arange(c.S)
    left, right = c.window
    if c.causal == "top_left":
        assert right == 0
        return (col > row - (left + 1)) & (col <= row)
    if c.causal == "bottom_right":
        right = 0
    d = c.S - c.L
    if left < 0:
        blocked = col > row + d + right
    else:
        blocked = (col > torch.clamp(row + d + right, max=c.S)) | (col < row + d - left)
    if right < 0:  # FlashAttention's window_size[1] = -1: unbounded on the right
        blocked = col < row + d - left
    return ~blocked


def sdpa_full_rows(c: SdpaCase, mask_blocked: Optional[torch.Tensor]) -> int:
    blocked = torch.zeros(c.B, c.Hq, c.L, c.S, dtype=torch.bool)
    if mask_blocked is not None:
        blocked = blocked | mask_blocked
    return int(blocked.all(dim=-1).sum())


def sdpa_inputs(c: SdpaCase, g: torch.Generator) -> dict:
    q = randn(g, c.B, c.Hq, c.L, c.Dqk)
    k = randn(g, c.B, c.hkv, c.S, c.Dqk)
    v = randn(g, c.B, c.hkv, c.S, c.dv)
    mask = None
    if c.mask is not None:
        assert c.causal == "none"
        kind, shape = c.mask
        for _ in range(1000):
            allowed = bernoulli(g, 0.7, *shape)
            mask = allowed if kind == "bool" else float_mask_from_blocked(g, ~allowed)
            if sdpa_full_rows(c, is_blocked(mask, False)) == 0:
                break
        else:
            raise RuntimeError(f"{c.name}: could not draw a mask without fully masked rows")
        if c.post is not None:
            mask = c.post(mask)
    go = randn(g, c.B, c.Hq, c.L, c.dv)
    out = {"query": q, "key": k, "value": v}
    if mask is not None:
        out["attn_mask"] = mask
    out["grad_output"] = go
    return out


def bottom_right_mask(L, S):
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)


def run_sdpa(c: SdpaCase, inputs: dict, dtype, use_causal_bias=False) -> dict:
    q = inputs["query"].to(dtype).clone().requires_grad_(True)
    k = inputs["key"].to(dtype).clone().requires_grad_(True)
    v = inputs["value"].to(dtype).clone().requires_grad_(True)
    mask = inputs.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    is_causal = c.causal == "top_left"
    kwargs = {}
    if c.scale:
        kwargs["scale"] = float(c.scale)
    if c.gqa:
        kwargs["enable_gqa"] = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if c.window != (-1, -1):  # PyTorch has no window: its definition as a bool mask
            assert mask is None
            mask, is_causal = local_mask(c), False
        elif c.causal == "bottom_right":
            if use_causal_bias:
                from torch.nn.attention.bias import causal_lower_right
                mask = causal_lower_right(c.L, c.S)
            else:
                mask = bottom_right_mask(c.L, c.S)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                             is_causal=is_causal, **kwargs)
        loss = (out * inputs["grad_output"].to(dtype)).sum()
        loss.backward()
    WARNINGS.add(f"sdpa/{c.name}" + (" (causal_lower_right cross-check)" if use_causal_bias
                                      else ""), caught)
    return {"output": out.detach(), "grad_query": q.grad, "grad_key": k.grad,
            "grad_value": v.grad}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

def error_summary(f64: dict, f32: dict, case: str, notes: list) -> tuple[float, str]:
    """Largest relative f32-vs-f64 error over the tensors, and which tensor it is.

    Tensors that are mathematically zero (|f64| tiny next to the case's other tensors) are
    reported in the notes instead: their f32 values are pure rounding noise.
    """
    scale = max(max_abs(v) for v in f64.values())
    worst, worst_name = 0.0, ""
    for k, ref in f64.items():
        err = max_abs(f32[k].double() - ref)
        if max_abs(ref) < 1e-9 * scale:
            if err > 0:
                notes.append(f"{case}: {k} is mathematically ~0 (max|f64|={max_abs(ref):.1e}) "
                             f"but torch_f32 has rounding noise max {err:.1e}")
            continue
        rel = err / max_abs(ref)
        if rel > worst:
            worst, worst_name = rel, k
    return worst, worst_name


def write_case(folder, files: dict, metadata: dict) -> int:
    os.makedirs(folder, exist_ok=True)
    total = 0
    for fname, (tensors, extra) in files.items():
        path = os.path.join(folder, fname)
        save_canonical(tensors, path, {**metadata, **extra})
        total += os.path.getsize(path)
    return total


def skipped_as_non_finite(case: str, c, f64: dict, f32: dict, notes: list) -> bool:
    """Whether PyTorch gave a non-finite result (the case is then skipped, with a note): an error
    unless the case expects fully masked rows."""
    bad = all_finite(f64) + all_finite(f32)
    if not bad:
        return False
    msg = f"{case}: PyTorch gives non-finite {sorted(set(bad))}; case skipped"
    if not c.expect_full_rows:
        raise RuntimeError(msg)
    notes.append(msg)
    return True


def results_files(f64: dict, f32: dict) -> dict:
    """The results in float64 (expected) and PyTorch's own in float32, as write_case takes them."""
    return {
        "expected_f64.safetensors": ({k: v.double() for k, v in f64.items()}, {"dtype": "float64"}),
        "torch_f32.safetensors": ({k: v.float() for k, v in f32.items()}, {"dtype": "float32"}),
    }


def generate_module(out_dir: str, notes: list, rows: list) -> tuple[int, int]:
    total, count = 0, 0
    for c in module_cases():
        assert c.dropout == 0.0 or not c.train, "dropout cannot be matched across RNGs"
        g = case_generator("module", c.name)
        mod = torch.nn.MultiheadAttention(c.E, c.H, dropout=c.dropout, bias=c.bias,
                                          add_bias_kv=c.add_bias_kv,
                                          add_zero_attn=c.add_zero_attn, kdim=c.kdim,
                                          vdim=c.vdim, batch_first=c.batch_first)
        randomize_module(mod, g)
        inputs = module_inputs(c, g)
        f64 = run_module(c, mod, inputs, torch.float64)
        f32 = run_module(c, mod, inputs, torch.float32)
        if skipped_as_non_finite(f"module/{c.name}", c, f64, f32, notes):
            continue
        full = module_full_rows(c, inputs.get("key_padding_mask"), inputs.get("attn_mask"))
        assert (full > 0) == c.expect_full_rows, (c.name, full)
        if full:
            # Fully masked rows: the attention result is 0, so the output is out_proj.bias.
            out = f64["output"]
            bias = mod.out_proj.bias.detach().double()
            rows_eq_bias = (out - bias).abs().amax(dim=-1) <= 1e-12
            notes.append(f"module/{c.name}: {full} fully masked (batch, head, query) rows, all "
                         f"finite; {int(rows_eq_bias.sum())} output rows (all heads masked) "
                         "equal out_proj.bias (SDPA path gives 0 attention there)")
        state = {k: v.detach().clone() for k, v in mod.state_dict().items()}
        meta = {"case": c.name, "description": c.description, "regenerate": REGENERATE,
                "torch_version": TORCH_VERSION}
        files = {
            "weights.safetensors": (state, {}),
            "inputs.safetensors": (inputs, {"args": c.args(),
                                            "self_attention": str(c.self_attention).lower()}),
            **results_files(f64, f32),
        }
        total += write_case(os.path.join(out_dir, "module", c.name), files, meta)
        count += 1
        rel, which = error_summary(f64, f32, f"module/{c.name}", notes)
        extras = [n for n in ("key_padding_mask", "attn_mask") if n in inputs]
        mask_desc = ",".join(f"{n}:{str(inputs[n].dtype).replace('torch.', '')}"
                             f"{tuple(inputs[n].shape)}" for n in extras)
        rows.append(("module", c.name, f"q{tuple(inputs['query'].shape)}", mask_desc,
                     c.args(), f"{rel:.1e} ({which})"))
    return total, count


def generate_sdpa(out_dir: str, notes: list, rows: list) -> tuple[int, int]:
    total, count = 0, 0
    for c in sdpa_cases():
        g = case_generator("sdpa", c.name)
        inputs = sdpa_inputs(c, g)
        f64 = run_sdpa(c, inputs, torch.float64)
        f32 = run_sdpa(c, inputs, torch.float32)
        if skipped_as_non_finite(f"sdpa/{c.name}", c, f64, f32, notes):
            continue
        if c.causal == "bottom_right" and c.window == (-1, -1):
            # Cross-check the explicit tril mask against torch's CausalBias (another kernel).
            ref = run_sdpa(c, inputs, torch.float64, use_causal_bias=True)
            diff = max(max_abs(ref[k] - f64[k]) for k in f64)
            if all_finite(ref):
                notes.append(f"sdpa/{c.name}: causal_lower_right gives non-finite "
                             f"{all_finite(ref)} where the explicit tril mask does not")
            elif diff > 1e-12:
                notes.append(f"sdpa/{c.name}: causal_lower_right differs from the explicit tril "
                             f"mask by {diff:.1e}")
        # Fully masked rows: check output and grad_query rows are exactly 0.
        blocked = torch.zeros(c.B, c.Hq, c.L, c.S, dtype=torch.bool)
        if "attn_mask" in inputs:
            blocked = blocked | is_blocked(inputs["attn_mask"], False)
        if c.window != (-1, -1):
            blocked = blocked | ~local_mask(c)
        elif c.causal == "bottom_right":
            blocked = blocked | ~bottom_right_mask(c.L, c.S)
        full = blocked.all(dim=-1)
        assert bool(full.any()) == c.expect_full_rows, c.name
        if full.any():
            o = f64["output"][full]
            gq = f64["grad_query"][full]
            notes.append(f"sdpa/{c.name}: {int(full.sum())} fully masked rows; output there "
                         f"max|.|={max_abs(o):g}, grad_query there max|.|={max_abs(gq):g}; "
                         "all grads finite")
        meta = {"case": c.name, "description": c.description, "regenerate": REGENERATE,
                "torch_version": TORCH_VERSION, "causal": c.causal, "scale": c.scale,
                "enable_gqa": str(c.gqa).lower()}
        if c.window != (-1, -1):  # the Scoring fields' names (sdpa_golden_test reads them by name)
            meta.update({"window_left": str(c.window[0]), "window_right": str(c.window[1])})
        files = {"inputs.safetensors": (inputs, {}), **results_files(f64, f32)}
        total += write_case(os.path.join(out_dir, "sdpa", c.name), files, meta)
        count += 1
        rel, which = error_summary(f64, f32, f"sdpa/{c.name}", notes)
        mask_desc = ""
        if "attn_mask" in inputs:
            m = inputs["attn_mask"]
            mask_desc = f"attn_mask:{str(m.dtype).replace('torch.', '')}{tuple(m.shape)}"
        flags = f"causal={c.causal} scale={c.scale or 'default'} gqa={str(c.gqa).lower()}"
        rows.append(("sdpa", c.name, f"q{tuple(inputs['query'].shape)} "
                     f"k{tuple(inputs['key'].shape)} v{tuple(inputs['value'].shape)}",
                     mask_desc, flags, f"{rel:.1e} ({which})"))
    return total, count


README = """\
# Golden data from PyTorch

Generated by `scripts/goldens/make_goldens.py` with PyTorch {torch_version} (CPU, float32 and float64,
single-threaded). Regenerate with

    python3 scripts/goldens/make_goldens.py

(deterministic: fixed per-case seeds and sorted metadata, so a re-run gives byte-identical files;
it deletes and rewrites `module/` and `sdpa/`). Do not edit the files by hand.

## Generators

Every file records the command that wrote it (metadata `regenerate`). The commands name the
places the scripts had before they moved to `scripts/goldens/` and `scripts/twin/`; the scripts
still record them, so that a re-run stays byte-identical. Run them from the repository root:

| recorded command | files | run today |
|---|---|---|
| `python3 scripts/make_goldens.py` | `module/`, `sdpa/`, this README | `python3 scripts/goldens/make_goldens.py` |
| `python3 scripts/make_layer_goldens.py` | `layers/` | `python3 scripts/goldens/make_layer_goldens.py` |
| `python3 scripts/make_training_goldens.py` | `training/{{cross_entropy,adamw,schedule}}.safetensors` | `python3 scripts/goldens/make_training_goldens.py` |
| `python3 scripts/train_twin.py golden …` | `training/twin_*.safetensors` | `python3 scripts/twin/train_twin.py golden …` (same flags) |
| `python3 scripts/example_goldens/<case>.py` | `examples/<case>/` | `python3 scripts/goldens/examples/<case>.py` |
| `scripts/make_safetensors_fixture.py` (metadata `source`) | `tests/core/fixtures/python_written.safetensors` | `python3 scripts/goldens/make_safetensors_fixture.py` |

## Layout

    module/<case>/weights.safetensors       torch.nn.MultiheadAttention state_dict (F32)
    module/<case>/inputs.safetensors
    module/<case>/expected_f64.safetensors
    module/<case>/torch_f32.safetensors
    sdpa/<case>/inputs.safetensors           (no weights file)
    sdpa/<case>/expected_f64.safetensors
    sdpa/<case>/torch_f32.safetensors

`expected_f64` is PyTorch run in float64 on exactly the same values (the float32 inputs and
weights cast to float64); it is the reference. `torch_f32` is the same computation in float32;
it only sets the error budget. Every tensor in every golden is finite.

## Module cases (`module/`)

- `weights.safetensors`: PyTorch's names and shapes: `in_proj_weight` (3E, E) or
  `q_proj_weight` (E, E) / `k_proj_weight` (E, kdim) / `v_proj_weight` (E, vdim);
  `in_proj_bias` (3E); `bias_k`, `bias_v` (1, 1, E); `out_proj.weight` (E, E), `out_proj.bias` (E)
  — whichever the module has. All parameters are random (biases included).
- `inputs.safetensors`: `query`, `key`, `value` (F32; for self-attention key and value hold the
  same values as query, but they are separate leaves with their own gradients); optional
  `key_padding_mask` ((N, S) or (S) unbatched; BOOL with True = padded, or F32 additive);
  optional `attn_mask` ((L, S) or (N*num_heads, L, S), (num_heads, L, S) unbatched; BOOL with
  MHA polarity True = may NOT attend, or F32 additive, −inf blocks); `grad_output` (output shape).
  Layout of query/key/value: (L, N, E) seq-first, (N, L, E) with `--batch-first`, (L, E) unbatched.
  Metadata `args`: the mha CLI flags that reproduce the case (always with `--backward`);
  `self_attention`: "true" when key/value equal query.
- outputs: `output`, `attn_weights` (only with need_weights; (N, L, S') averaged or
  (N, H, L, S') per head, S' counting the add_bias_kv / add_zero_attn columns), `grad_query`,
  `grad_key`, `grad_value`, and `grad.<param>` for every parameter (e.g. `grad.in_proj_weight`,
  `grad.out_proj.bias`, `grad.bias_k`). Loss = sum(output * grad_output).
- The module runs in eval mode unless the args have `--train` (only used with dropout 0:
  dropout cannot be matched across RNGs).
- Fully masked rows appear only in need_weights=False cases: PyTorch's SDPA path gives 0
  attention for such a (batch, head, query) row (so where every head is masked the output row
  is `out_proj.bias`), with finite gradients; with need_weights=True PyTorch gives NaN.
- `--is-causal` cases store the causal `attn_mask` (PyTorch requires it). With need_weights=False
  and no key_padding_mask PyTorch drops that mask and runs SDPA with is_causal=True (top-left);
  otherwise the mask is used as given.
- Mixing a bool key_padding_mask with a float attn_mask (`float_mask_bool_kpm`, `mixed_e16`)
  makes PyTorch warn that mismatched mask types are deprecated; it still adds them.

## SDPA cases (`sdpa/`)

- inputs: `query` (B, Hq, L, Dqk), `key` (B, Hkv, S, Dqk), `value` (B, Hkv, S, Dv), optional
  `attn_mask` (rank 2..4, broadcastable to (B, Hq, L, S); BOOL with SDPA polarity True = MAY
  attend, or F32 additive), `grad_output` (B, Hq, L, Dv).
- metadata: `causal` = `none` | `top_left` (is_causal=True, tril(ones(L, S))) | `bottom_right`
  (tril(ones(L, S), diagonal=S−L), as causal_lower_right; no mask tensor is stored);
  `scale` = "" (default 1/sqrt(Dqk)) or a decimal string; `enable_gqa` = "true" | "false".
- outputs: `output`, `grad_query`, `grad_key`, `grad_value`. Fully masked rows give 0.

All files carry metadata `case`, `description`, `regenerate`, `torch_version`; the output files
also `dtype`.

## Acceptance rule (C++ tests)

A tensor computed by mha in float32 passes when

    max|mha_f32 − expected_f64| ≤ 2·max|torch_f32 − expected_f64| + 1e-6·max|expected_f64|

i.e. mha must be at most twice as far from the float64 truth as PyTorch's own float32 result.
(float64 runs of mha can be compared against `expected_f64` directly with a tight tolerance.)

PyTorch's float32 error depends on the CPU it runs on (its kernels, and their rounding, are
chosen per instruction set), so the tests take `torch_f32` (and every other peer result: the
`torch_f32` tensors of single-file goldens, `*_f32`, `*_bf16`, decode's `torch_output*`) not from
this folder but from PyTorch run on the machine that runs the tests:
`scripts/goldens/peers_here.py DIR` (`make peers`; the ctest fixture `goldens.peers`) runs every
generator in peers mode (`scripts/goldens/canonical_writer.py`), which checks each input it draws
against the committed file and writes only the peer's tensors, under `build/peers/` at the same
relative paths. The committed `torch_f32` files record the generating machine's results.

Mathematically zero tensors need care: in `module/l1_s1` (L = S = 1) `grad_query` and
`grad_key` are exactly 0 in both files, so the rule demands exact zeros; in `sdpa/s1` (S = 1)
they are ~1e-16 in float64 but ~4.5e-7 rounding noise in torch_f32.

## Cases

{table}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default tests/goldens)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch.backends.mha.set_fastpath_enabled(False)  # belt and braces: we run with grad anyway

    out_dir = os.path.abspath(args.out)
    if not peers_dir():  # (peers mode writes under its own folder only: canonical_writer.py)
        for sub in ("module", "sdpa"):
            shutil.rmtree(os.path.join(out_dir, sub), ignore_errors=True)
        os.makedirs(out_dir, exist_ok=True)

    notes: list[str] = []
    rows: list[tuple] = []
    size_m, n_m = generate_module(out_dir, notes, rows)
    size_s, n_s = generate_sdpa(out_dir, notes, rows)

    table = ["| kind | case | description |", "|---|---|---|"]
    descr = {("module", c.name): c.description for c in module_cases()}
    descr.update({("sdpa", c.name): c.description for c in sdpa_cases()})
    for r in rows:
        table.append(f"| {r[0]} | `{r[1]}` | {descr[(r[0], r[1])]} |")
    readme = README.format(torch_version=TORCH_VERSION, table="\n".join(table))
    if not peers_dir():
        with open(os.path.join(out_dir, "README.md"), "w") as f:
            f.write(readme)

    print(f"torch {TORCH_VERSION}; writing to {out_dir}")
    print(f"{'kind':6} {'case':42} {'shapes':44} {'masks / flags':s}")
    for kind, name, shapes, masks, flags, err in rows:
        print(f"{kind:6} {name:42} {shapes:44} {masks}")
        print(f"{'':6} {'':42} {'f32 rel err ' + err:44} {flags}")
    print(f"\n{n_m} module cases, {n_s} sdpa cases, {(size_m + size_s) / 1024:.1f} KiB")
    if notes:
        print("\nNotes:")
        for n in notes:
            print("  - " + n)
    if WARNINGS.by_case:
        print("\nPyTorch warnings:")
        for case, msgs in WARNINGS.by_case.items():
            for m in msgs:
                print(f"  - {case}: {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
