#!/usr/bin/env python3
"""The peers' results on this machine: every golden generator run in peers mode.

    python3 scripts/goldens/peers_here.py DIR

A float32 test passes when mha's error against PyTorch's float64 result is at most twice
PyTorch's own float32 error (tests/goldens/README.md). PyTorch's float32 error depends on the CPU
it ran on (its kernels, and so its rounding, are chosen per instruction set), so the peer's
results are computed here, on the machine that runs the tests, from the committed inputs:
canonical_writer.py's peers mode writes only the peer's tensors, under DIR at the goldens'
relative paths, after checking every other tensor the generator drew against the committed
file. The float64 references stay the committed ones.

DIR/STAMP records what the results depend on (PyTorch's and the peers' versions, the CPU and
ATEN_CPU_CAPABILITY, the generators and the committed goldens); a run whose stamp matches does
nothing. DIR is replaced whole (built beside it, then renamed), so a reader never sees half of it.
The ctest fixture goldens.peers and python/tests/conftest.py run this script.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "tests" / "goldens"
SCRIPTS = ROOT / "scripts" / "goldens"
# Each generator of a golden family whose tests take a peer's error as their budget (the
# tokenizer's and the safetensors fixture's have no peer; the training twin's losses are compared
# within a fixed 1e-4, not a peer's error).
GENERATORS = ["make_goldens.py", "make_layer_goldens.py", "make_training_goldens.py", "make_transformer_goldens.py",
              "make_decode_goldens.py", "make_variant_goldens.py", "make_sentence_goldens.py"] + sorted(
    f"examples/{p.name}" for p in (SCRIPTS / "examples").glob("*.py") if p.name != "common.py")


def version(package: str) -> str:
    from importlib import metadata  # (the packages' own imports take seconds)

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def stamp() -> str:
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        cpu = "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "vendor_id"))}))
    digest = hashlib.sha256()
    for folder in (SCRIPTS, GOLDENS):
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    versions = [f"{p} {version(p)}" for p in ("torch", "transformers", "sentence-transformers", "safetensors")]
    return "\n".join(versions + [f"ATEN_CPU_CAPABILITY {os.environ.get('ATEN_CPU_CAPABILITY', '')}",
                                 f"inputs {digest.hexdigest()}", cpu]) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = pathlib.Path(sys.argv[1]).resolve()
    key = stamp()
    if (out / "STAMP").is_file() and (out / "STAMP").read_text() == key:
        print(f"peers_here: {out} is current")
        return 0
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    env = dict(os.environ, MHA_GOLDENS_PEERS=str(building))
    for generator in GENERATORS:
        print(f"peers_here: {generator}", flush=True)
        subprocess.run([sys.executable, str(SCRIPTS / generator)], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    (building / "STAMP").write_text(key)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    building.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    print(f"peers_here: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
