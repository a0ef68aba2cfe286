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
# machine (a program that only starts and joins a std::thread never returns), so OpenMP is held to
# one thread (OMP_THREAD_LIMIT=1: the tests that compare thread counts compare one thread with
# itself there), and the two tests that start a thread or a process of their own (a FIFO's reader; a
# child that writes past a file size limit, a death test) are left out.
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu QEMU_CPU=${QEMU_CPU:-neoverse-n1} OMP_THREAD_LIMIT=1
EXCLUDED="AtomicFileTargets.AFifoIsWrittenInPlace:*AFileSizeLimitGivesFileTooLargeAndLeavesNothing*"
# Each binary in JOBS shards (gtest's GTEST_TOTAL_SHARDS), one qemu process each, side by side:
# the emulated threads are one per process.
run() {  # binary, target
  for ((shard = 0; shard < JOBS; ++shard)); do
    GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$shard MHA_CPU_TARGET="$2" qemu-aarch64 "$BUILD/tests/$1" \
      --gtest_filter="-$EXCLUDED" --gtest_output="json:$BUILD/results/$1-$2-$shard.json" \
      >"$BUILD/results/$1-$2-$shard.log" 2>&1 &
  done
  wait || true
}
mkdir -p "$BUILD/results"
# The targets compiled in, as mha lists them (MHA_CPU_TARGET's own message names them).
targets=$(bash -c 'MHA_CPU_TARGET=list qemu-aarch64 "$0" --gtest_list_tests 2>&1; true' "$BUILD/tests/test_core" 2>/dev/null |
            sed -n 's/.*compiled in (\(.*\)), got.*/\1/p' | tr -d ',')
[[ -n "$targets" ]] || { echo "test_arm64: the test binary named no targets (does qemu-aarch64 run it?)" >&2; exit 1; }
echo "test_arm64: Highway targets compiled for arm64: $targets"
status=0
for target in $targets; do
  for binary in $TESTS; do
    t0=$(date +%s)
    run "$binary" "$target"
    python3 - "$BUILD/results" "$binary" "$target" "$JOBS" "$(( $(date +%s) - t0 ))" <<'PY' || status=1
import json, sys
results, binary, target, shards, seconds = sys.argv[1:]
suites = []
for shard in range(int(shards)):
    path = f"{results}/{binary}-{target}-{shard}.json"
    try:
        suites += json.load(open(path))["testsuites"]
    except (OSError, ValueError):
        print(f"test_arm64: {binary} on {target}: no report from shard {shard} (crashed?): see {path[:-5]}.log")
        sys.exit(1)
passed = skipped = peerless = 0
failed = []
for suite in suites:
    for test in suite["testsuite"]:
        if test.get("status") == "NOTRUN" or test.get("result") == "SUPPRESSED":
            continue  # another shard's, or disabled
        name = f"{suite['name']}.{test['name']}"
        failures = [f["failure"] for f in test.get("failures", [])]
        if not failures:
            skipped += test.get("result") == "SKIPPED"
            passed += test.get("result") != "SKIPPED"
        elif all("load_peer:" in f and "is missing" in f for f in failures):
            peerless += 1
        else:
            failed.append(name)
print(f"test_arm64: {binary} on {target}: {passed} passed, {skipped} skipped, {peerless} need PyTorch on this "
      f"CPU (golden), {len(failed)} failed ({seconds} s)")
for name in failed:
    print(f"  FAILED {name}")
sys.exit(1 if failed else 0)
PY
  done
done
echo "test_arm64: built in $((built - start)) s, tests in $(( $(date +%s) - built )) s"
exit $status
