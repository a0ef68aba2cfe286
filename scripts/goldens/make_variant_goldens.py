#!/usr/bin/env python3
"""Goldens for the score variants (soft-cap, sinks, ALiBi), computed by the anchors' own code.

Each case runs one anchor's definition in PyTorch, float64 and float32, with autograd for every
gradient (the sinks' too):
  - Gemma 2 (soft-cap): Hugging Face's `modeling_gemma2.eager_attention_forward` in float32. Its
    softmax runs in float32 whatever the input's dtype, so the float64 expectation is the same
    function's operations transcribed with a float64 softmax (`gemma2_eager_f64`), checked here to
    agree with Hugging Face's own to float32's precision;
  - gpt-oss (sinks): Hugging Face's `modeling_gpt_oss.eager_attention_forward`, called as it is
    (its `module.sinks` is the sink parameter), in both precisions;
  - Bloom (ALiBi, key-position form): Hugging Face's `build_alibi_tensor` added to the scores under
    the causal mask as BloomAttention's baddbmm does; mha gets the slopes (build_alibi_tensor's value
    at key 1) and causality;
  - packed sequences (FlashAttention's varlen): PyTorch's scaled_dot_product_attention called on
    each sequence of the packed tensors, the results put back in place (bottom-right causality as
    SDPA's explicit mask, GQA by enable_gqa);
  - FlashAttention-2 (ALiBi with L != S, soft-cap, window, all at once): its tests' `attention_ref`
    definition (tests/test_flash_attn.py: scores scaled, soft-capped, masked by
    `construct_local_mask`, plus `attn_bias_from_alibi_slopes`), written out here, since the
    flash-attn package needs CUDA.
Masks: Hugging Face's causal and sliding-window masks (kv <= q, kv > q − W) as additive −inf
masks; mha gets them as settings (causal, window), not masks.

Writes tests/goldens/variants/<case>/{inputs,expected_f64,torch_f32}.safetensors in
make_goldens.py's layout, with the Scoring fields in the metadata by name; sdpa_golden_test.cpp
and python/tests read them. Deterministic: python3 scripts/goldens/make_variant_goldens.py
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import types
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical_writer import peers_dir  # noqa: E402
from make_goldens import DEFAULT_OUT, TORCH_VERSION, case_generator, max_abs, randn, uniform, write_case  # noqa: E402
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

REGENERATE = "python3 scripts/goldens/make_variant_goldens.py"
NEG_INF = float("-inf")


@dataclass
class Case:
    name: str
    description: str
    anchor: str  # gemma2 | gpt_oss | bloom | flash_attn | sdpa_per_sequence
    B: int
    Hq: int
    Hkv: int
    L: int
    S: int
    D: int
    causal: str = "none"          # mha's Scoring::causal: none | top_left | bottom_right
    window: tuple = (-1, -1)      # mha's (window_left, window_right)
    softcap: float = 0.0
    sinks: bool = False
    alibi: str = ""               # "" | "heads" | "batch_heads" (FlashAttention's (B, Hq))
    key_padding: Optional[list] = None  # keys per sequence (Hugging Face's 2-D attention mask)
    packed: Optional[tuple] = None      # (queries per sequence, keys per sequence): B = 1, L and S their sums
    extra: dict = field(default_factory=dict)


def cases() -> list[Case]:
    return [
        Case("gemma2_softcap_causal", "Gemma 2 eager: soft-cap 2 (tight, bends most scores) with the causal "
             "mask, GQA 4:2, L=S=9", "gemma2", B=2, Hq=4, Hkv=2, L=9, S=9, D=8, causal="top_left", softcap=2.0),
        Case("gemma2_softcap_sliding", "Gemma 2 eager: soft-cap 1.5 with sliding_window = 4 (window (3, 0)) and "
             "a padded second sequence, L=S=11", "gemma2", B=2, Hq=2, Hkv=1, L=11, S=11, D=8, causal="top_left",
             window=(3, 0), softcap=1.5, key_padding=[11, 8]),
        Case("gpt_oss_sinks_causal", "gpt-oss eager: a learned sink per head with the causal mask, GQA 4:2, "
             "L=S=8 (grad_sinks by autograd)", "gpt_oss", B=2, Hq=4, Hkv=2, L=8, S=8, D=8, causal="top_left",
             sinks=True),
        Case("gpt_oss_sinks_sliding_empty_rows", "gpt-oss eager: sinks with sliding_window = 3 and key padding "
             "that leaves rows of the second sequence no key (output 0 there: the sink takes all)", "gpt_oss",
             B=2, Hq=2, Hkv=2, L=7, S=7, D=4, causal="top_left", window=(2, 0), sinks=True, key_padding=[7, 0]),
        Case("bloom_alibi_causal", "Bloom: build_alibi_tensor's key-position ALiBi (slope*j) added to the "
             "scores under the causal mask; mha takes Bloom's slopes, 8 heads", "bloom", B=2, Hq=8, Hkv=8,
             L=10, S=10, D=4, causal="top_left", alibi="heads"),
        Case("flash_alibi_l_lt_s", "FlashAttention-2's attention_ref: alibi_slopes (B, Hq) without causality, "
             "L=5 < S=9 (bias -slope*|i + S - L - j|)", "flash_attn", B=2, Hq=2, Hkv=2, L=5, S=9, D=8,
             alibi="batch_heads"),
        Case("packed_sdpa_per_sequence", "packed sequences of 3x5, 0x4, 9x9, 1x12 queries x keys with bottom-right "
             "causality and GQA 4:2: PyTorch's SDPA on each sequence", "sdpa_per_sequence", B=1, Hq=4, Hkv=2, L=13,
             S=30, D=8, causal="bottom_right", packed=([3, 0, 9, 1], [5, 4, 9, 12])),
        Case("flash_all_variants", "FlashAttention-2's attention_ref: soft-cap 3, window (4, 0), alibi (Hq) and "
             "bottom-right causality at once, GQA 4:2, L=6 < S=13", "flash_attn", B=2, Hq=4, Hkv=2, L=6, S=13,
             D=8, causal="bottom_right", window=(4, 0), softcap=3.0, alibi="heads"),
    ]


def visible(c: Case, b: int) -> torch.Tensor:
    """(L, S) True where query i may see key j: Hugging Face's causal (kv <= q) and sliding-window
    (kv > q − W) masks with the 2-D padding mask for the Hugging Face anchors; FlashAttention's
    construct_local_mask (bottom-right diagonal) for attention_ref."""
    i = torch.arange(c.L).unsqueeze(-1)
    j = torch.arange(c.S)
    keys = c.S if c.key_padding is None else c.key_padding[b]
    see = j < keys
    d = 0 if c.causal == "top_left" else c.S - c.L
    if c.causal != "none":
        see = see & (j <= i + d)
    left, right = c.window
    if left >= 0:
        see = see & (j >= i + d - left)
    if right >= 0:
        see = see & (j <= i + d + right)
    return see


def additive_mask(c: Case, dtype) -> torch.Tensor:
    m = torch.stack([visible(c, b) for b in range(c.B)]).unsqueeze(1)  # (B, 1, L, S)
    return torch.zeros(m.shape, dtype=dtype).masked_fill(~m, NEG_INF)


def offsets(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64)


def inputs_of(c: Case) -> dict:
    g = case_generator("variants", c.name)
    t = {"query": randn(g, c.B, c.Hq, c.L, c.D), "key": randn(g, c.B, c.Hkv, c.S, c.D),
         "value": randn(g, c.B, c.Hkv, c.S, c.D), "grad_output": randn(g, c.B, c.Hq, c.L, c.D)}
    if c.packed:
        t["cu_seqlens_q"], t["cu_seqlens_k"] = offsets(c.packed[0]), offsets(c.packed[1])
    if c.sinks:
        t["sinks"] = randn(g, c.Hq) * 2
    if c.alibi == "batch_heads":
        t["alibi_slopes"] = uniform(g, 0.05, 1.0, c.B, c.Hq)
    elif c.alibi == "heads" and c.anchor != "bloom":
        t["alibi_slopes"] = uniform(g, 0.05, 1.0, c.Hq)
    elif c.anchor == "bloom":  # Bloom's own slopes: build_alibi_tensor's value at key 1
        ones = torch.ones(1, 2, dtype=torch.long)
        t["alibi_slopes"] = build_alibi_tensor(ones, c.Hq, torch.float32).reshape(c.Hq, 2)[:, 1].contiguous()
    return t


def gemma2_eager_f64(query, key, value, attention_mask, scaling, softcap, groups):
    """modeling_gemma2.eager_attention_forward's operations with the softmax in the inputs' dtype."""
    k = modeling_gemma2.repeat_kv(key, groups)
    v = modeling_gemma2.repeat_kv(value, groups)
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    w = torch.tanh(w / softcap) * softcap
    w = w + attention_mask
    w = F.softmax(w, dim=-1)
    return torch.matmul(w, v).transpose(1, 2).contiguous()


def flash_attention_ref(c: Case, q, k, v, slopes, dtype):
    """FlashAttention-2's attention_ref (tests/test_flash_attn.py) for (B, H, L, D) inputs."""
    k = k.repeat_interleave(c.Hq // c.Hkv, dim=1)
    v = v.repeat_interleave(c.Hq // c.Hkv, dim=1)
    scores = torch.einsum("bhtd,bhsd->bhts", q / q.shape[-1] ** 0.5, k)
    if c.softcap > 0:
        scores = torch.tanh(scores / c.softcap) * c.softcap
    scores = scores.masked_fill(~torch.stack([visible(c, b) for b in range(c.B)]).unsqueeze(1), NEG_INF)
    if slopes is not None:
        s = slopes if slopes.dim() == 2 else slopes.unsqueeze(0).expand(c.B, -1)
        s = s.to(dtype).reshape(c.B, c.Hq, 1, 1)
        if c.causal != "none":  # attn_bias_from_alibi_slopes(causal=True): slope·(j − S + 1)
            bias = torch.arange(-c.S + 1, 1, dtype=dtype) * s
        else:
            row = torch.arange(c.L).unsqueeze(-1)
            col = torch.arange(c.S)
            bias = -s * (row + c.S - c.L - col).abs().to(dtype)
        scores = scores + bias
    attention = torch.softmax(scores, dim=-1)
    attention = attention.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0)  # rows that see nothing
    return torch.einsum("bhts,bhsd->bhtd", attention, v)


def run(c: Case, t: dict, dtype) -> dict:
    q, k, v = (t[n].to(dtype).clone().requires_grad_(True) for n in ("query", "key", "value"))
    sinks = t["sinks"].to(dtype).clone().requires_grad_(True) if c.sinks else None
    scaling = c.D ** -0.5
    groups = c.Hq // c.Hkv
    if c.anchor == "gemma2":
        if dtype == torch.float64:
            out = gemma2_eager_f64(q, k, v, additive_mask(c, dtype), scaling, c.softcap, groups)
        else:
            module = types.SimpleNamespace(num_key_value_groups=groups, training=False, head_dim=c.D)
            out, _ = modeling_gemma2.eager_attention_forward(module, q, k, v, additive_mask(c, dtype),
                                                             scaling=scaling, softcap=c.softcap)
        out = out.transpose(1, 2)
    elif c.anchor == "gpt_oss":
        module = types.SimpleNamespace(num_key_value_groups=groups, training=False, sinks=sinks)
        out, _ = modeling_gpt_oss.eager_attention_forward(module, q, k, v, additive_mask(c, dtype), scaling=scaling)
        out = out.transpose(1, 2)
    elif c.anchor == "bloom":
        alibi = build_alibi_tensor(torch.ones(c.B, c.S, dtype=torch.long), c.Hq, dtype).reshape(c.B, c.Hq, 1, c.S)
        scores = alibi + torch.matmul(q, k.transpose(2, 3)) * scaling  # BloomAttention's baddbmm
        scores = scores + additive_mask(c, dtype)
        out = torch.matmul(F.softmax(scores, dim=-1), v)
    elif c.anchor == "sdpa_per_sequence":
        rows = []
        for s in range(len(c.packed[0])):
            a, b = (int(x) for x in t["cu_seqlens_q"][s:s + 2])
            ka, kb = (int(x) for x in t["cu_seqlens_k"][s:s + 2])
            mask = torch.ones(b - a, kb - ka, dtype=torch.bool).tril(kb - ka - (b - a))  # bottom-right
            rows.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, ka:kb], v[:, :, ka:kb], attn_mask=mask,
                                                       enable_gqa=True))
        out = torch.cat(rows, dim=2)
    else:
        out = flash_attention_ref(c, q, k, v, t.get("alibi_slopes"), dtype)
    (out * t["grad_output"].to(dtype)).sum().backward()
    result = {"output": out.detach(), "grad_query": q.grad, "grad_key": k.grad, "grad_value": v.grad}
    if c.sinks:
        result["grad_sinks"] = sinks.grad
    return result


def metadata(c: Case) -> dict:
    """The Scoring fields by name (sdpa_golden_test reads every field it finds)."""
    m = {"case": c.name, "description": c.description, "regenerate": REGENERATE, "torch_version": TORCH_VERSION,
         "anchor": c.anchor, "causal": c.causal, "scale": ""}
    if c.window != (-1, -1):
        m.update({"window_left": str(c.window[0]), "window_right": str(c.window[1])})
    if c.softcap:
        m["softcap"] = repr(c.softcap)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default tests/goldens)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out_dir = os.path.join(os.path.abspath(args.out), "variants")
    if not peers_dir():  # (peers mode writes under its own folder only: canonical_writer.py)
        shutil.rmtree(out_dir, ignore_errors=True)
    for c in cases():
        t = inputs_of(c)
        f64, f32 = run(c, t, torch.float64), run(c, t, torch.float32)
        for name, x in list(f64.items()) + list(f32.items()):
            assert torch.isfinite(x).all(), (c.name, name)
        if c.anchor == "gemma2":  # the float64 transcription against Hugging Face's own function
            module = types.SimpleNamespace(num_key_value_groups=c.Hq // c.Hkv, training=False, head_dim=c.D)
            hf, _ = modeling_gemma2.eager_attention_forward(
                module, t["query"].double(), t["key"].double(), t["value"].double(),
                additive_mask(c, torch.float64), scaling=c.D ** -0.5, softcap=c.softcap)
            assert max_abs(hf.transpose(1, 2) - f64["output"]) < 1e-6, c.name
        inputs = dict(t)
        if c.key_padding is not None:  # Hugging Face's 2-D padding mask, as SDPA's bool (B, 1, 1, S)
            inputs["attn_mask"] = (torch.arange(c.S) < torch.tensor(c.key_padding).unsqueeze(-1)).reshape(c.B, 1, 1, c.S)
        files = {"inputs.safetensors": (inputs, {}),
                 "expected_f64.safetensors": ({k: v.double() for k, v in f64.items()}, {"dtype": "float64"}),
                 "torch_f32.safetensors": ({k: v.float() for k, v in f32.items()}, {"dtype": "float32"})}
        write_case(os.path.join(out_dir, c.name), files, metadata(c))
        rel = max(max_abs(f32[k].double() - f64[k]) / max(max_abs(f64[k]), 1e-30) for k in f64)
        print(f"{c.name:36} {c.anchor:10} float32 relative error {rel:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
