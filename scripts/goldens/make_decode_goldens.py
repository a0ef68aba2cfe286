#!/usr/bin/env python3
"""Goldens for the decode backend with half-precision keys and values: PyTorch's SDPA on the same
bfloat16 / float16 inputs, and the float64 attention of those inputs.

The accuracy bar of a half-precision KV cache is PyTorch's own: with query, key and value rounded
to the half type, mha (keys and values stored in the half type, query and output float32) must be
within 2x PyTorch SDPA's error against float64 (PyTorch computes in float, returns the half type).

One file per case, tests/goldens/decode/<case>.safetensors:
  query, key, value     the rounded inputs, in the case's dtype (BF16 or F16), (B, H, L|S, d)
  torch_output          torch.nn.functional.scaled_dot_product_attention on them (BF16 or F16)
  torch_output_f32      the same on the same values converted to float32 (F32): the stricter bar
                        of the FlashAttention rule, 2x PyTorch float32's error (+1e-6)
  output_f64            the same attention in float64 (F64)
  metadata: dtype, causal (none | bottom_right) and how to regenerate.

    python3 scripts/goldens/make_decode_goldens.py     (needs torch)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical_writer import save_canonical  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "goldens", "decode")

CASES = {
    # name: (B, Hq, Hkv, L, S, d, dtype, bottom-right causal)
    "bf16_one_row_gqa": (2, 8, 2, 1, 200, 32, torch.bfloat16, False),
    "f16_one_row_gqa": (2, 8, 2, 1, 200, 32, torch.float16, False),
    "bf16_four_rows_causal": (1, 4, 4, 4, 260, 32, torch.bfloat16, True),
    "f16_four_rows_causal": (1, 4, 4, 4, 260, 32, torch.float16, True),
    "bf16_mqa_long": (1, 8, 1, 1, 1100, 16, torch.bfloat16, False),
}


def attention(q, k, v, causal):
    mask = None
    if causal:  # bottom-right: query i sees keys j <= i + (S - L)
        L, S = q.shape[-2], k.shape[-2]
        mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(2)
    for name, (B, Hq, Hkv, L, S, d, dtype, causal) in CASES.items():
        gen = torch.Generator().manual_seed(len(name) * 1000 + S)
        q = torch.randn(B, Hq, L, d, generator=gen).to(dtype)
        k = torch.randn(B, Hkv, S, d, generator=gen).to(dtype)
        v = torch.randn(B, Hkv, S, d, generator=gen).to(dtype)
        out = attention(q, k, v, causal)
        out32 = attention(q.float(), k.float(), v.float(), causal)
        ref = attention(q.double(), k.double(), v.double(), causal)
        err = (out.double() - ref).abs().max().item()
        meta = {"dtype": str(dtype).replace("torch.", ""), "causal": "bottom_right" if causal else "none",
                "torch": torch.__version__, "torch_error": repr(err),
                "regenerate": "python3 scripts/goldens/make_decode_goldens.py"}
        save_canonical({"query": q, "key": k, "value": v, "torch_output": out, "torch_output_f32": out32,
                        "output_f64": ref},
                       os.path.join(OUT, name + ".safetensors"), meta)
        print(f"{name}: torch {meta['dtype']} error against float64 {err:.3g}")


if __name__ == "__main__":
    main()
