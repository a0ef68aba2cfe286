#!/usr/bin/env python3
"""Generate the PyTorch goldens for the basic nn layers (tests/nn/test_layer_goldens.cpp).

    python3 scripts/goldens/make_layer_goldens.py              # writes tests/goldens/layers/*.safetensors
    python3 scripts/goldens/make_layer_goldens.py --out DIR    # write somewhere else

One file per layer: linear, layer_norm, embedding, gelu, relu. Each holds several cases; every
tensor name is "<case>.<tensor>":

    <case>.input          the input (F64; for embedding: I64 indices)
    <case>.weight         parameters, when the layer has them (F64)
    <case>.bias
    <case>.grad_output    the upstream gradient (F64); loss = sum(output * grad_output)
    <case>.output         PyTorch's float64 results: the reference
    <case>.grad_input     (not for embedding: indices have no gradient)
    <case>.grad_weight    (parameters only)
    <case>.grad_bias
    <case>.torch_f32.<x>  the same results computed by PyTorch in float32 (F32): they set the
                          error budget for mha's float32 results (tests/goldens/README.md rule)

Inputs and parameters are drawn in float32 and stored as float64, so a float32 run sees exactly
the same values. Metadata (all strings): "cases" (comma-separated, in order), the per-case
configuration ("<case>.normalized_shape" like "3,4", "<case>.eps", "<case>.elementwise_affine",
"<case>.bias", "<case>.padding_idx" ("none" or an integer), "<case>.approximate"), and
"layer", "regenerate", "torch_version".

Deterministic: each case has its own generator seeded from its name, PyTorch runs
single-threaded, and the metadata is written in sorted key order, so a re-run gives byte-identical
files.
"""
from __future__ import annotations

import argparse
import os
import zlib

import torch
import torch.nn.functional as F
from canonical_writer import save_canonical  # same file canonicalisation as the attention goldens

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "goldens", "layers")
# The command the committed files record (the script's earlier place; tests/goldens/README.md).
REGENERATE = "python3 scripts/make_layer_goldens.py"


def case_generator(layer: str, case: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"layers/{layer}/{case}".encode()) + 7)
    return g


def randn(g, *shape, scale=1.0, offset=0.0):
    """float32 values (so float32 and float64 runs see the same numbers)."""
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale + offset).to(torch.float32)


def run(forward, leaves: dict, grad_output: torch.Tensor, dtype) -> dict:
    """Run forward on copies of the float leaves in `dtype`; return output and grad_<leaf>."""
    inputs = {}
    for name, t in leaves.items():
        if t.is_floating_point():
            inputs[name] = t.detach().to(dtype).requires_grad_(True)
        else:
            inputs[name] = t
    out = forward(**inputs)
    (out * grad_output.to(dtype)).sum().backward()
    result = {"output": out.detach()}
    for name, t in inputs.items():
        if t.is_floating_point():
            result["grad_" + name] = t.grad.detach()
    return result


class LayerFile:
    def __init__(self, layer: str):
        self.layer = layer
        self.tensors: dict = {}
        self.metadata: dict = {"layer": layer, "regenerate": REGENERATE,
                               "torch_version": torch.__version__}
        self.cases: list = []

    def add(self, case: str, forward, leaves: dict, grad_output: torch.Tensor, config: dict):
        assert case not in self.cases and "." not in case
        self.cases.append(case)
        for k, v in config.items():
            self.metadata[f"{case}.{k}"] = str(v)
        for name, t in leaves.items():
            self.tensors[f"{case}.{name}"] = t.to(torch.float64) if t.is_floating_point() else t
        self.tensors[f"{case}.grad_output"] = grad_output.to(torch.float64)
        f64 = run(forward, leaves, grad_output, torch.float64)
        f32 = run(forward, leaves, grad_output, torch.float32)
        for name, t in f64.items():
            assert torch.isfinite(t).all(), (self.layer, case, name)
            self.tensors[f"{case}.{name}"] = t
        for name, t in f32.items():
            self.tensors[f"{case}.torch_f32.{name}"] = t.to(torch.float32)

    def save(self, out_dir: str) -> str:
        self.metadata["cases"] = ",".join(self.cases)
        path = os.path.join(out_dir, f"{self.layer}.safetensors")
        save_canonical(self.tensors, path, self.metadata)
        return path


def linear_file() -> LayerFile:
    f = LayerFile("linear")
    cases = [  # name, input shape, in, out, bias
        ("rank1", (5,), 5, 3, True),
        ("rank2", (4, 6), 6, 2, True),
        ("rank3_no_bias", (2, 3, 4), 4, 5, False),
        ("rank4", (2, 1, 3, 4), 4, 7, True),
        ("in1_out1", (3, 1), 1, 1, True),
    ]
    for name, shape, fin, fout, bias in cases:
        g = case_generator("linear", name)
        bound = 1.0 / fin ** 0.5
        leaves = {"input": randn(g, *shape),
                  "weight": (torch.rand(fout, fin, generator=g) * 2 - 1) * bound}
        if bias:
            leaves["bias"] = (torch.rand(fout, generator=g) * 2 - 1) * bound
        grad_output = randn(g, *shape[:-1], fout)
        f.add(name, lambda input, weight, bias=None: F.linear(input, weight, bias), leaves,
              grad_output, {"bias": "true" if bias else "false"})
    return f


def layer_norm_file() -> LayerFile:
    f = LayerFile("layer_norm")
    cases = [  # name, input shape, normalized_shape, eps, elementwise_affine, bias, offset
        ("last_dim", (3, 5), (5,), 1e-5, True, True, 0.0),
        ("rank1", (6,), (6,), 1e-5, True, True, 0.0),
        ("two_dims", (2, 3, 4), (3, 4), 1e-5, True, True, 0.0),
        ("no_bias", (4, 6), (6,), 1e-5, True, False, 0.0),
        ("no_affine", (2, 2, 7), (7,), 1e-5, False, False, 0.0),
        ("offset_eps", (3, 8), (8,), 1e-3, True, True, 50.0),
    ]
    for name, shape, norm, eps, affine, bias, offset in cases:
        g = case_generator("layer_norm", name)
        leaves = {"input": randn(g, *shape, scale=2.0, offset=offset)}
        if affine:
            leaves["weight"] = randn(g, *norm, scale=0.5, offset=1.0)
            if bias:
                leaves["bias"] = randn(g, *norm, scale=0.5)
        grad_output = randn(g, *shape)

        def forward(input, weight=None, bias=None, norm=norm, eps=eps):
            return F.layer_norm(input, norm, weight, bias, eps)

        f.add(name, forward, leaves, grad_output,
              {"normalized_shape": ",".join(map(str, norm)), "eps": repr(eps),
               "elementwise_affine": "true" if affine else "false",
               "bias": "true" if bias else "false"})
    return f


def embedding_file() -> LayerFile:
    f = LayerFile("embedding")
    cases = [  # name, num, dim, indices shape, padding_idx
        ("basic", 10, 4, (2, 3), None),
        ("padding", 7, 3, (4, 5), 2),
        ("negative_padding", 5, 2, (6,), -1),
        ("scalar_index", 4, 3, (), None),
    ]
    for name, num, dim, shape, pad in cases:
        g = case_generator("embedding", name)
        weight = randn(g, num, dim)
        if pad is not None:
            weight[pad] = 0  # as torch.nn.Embedding initialises it
        indices = torch.randint(0, num, shape, generator=g, dtype=torch.int64)
        if pad is not None and indices.numel() > 3:
            indices.view(-1)[::3] = pad % num  # the padding row is looked up several times
        grad_output = randn(g, *shape, dim)

        def forward(input, weight, pad=pad):
            return F.embedding(input, weight, padding_idx=pad)

        f.add(name, forward, {"input": indices, "weight": weight}, grad_output,
              {"padding_idx": "none" if pad is None else str(pad)})
    return f


def gelu_file() -> LayerFile:
    f = LayerFile("gelu")
    for approximate in ("none", "tanh"):
        for name, shape in (("rank1", (9,)), ("rank3", (2, 3, 5))):
            case = f"{approximate}_{name}"
            g = case_generator("gelu", case)
            x = randn(g, *shape, scale=2.5)
            if name == "rank1":  # the tails and zero
                x[:5] = torch.tensor([-9.0, -5.5, 0.0, 5.5, 9.0])
            grad_output = randn(g, *shape)
            f.add(case, lambda input, a=approximate: F.gelu(input, approximate=a),
                  {"input": x}, grad_output, {"approximate": approximate})
    return f


def relu_file() -> LayerFile:
    f = LayerFile("relu")
    for name, shape in (("rank1", (8,)), ("rank3", (2, 3, 4))):
        g = case_generator("relu", name)
        x = randn(g, *shape)
        x.view(-1)[::4] = 0.0  # exact zeros: PyTorch's gradient there is 0
        grad_output = randn(g, *shape)
        f.add(name, lambda input: F.relu(input), {"input": x}, grad_output, {})
    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for make in (linear_file, layer_norm_file, embedding_file, gelu_file, relu_file):
        path = make().save(args.out)
        print(os.path.relpath(path, REPO_ROOT))


if __name__ == "__main__":
    main()
