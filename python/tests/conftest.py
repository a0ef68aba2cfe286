"""Shared by the tests: the golden cases of tests/goldens/sdpa and the acceptance rule of
tests/goldens/README.md (the same as tests/support/golden.h), with numpy only. The peer's results
(PyTorch in float32, whose error is the budget) are this machine's: load_peer."""
import json
import os
import re
import pathlib
import struct

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "tests" / "goldens"
# scripts/goldens/peers_here.py's output (`make peers`; the ctest fixture goldens.peers).
PEERS = pathlib.Path(os.environ.get("MHA_PEERS_DIR", ROOT / "build" / "peers"))
SDPA_CASES = sorted(p.name for p in (GOLDENS / "sdpa").iterdir() if p.is_dir())
# The score variants, written by the anchors' own code (scripts/goldens/make_variant_goldens.py).
VARIANT_CASES = sorted(p.name for p in (GOLDENS / "variants").iterdir() if p.is_dir())

_DTYPES = {"F32": np.float32, "F64": np.float64, "BOOL": np.bool_, "U8": np.uint8, "I32": np.int32, "I64": np.int64}


def load_safetensors(path):
    """(tensors, metadata) of a .safetensors file: an 8-byte little-endian header size, a JSON
    header, then the tensors' bytes (the format the goldens are written in)."""
    data = pathlib.Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    metadata = header.pop("__metadata__", {})
    body = data[8 + size:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(body[begin:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return tensors, metadata


def load_peer(golden):
    """The peer's tensors of golden file `golden` (a path under tests/goldens) as PyTorch computed
    them on this machine from the committed inputs: the same relative path under PEERS."""
    path = PEERS / pathlib.Path(golden).resolve().relative_to(GOLDENS)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make peers` (scripts/goldens/peers_here.py {PEERS})")
    return load_safetensors(path)[0]


def load_case(name, kind="sdpa"):
    folder = GOLDENS / kind / name
    inputs, metadata = load_safetensors(folder / "inputs.safetensors")
    expected, _ = load_safetensors(folder / "expected_f64.safetensors")
    return inputs, metadata, expected, load_peer(folder / "torch_f32.safetensors")


def max_abs_diff(a, b):
    d = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    return np.inf if np.isnan(d).any() else (float(d.max()) if d.size else 0.0)


def assert_flash_rule(ours, expected_f64, torch_f32, what):
    """float32: max|ours − f64| ≤ 2·max|torch_f32 − f64| + 1e-6·max|f64| (FlashAttention's rule)."""
    assert ours.shape == expected_f64.shape, f"{what}: shape {ours.shape}, expected {expected_f64.shape}"
    error = max_abs_diff(ours, expected_f64)
    torch_error = max_abs_diff(torch_f32, expected_f64)
    scale = float(np.abs(expected_f64).max()) if expected_f64.size else 0.0
    bound = 2 * torch_error + 1e-6 * scale
    assert error <= bound, f"{what}: mha error {error} > bound {bound} (PyTorch float32 error {torch_error})"


def assert_close_f64(ours, expected_f64, what, tolerance=1e-10):
    """float64: max|ours − f64| ≤ tolerance·max(1, max|f64|) (the C++ golden test's bound)."""
    assert ours.shape == expected_f64.shape, f"{what}: shape {ours.shape}, expected {expected_f64.shape}"
    scale = max(1.0, float(np.abs(expected_f64).max()) if expected_f64.size else 0.0)
    error = max_abs_diff(ours, expected_f64)
    assert error <= tolerance * scale, f"{what}: float64 error {error} > {tolerance * scale}"


# The binding's parameters in order (python/src/bindings.cpp); mha calls it positionally. "views"
# is Options' typed views in the binding's order (_mha.views()), recorded by their names too.
_BINDING_PARAMETERS = {
    "sdpa_forward": ("query", "key", "value", "output", "logsumexp", "scoring", "views", "num_threads", "weights"),
    "sdpa_backward": ("query", "key", "value", "output", "logsumexp", "grad_output", "grad_query", "grad_key",
                      "grad_value", "scoring", "views", "num_threads", "grad_sinks"),
}


@pytest.fixture
def binding_spy(monkeypatch):
    """Records (name, {parameter: argument}) for each binding call: the memory mha reads and writes,
    each view under its own name."""
    from mha import _mha
    calls = []
    view_names = [name for name, _ in _mha.views()]
    for name, parameters in _BINDING_PARAMETERS.items():
        real = getattr(_mha, name)
        # The order is the binding's own: its signature (first line of the docstring) names them.
        signature = real.__doc__.splitlines()[0]
        assert [p for p in re.findall(r"(\w+): ", signature) if p in parameters] == list(parameters), signature

        def spy(*arguments, real=real, name=name, parameters=parameters):
            assert len(arguments) == len(parameters), name
            recorded = dict(zip(parameters, arguments))
            assert len(recorded["views"]) == len(view_names), name
            recorded.update(zip(view_names, recorded["views"]))
            calls.append((name, recorded))
            return real(*arguments)
        monkeypatch.setattr(_mha, name, spy)
    return calls
