"""Shared by the PyTorch twins of the examples (one script per example in this folder).

A twin builds the example's model in PyTorch, gives it deterministic random weights, and calls
write_case(), which runs the model in float64 and in float32 on the same values and writes

    tests/goldens/examples/<case>/weights.safetensors       state_dict (F32), mha's names
    tests/goldens/examples/<case>/inputs.safetensors        optional inputs (F32 / I64 / BOOL)
    tests/goldens/examples/<case>/expected_f64.safetensors  results in float64; metadata
                                                            `program` and `args` say how to run
                                                            the example (see tests/examples)
    tests/goldens/examples/<case>/torch_f32.safetensors     the same results in float32

The example is run as `<program> <args> --weights W --inputs I --output O` and must write the
same tensor names as `expected_f64`.
"""
from __future__ import annotations

import copy
import os
import shutil
import sys
from typing import Callable, Dict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from canonical_writer import peers_dir, save_canonical  # noqa: E402  (same byte-stable writer as the other goldens)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
OUT_DIR = os.path.join(ROOT, "tests", "goldens", "examples")


def seeded(name: str) -> torch.Generator:
    """A generator seeded from the case name, so cases do not disturb each other."""
    return torch.Generator().manual_seed(sum(ord(c) * 31 ** i for i, c in enumerate(name)) % (2 ** 31))


def randomize_(module: torch.nn.Module, gen: torch.Generator, scale: float = 1.0) -> None:
    """Every parameter random (biases included, so no bias bug can hide): uniform(±scale·√(3/fan_in))."""
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else max(p.numel(), 1)
            bound = scale * (3.0 / fan_in) ** 0.5 if p.dim() > 1 else 0.5 * scale
            p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound)


def write_case(case: str, program: str, args: str, model: torch.nn.Module, inputs: Dict[str, torch.Tensor],
               run: Callable[[torch.nn.Module, Dict[str, torch.Tensor]], Dict[str, torch.Tensor]],
               description: str) -> None:
    """Runs `run(model, inputs)` in float64 and float32 and writes the four files.

    `inputs` holds float32 (or integer / bool) tensors; the float64 run gets them cast exactly.
    `run` returns the named results (outputs and, where the example does backward, gradients).
    """
    torch.set_num_threads(1)
    model = model.float().eval()
    results = {}
    for dtype in (torch.float64, torch.float32):
        m = copy.deepcopy(model).to(dtype)
        ins = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
        out = run(m, ins)
        for k, v in out.items():
            assert torch.isfinite(v).all(), f"{case}: {k} is not finite in {dtype}"
        results[dtype] = {k: v.detach().to(dtype).contiguous() for k, v in out.items()}
    folder = os.path.join(OUT_DIR, case)
    if not peers_dir():  # (peers mode writes under its own folder only: canonical_writer.py)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    # The command as the committed files record it: the script's earlier place (tests/goldens/README.md).
    meta = {"case": case, "description": description, "torch_version": torch.__version__,
            "regenerate": f"python3 scripts/example_goldens/{os.path.basename(sys.argv[0])}"}
    save_canonical({k: v.detach().float().contiguous() for k, v in model.state_dict().items()},
                   os.path.join(folder, "weights.safetensors"), meta)
    if inputs:
        save_canonical({k: v.contiguous() for k, v in inputs.items()}, os.path.join(folder, "inputs.safetensors"), meta)
    save_canonical(results[torch.float64], os.path.join(folder, "expected_f64.safetensors"),
                   {**meta, "program": program, "args": args, "dtype": "float64"})
    save_canonical(results[torch.float32], os.path.join(folder, "torch_f32.safetensors"),
                   {**meta, "program": program, "args": args, "dtype": "float32"})
    print(f"{case}: {', '.join(f'{k} {tuple(v.shape)}' for k, v in results[torch.float64].items())}")
