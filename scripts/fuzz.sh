#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, in build-fuzz/)
# and runs each for FUZZ_SECONDS, then prints per target the executions, coverage, corpus size
# and findings. Exits non-zero if any target found something.
#
#   scripts/fuzz.sh [target...]     default: every target (fuzz/CMakeLists.txt, MHA_FUZZ_TARGETS)
#   FUZZ_SECONDS=600                seconds per target
#   FUZZ_JOBS=1                     targets run at the same time (each uses one core)
#   FUZZ_KEEP_GOING=0               1: run on after a finding (libFuzzer's fork mode), to collect
#                                   every distinct finding of a campaign at once
#   FUZZ_BUILD_DIR=build-fuzz       build directory; it also keeps what the runs learn:
#     <build>/corpus/<target>/      the working corpus (grows run after run; the seeds in
#                                   fuzz/corpus/<target>/ are read, never written)
#     <build>/findings/<target>/    crash-*, leak-*, timeout-*, oom-* inputs (replay one with
#                                   <build>/fuzz/fuzz_<target> <file>)
#     <build>/logs/<target>.log     libFuzzer's output
#
# By default a finding stops its target: fix it, turn the input into a unit test (and keep it as
# fuzz/corpus/<target>/crash-<what> so ctest replays it), run again.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-600}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-1}
all_targets=$(sed -n 's/^set(MHA_FUZZ_TARGETS \(.*\))$/\1/p' fuzz/CMakeLists.txt)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || read -r -a targets <<<"$all_targets"

# clang with libFuzzer and the sanitizer runtimes (libclang-rt-dev), and clang's OpenMP.
./scripts/install_deps.sh clang libclang-rt-dev libomp-dev

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS=-gline-tables-only -DMHA_FUZZ=ON -DMHA_BUILD_TESTS=OFF -DMHA_BUILD_TOOLS=OFF \
  -DMHA_BUILD_EXAMPLES=OFF -DMHA_INSTALL=OFF >/dev/null
cmake --build "$build" -j"${FUZZ_BUILD_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"

run_target() {
  local target=$1
  mkdir -p "$build/corpus/$target" "$build/findings/$target" "$build/logs"
  local dict=() keep_going=()
  [[ -f fuzz/$target.dict ]] && dict=(-dict="fuzz/$target.dict")
  [[ ${FUZZ_KEEP_GOING:-0} == 1 ]] && keep_going=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  # One thread each: targets run side by side, and OpenMP's thread pool would only contend.
  # -timeout: one input running 30 s is a hang. -rss_limit_mb (also the largest single
  # allocation): a bounded reader never needs 2 GB.
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    "$build/fuzz/fuzz_$target" "$build/corpus/$target" "fuzz/corpus/$target" "${dict[@]}" "${keep_going[@]}" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$target/" >"$build/logs/$target.log" 2>&1 || true
}

echo "fuzz: ${targets[*]}, ${seconds} s each, $jobs at a time (logs in $build/logs/)"
running=0
for target in "${targets[@]}"; do
  run_target "$target" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

status=0
printf '%-24s %12s %10s %8s %8s %8s %s\n' target executions exec/s cov ft corpus findings
for target in "${targets[@]}"; do
  log=$build/logs/$target.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  if [[ -z $execs ]]; then  # fork mode: "#<execs>: cov: .. ft: .. corp: .. exec/s <rate> .."
    execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
    rate=$(sed -n 's/.*exec\/s:\{0,1\} *\([0-9]*\).*/\1/p' <<<"$last")
  fi
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(find "$build/corpus/$target" -type f | wc -l)
  findings=$(find "$build/findings/$target" -type f | wc -l)
  printf '%-24s %12s %10s %8s %8s %8s %s\n' "$target" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corpus" \
    "$findings"
  if [[ $findings -gt 0 ]] || ! grep -qE '^Done [0-9]+ runs|^INFO: fuzzed for [0-9]+ seconds' "$log"; then
    status=1
    find "$build/findings/$target" -type f | sed 's/^/  finding: /'
    grep -m1 -E 'ERROR|FUZZ FINDING|runtime error' "$log" | sed 's/^/  /' || true
  fi
done
exit $status
