"""The byte-stable safetensors writer every golden generator uses, and its peers mode.

    from canonical_writer import save_canonical   # scripts in scripts/goldens/ (their own folder)

Scripts elsewhere put scripts/goldens on sys.path first (scripts/goldens/examples/common.py,
scripts/twin/train_twin.py). safetensors and torch are imported only when a file is written, so
the module imports without them.

Peers mode (MHA_GOLDENS_PEERS=DIR, set by peers_here.py): a generator run writes nothing under
tests/goldens. Of each file it would write there, the peer's results (PyTorch in float32 or a
half type: the tensors that set a float32 test's error budget, is_peer) go to the same relative
path under DIR, computed on this machine; every other tensor is checked against the committed
file (inputs bitwise, float64 results within 1e-10 of their scale), so that the peers are the
committed inputs' results.
"""
from __future__ import annotations

import json
import os
import re
import struct

GOLDENS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests",
                       "goldens")
_PEER_NAME = re.compile(r"(^|\.)torch_f32(\.|$)|_f32$|_bf16$|^torch_output")


def peers_dir():
    """DIR in peers mode, else None."""
    return os.environ.get("MHA_GOLDENS_PEERS") or None


def is_peer(path: str, name: str) -> bool:
    """Whether tensor `name` of golden file `path` is a peer's result: a whole torch_f32 file, or
    a name that says float32 or bfloat16 (`<case>.torch_f32.<name>`, `<name>_f32`, `<name>_bf16`)
    or decode's `torch_output*` (PyTorch in the cache's type and in float32)."""
    return os.path.basename(path) == "torch_f32.safetensors" or bool(_PEER_NAME.search(name))


def _bytes(t):
    import torch

    t = t.contiguous().reshape(-1)
    return t.to(torch.uint8) if t.dtype == torch.bool else t.view(torch.uint8)


def _save_peers(tensors: dict, path: str, metadata: dict, out: str) -> None:
    import torch
    from safetensors.torch import load_file

    rel = os.path.relpath(os.path.abspath(path), GOLDENS)
    if rel.startswith(".."):
        raise RuntimeError(f"peers mode: {path} is not under {GOLDENS} (run the generator with its default output)")
    committed = load_file(os.path.join(GOLDENS, rel))
    if sorted(committed) != sorted(tensors):
        raise RuntimeError(f"peers mode: {rel}: tensors {sorted(tensors)} differ from the committed {sorted(committed)}")
    peers = {}
    for name, t in tensors.items():
        if is_peer(path, name):
            peers[name] = t
            continue
        c, t = committed[name], t.detach().contiguous()
        same = c.dtype == t.dtype and c.shape == t.shape
        if same and t.dtype == torch.float64:
            finite = c[c.isfinite()]
            scale = max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
            same = bool(((t == c) | ((t - c).abs() <= 1e-10 * scale)).all())  # (an input's ±inf: equal)
        elif same:
            same = torch.equal(_bytes(t), _bytes(c))
        if not same:
            raise RuntimeError(f"peers mode: {rel}: tensor {name} differs from the committed golden on this machine "
                               "(the peers would not be the committed inputs' results)")
    if peers:
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write(peers, target, metadata)


def save_canonical(tensors: dict, path: str, metadata: dict) -> None:
    """safetensors.torch.save_file, then rewrite the header with the metadata keys sorted; in
    peers mode, the peer's tensors only, elsewhere (above)."""
    if peers_dir():
        return _save_peers(tensors, path, metadata, peers_dir())
    _write(tensors, path, metadata)


def _write(tensors: dict, path: str, metadata: dict) -> None:
    """safetensors (Rust) serialises the __metadata__ map in hash order, which changes from run to
    run; tensors are already in a fixed order. The rewritten header has the same length."""
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
