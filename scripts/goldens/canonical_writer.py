"""The byte-stable safetensors writer every golden generator uses.

    from canonical_writer import save_canonical   # scripts in scripts/goldens/ (their own folder)

Scripts elsewhere put scripts/goldens on sys.path first (scripts/goldens/examples/common.py,
scripts/twin/train_twin.py). safetensors and torch are imported only when a file is written, so
the module imports without them.
"""
from __future__ import annotations

import json
import struct


def save_canonical(tensors: dict, path: str, metadata: dict) -> None:
    """safetensors.torch.save_file, then rewrite the header with the metadata keys sorted.

    safetensors (Rust) serialises the __metadata__ map in hash order, which changes from run to
    run; tensors are already in a fixed order. The rewritten header has the same length.
    """
    from safetensors.torch import save_file

    for k, v in metadata.items():
        assert isinstance(k, str) and isinstance(v, str) and v.isascii(), (k, v)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, path, metadata=metadata)
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(text) <= n, "canonical header is longer than the original"
    text = text + b" " * (n - len(text))
    with open(path, "wb") as f:
        f.write(blob[:8] + text + blob[8 + n:])
