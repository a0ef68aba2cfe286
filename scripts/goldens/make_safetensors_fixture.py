#!/usr/bin/env python3
"""Writes tests/core/fixtures/python_written.safetensors with the official `safetensors` package.

tests/core/safetensors_test.cpp reads the file (CI has no Python, so the output is committed) and
checks every value listed here. Tensor names are chosen so that name order equals the writer's
layout order (descending dtype, then name), which lets the test also compare mha's serializer
byte for byte. One metadata entry only: the writer stores metadata in a hash map, so several
entries would come out in an arbitrary order.

Run from the repository root:  python3 scripts/goldens/make_safetensors_fixture.py
"""
import math
import pathlib

import torch
from safetensors.torch import save_file

OUTPUT = pathlib.Path(__file__).resolve().parents[2] / "tests/core/fixtures/python_written.safetensors"

TENSORS = {
    "a_i64": torch.tensor([-3, 0, 2**53 + 1, -(2**63), 2**63 - 1], dtype=torch.int64),
    "b_f64": torch.tensor([[1.0, -2.5], [1e-300, math.pi]], dtype=torch.float64),
    "c_f32": torch.tensor([[0.0, 1.5, -2.25], [3.0e38, 2.0**-149, -1.0]], dtype=torch.float32),
    "c_scalar": torch.tensor(7.5, dtype=torch.float32),
    "c_zero": torch.zeros((0, 3), dtype=torch.float32),
    "d_i32": torch.tensor([-(2**31), -1, 0, 2**31 - 1], dtype=torch.int32),
    "e_bf16": torch.tensor([1.0, -2.5, 3.140625, math.inf], dtype=torch.bfloat16),
    "f_f16": torch.tensor([[1.0, -2.5, 65504.0], [2.0**-24, -math.inf, math.nan]], dtype=torch.float16),
    "g_bool": torch.tensor([[True, False], [False, True]], dtype=torch.bool),
}
# The path this script had when the committed fixture was written; safetensors_test.cpp checks it.
METADATA = {"source": "scripts/make_safetensors_fixture.py"}


def main() -> None:
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(TENSORS, str(OUTPUT), metadata=METADATA)
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
