#!/usr/bin/env bash
# Checks the binary wheel `make wheel` repaired (DIR/mha-*manylinux*.whl, DIR default dist) the
# way a user without build tools would meet it: a fresh virtual environment that sees no system
# site-packages; pip install with --only-binary=:all: (the wheel and its dependencies, numpy and
# ml_dtypes, from binary wheels only: nothing is compiled); then, from outside the source tree,
#   - every shared library the module loads is the wheel's own (mha.libs/, bundled by auditwheel)
#     or one that a manylinux system provides (glibc's, libstdc++, libgcc_s);
#   - import mha, and mha.scaled_dot_product_attention on random inputs (GQA, causal and not)
#     against its definition, softmax(q kᵀ / √d) v, in float64 with numpy: within 1e-5 (float32
#     results of magnitude ~1, sums of 64 terms).
# Prints the wheel's size and the install's time.
set -euo pipefail
dir=${1:-dist}
shopt -s nullglob
wheels=("$dir"/mha-*manylinux*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
  echo "check_wheel: expected one mha-*manylinux*.whl in $dir, found ${#wheels[@]} (run make wheel)" >&2
  exit 1
fi
wheel=$(realpath "${wheels[0]}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
start=$(date +%s%N)
"$work/venv/bin/python" -m pip install -q --no-cache-dir --only-binary=:all: "$wheel"
end=$(date +%s%N)
awk -v name="$(basename "$wheel")" -v bytes="$(stat -c %s "$wheel")" -v ns="$((end - start))" 'BEGIN {
  printf "check_wheel: %s, %.1f MB; installed in %.1f s (pip, binary wheels only, numpy and ml_dtypes downloaded)\n", name, bytes / 1e6, ns / 1e9 }'
cd "$work"
"$work/venv/bin/python" - <<'PY'
import os
import re
import subprocess
import numpy as np
import mha
import mha._mha

module = mha._mha.__file__
bundled = os.path.realpath(os.path.join(os.path.dirname(module), "..", "mha.libs"))
system = re.compile(r"^(linux-vdso\.so|ld-linux[-\w]*\.so|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so)")
outside = []
for line in subprocess.run(["ldd", module], capture_output=True, text=True, check=True).stdout.splitlines():
    name, _, rest = line.strip().partition(" => ")
    path = rest.split(" (")[0].strip()
    if "not found" in rest:
        outside.append(line.strip())
    elif not system.match(os.path.basename(name.split(" (")[0])) and os.path.dirname(os.path.realpath(path)) != bundled:
        outside.append(line.strip())
if outside:
    raise SystemExit("check_wheel: the module loads libraries from outside the wheel:\n  " + "\n  ".join(outside))
print(f"check_wheel: every library the module loads is the wheel's own ({len(os.listdir(bundled))} in mha.libs) or the system's C and C++ runtime")

def reference(q, k, v, causal):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v

rng = np.random.default_rng(0)
q = rng.standard_normal((2, 8, 200, 64), dtype=np.float32)
k = rng.standard_normal((2, 2, 200, 64), dtype=np.float32)
v = rng.standard_normal((2, 2, 200, 64), dtype=np.float32)
for causal in (False, True):
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    error = float(np.abs(out - reference(q, k, v, causal)).max())
    if not error <= 1e-5:
        raise SystemExit(f"check_wheel: SDPA (causal={causal}) is {error:.3g} off its definition in float64")
    print(f"check_wheel: SDPA (2, 8, 200, 64), GQA 4, causal={causal}: {error:.2e} off its definition in float64")
PY
