#!/usr/bin/env bash
# `make test-arm64`: mha cross-built for 64-bit Arm Linux with Debian's cross compiler and the
# arm64 libraries installed beside the host's (multiarch), and its core tests (core, attention, nn,
# models) run under qemu-user, once for each Highway target compiled for arm64 with MHA_CPU_TARGET
# set to it (a ceiling: that target, or what the CPU qemu emulates has below it). The x86 parts
# (AMX, libxsmm, VDPBF16PS) are not built there: bfloat16 runs on the float32 path.
#
# The tests whose budget is PyTorch's error on the machine that runs them (golden tests, which
# read build/peers: tests/goldens/README.md) cannot run: there is no PyTorch for this emulated CPU
# here. The arm64 build looks for its peers in a folder that does not exist, so each such test
# fails at load_peer with "... is missing"; a run passes when every failure is that one, and those
# tests are counted apart. Every other test holds as on x86: against the reference in double
# computed in the same process, or a bound derived by hand.
#
# Installs what is missing (apt-get: g++-aarch64-linux-gnu, qemu-user, the arm64 -dev packages;
# `dpkg --add-architecture arm64` first), as root or through sudo. BUILD_ARM64 (default build-arm64)
# is the build folder, JOBS the parallel jobs, ARM64_TESTS the test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_ARM64:-build-arm64}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
TESTS=${ARM64_TESTS:-test_core test_attention test_nn test_models}
start=$(date +%s)

packages=(g++-aarch64-linux-gnu qemu-user nlohmann-json3-dev libopenblas-openmp-dev:arm64 libhwy-dev:arm64
          libsleef-dev:arm64 libutf8proc-dev:arm64 libicu-dev:arm64 libpng-dev:arm64 zlib1g-dev:arm64
          libgtest-dev:arm64)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -qx "install ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  echo "test_arm64: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then "${sudo[@]}" dpkg --add-architecture arm64; fi
  "${sudo[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi
./scripts/install_model.sh  # the models tests read all-MiniLM-L6-v2's files

cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMHA_MPI=OFF -DMHA_BUILD_TOOLS=OFF -DMHA_BUILD_EXAMPLES=OFF -DMHA_INSTALL=OFF \
  -DMHA_PEERS_DIR="$PWD/$BUILD/no-peers-for-this-cpu" >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$JOBS" --target $TESTS
built=$(date +%s)

# The emulated CPU: a Neoverse N1 (AWS Graviton2, Ampere Altra): NEON, no SVE, so OpenBLAS runs
# its NEON kernels too. One thread: Debian 12's qemu-user (7.2) hangs creating any thread on this
# machine (a program that only starts and joins a std::thread never returns), so OpenMP runs one
# thread (OMP_NUM_THREADS=1; OMP_THREAD_LIMIT=1 instead leaves OpenBLAS's OpenMP build spinning
# for a second thread it was promised), and the tests that set a thread count or start a thread or
# a process of their own are left out: found in the sources (a TEST whose body calls
# on_thread_counts, omp_set_num_threads or std::thread), and the death test that writes past a
# file size limit in a child.
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu QEMU_CPU=${QEMU_CPU:-neoverse-n1} OMP_NUM_THREADS=1
EXCLUDED=$(python3 - <<'PY'
import glob, re
names = ["*AFileSizeLimitGivesFileTooLargeAndLeavesNothing*"]
for path in sorted(glob.glob("tests/*/*.cpp")):
    source = open(path).read()
    tests = list(re.finditer(r"^TEST(?:_F|_P)?\((\w+),\s*(\w+)\)", source, re.M))
    for n, test in enumerate(tests):
        body = source[test.end():tests[n + 1].start() if n + 1 < len(tests) else len(source)]
        if re.search(r"on_thread_counts|omp_set_num_threads|std::thread", body):
            names.append(f"*{test.group(1)}.{test.group(2)}*")
print(":".join(names))
PY
)
echo "test_arm64: left out (threads or a child process): $(tr ':' '\n' <<<"$EXCLUDED" | wc -l) tests"
mkdir -p "$BUILD/results"
# The targets compiled in, as mha lists them (MHA_CPU_TARGET's own message names them).
targets=$(bash -c 'MHA_CPU_TARGET=list qemu-aarch64 "$0" --gtest_list_tests 2>&1; true' "$BUILD/tests/test_core" 2>/dev/null |
            sed -n 's/.*compiled in (\(.*\)), got.*/\1/p' | tr -d ',')
[[ -n "$targets" ]] || { echo "test_arm64: the test binary named no targets (does qemu-aarch64 run it?)" >&2; exit 1; }
echo "test_arm64: Highway targets compiled for arm64: $targets"

# Every test in a qemu process of its own, JOBS at a time, each within TEST_TIMEOUT seconds (a
# test this qemu cannot finish is reported as such, not waited on): passed, skipped, a golden test
# without its peer (its one failure is load_peer's "... is missing"), or failed / timed out.
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
one_test() {  # binary target test
  local out="$BUILD/results/$2/$1/${3//\//_}.log" status=0
  MHA_CPU_TARGET="$2" timeout "$TEST_TIMEOUT" qemu-aarch64 "$BUILD/tests/$1" --gtest_filter="$3" >"$out" 2>&1 || status=$?
  if [[ $status -eq 0 ]] && grep -q '^\[  SKIPPED \] 1 test' "$out"; then echo "skipped $3"
  elif [[ $status -eq 0 ]]; then echo "passed $3"
  elif [[ $status -eq 124 ]]; then echo "timeout $3"
  elif grep -q 'load_peer: .* is missing' "$out" && [[ $(grep -c 'Failure$' "$out") -eq $(grep -c 'load_peer: .* is missing' "$out") ]]; then
    echo "golden $3"
  else echo "failed $3"; fi
}
export -f one_test
export BUILD TEST_TIMEOUT
status=0
for target in $targets; do
  for binary in $TESTS; do
    t0=$(date +%s)
    mkdir -p "$BUILD/results/$target/$binary"
    qemu-aarch64 "$BUILD/tests/$binary" --gtest_list_tests --gtest_filter="-$EXCLUDED" 2>/dev/null |
      awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }' |
      xargs -P "$JOBS" -I{} bash -c 'one_test "$0" "$1" "$2"' "$binary" "$target" {} >"$BUILD/results/$target/$binary.txt"
    summary=$(cut -d' ' -f1 "$BUILD/results/$target/$binary.txt" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')
    echo "test_arm64: $binary on $target: ${summary%, } ($(( $(date +%s) - t0 )) s)"
    if grep -Eq '^(failed|timeout) ' "$BUILD/results/$target/$binary.txt"; then
      grep -E '^(failed|timeout) ' "$BUILD/results/$target/$binary.txt" | sed 's/^/  /'
      status=1
    fi
  done
done
echo "test_arm64: built in $((built - start)) s, tests in $(( $(date +%s) - built )) s"
exit $status
