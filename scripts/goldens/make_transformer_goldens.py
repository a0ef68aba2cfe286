#!/usr/bin/env python3
"""Goldens for mha::nn::TransformerEncoderLayer / TransformerEncoder: PyTorch's modules, in float64
and float32, output and every gradient (src and each parameter by its state_dict name).

One file per case, tests/goldens/transformer/<case>.safetensors:
  src, grad_output, [src_mask], [src_key_padding_mask]   inputs (float64; bool masks as BOOL)
  param.<name>                    the module's state_dict (float64)
  output_f64, grad.src_f64, grad.<name>_f64              PyTorch in float64
  output_f32, grad.src_f32, grad.<name>_f32              PyTorch in float32 (same weights, rounded)
  output_bf16, grad.src_bf16, grad.<name>_bf16           PyTorch in bfloat16 (same weights and inputs
                                                         rounded), stored widened to F32: the bar of
                                                         mha's bfloat16 layers
  metadata: the options (d_model, nhead, dim_feedforward, activation, layer_norm_eps, batch_first,
  norm_first, bias, is_causal, num_layers, final_norm) and how to regenerate.

The modules run in training mode with dropout 0: PyTorch's math path. (In eval mode PyTorch may
take its fused "fast path", torch._transformer_encoder_layer_fwd, and TransformerEncoder turns a
padded batch into a nested tensor, whose padded positions come out as 0: see docs/transformer.md.)

    python3 scripts/goldens/make_transformer_goldens.py     (needs torch)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical_writer import save_canonical  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.environ.get("MHA_GOLDENS_OUT", os.path.join(ROOT, "tests", "goldens", "transformer"))

SIZE = (16, 4, 24, 2, 6)  # d_model, nhead, dim_feedforward, batch, sequence (unless a case says)

CASES = {
    # name: options
    "relu_post": dict(),
    "gelu_post_batch_first_padding_bool": dict(activation="gelu", batch_first=True, kpm="bool"),
    "relu_pre_src_mask_float": dict(norm_first=True, src_mask="float"),
    "gelu_pre_no_bias_padding_float": dict(activation="gelu", norm_first=True, bias=False, batch_first=True,
                                           kpm="float"),
    "unbatched_masks": dict(unbatched=True, src_mask="bool", kpm="bool"),
    "causal": dict(activation="gelu", batch_first=True, src_mask="causal", is_causal=True),
    "per_head_src_mask_eps": dict(src_mask="bool3d", layer_norm_eps=1e-3),
    "encoder_two_layers_final_norm": dict(activation="gelu", batch_first=True, kpm="bool", num_layers=2,
                                          final_norm=True),
    "encoder_two_layers_pre_norm": dict(norm_first=True, src_mask="float", num_layers=2),
    # Wider (d_model 64, 24 tokens): the bfloat16 bar is a max over more elements than at 16 wide.
    "wide_gelu_post_padding": dict(size=(64, 4, 128, 2, 24), activation="gelu", batch_first=True, kpm="bool"),
    "wide_relu_pre_causal": dict(size=(64, 4, 128, 2, 24), norm_first=True, batch_first=True, src_mask="causal",
                                 is_causal=True),
}


def make(name, o, gen):
    E, H, FF, N, S = o.get("size", SIZE)
    act = o.get("activation", "relu")
    layer = torch.nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=act,
                                             layer_norm_eps=o.get("layer_norm_eps", 1e-5),
                                             batch_first=o.get("batch_first", False),
                                             norm_first=o.get("norm_first", False), bias=o.get("bias", True))
    num_layers = o.get("num_layers", 0)
    if num_layers:
        norm = torch.nn.LayerNorm(E, eps=o.get("layer_norm_eps", 1e-5)) if o.get("final_norm") else None
        module = torch.nn.TransformerEncoder(layer, num_layers, norm=norm, enable_nested_tensor=False)
    else:
        module = layer
    # Every parameter random (norms and biases too), and the layers of an encoder distinct.
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)
    module = module.double().train()
    unbatched = o.get("unbatched", False)
    shape = (S, E) if unbatched else ((N, S, E) if o.get("batch_first") else (S, N, E))
    src = torch.randn(shape, generator=gen, dtype=torch.float64)
    grad_output = torch.randn(shape, generator=gen, dtype=torch.float64)
    kwargs, tensors = {}, {}
    kind = o.get("src_mask")
    if kind == "bool":
        m = torch.rand(S, S, generator=gen) < 0.3
        m.fill_diagonal_(False)  # no row fully masked
        kwargs["src_mask"] = m
    elif kind == "float":
        kwargs["src_mask"] = torch.randn(S, S, generator=gen, dtype=torch.float64)
    elif kind == "causal":
        kwargs["src_mask"] = torch.nn.Transformer.generate_square_subsequent_mask(S, dtype=torch.float64)
    elif kind == "bool3d":
        m = torch.rand(N * H, S, S, generator=gen) < 0.3
        for i in range(N * H):
            m[i].fill_diagonal_(False)
        kwargs["src_mask"] = m
    kpm = o.get("kpm")
    if kpm:
        pad = torch.zeros(S if unbatched else (N, S), dtype=torch.bool)
        if unbatched:
            pad[-2:] = True
        else:
            pad[1, -2:] = True
        kwargs["src_key_padding_mask"] = pad if kpm == "bool" else torch.zeros(pad.shape, dtype=torch.float64).masked_fill(pad, float("-inf"))
    if o.get("is_causal"):
        kwargs["is_causal"] = True
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            tensors[k] = v
    tensors["src"], tensors["grad_output"] = src, grad_output
    for pname, p in module.state_dict().items():
        tensors["param." + pname] = p.detach().clone()
    for suffix, dtype in (("f64", torch.float64), ("f32", torch.float32), ("bf16", torch.bfloat16)):
        m = module.to(dtype)
        x = src.to(dtype).requires_grad_()
        kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kwargs.items()}
        if num_layers and "src_mask" in kw:  # TransformerEncoder calls it `mask`
            kw["mask"] = kw.pop("src_mask")
        out = m(x, **kw)
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(out, [x] + list(params.values()), grad_output.to(dtype))
        stored = (lambda t: t.float()) if dtype == torch.bfloat16 else (lambda t: t)
        tensors["output_" + suffix] = stored(out.detach())
        tensors["grad.src_" + suffix] = stored(grads[0])
        for (pname, _), g in zip(params.items(), grads[1:]):
            tensors[f"grad.{pname}_{suffix}"] = stored(g)
    meta = {
        "regenerate": "python3 scripts/goldens/make_transformer_goldens.py",
        "d_model": str(E), "nhead": str(H), "dim_feedforward": str(FF), "activation": act,
        "layer_norm_eps": repr(o.get("layer_norm_eps", 1e-5)), "batch_first": str(o.get("batch_first", False)).lower(),
        "norm_first": str(o.get("norm_first", False)).lower(), "bias": str(o.get("bias", True)).lower(),
        "is_causal": str(o.get("is_causal", False)).lower(), "num_layers": str(num_layers),
        "final_norm": str(o.get("final_norm", False)).lower(), "torch": torch.__version__,
    }
    save_canonical({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, name + ".safetensors"), meta)


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(2024)
    for name, o in CASES.items():
        make(name, o, gen)
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()
