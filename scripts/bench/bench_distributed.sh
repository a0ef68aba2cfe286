#!/usr/bin/env bash
# Context-parallel attention at scale on this machine (`make bench`; docs/distributed.md):
# `mha bench --context-parallel` under mpirun for P = 1, 2, 4 ranks (the cores shared: each rank
# gets max(1, cores / P) OpenMP threads), ring and ulysses at L = 16384 and 65536 with forward
# and backward, then the ring alone at L = 262144 (one head: the forward's L² work on two cores
# takes about half a minute) on 1 and 4 ranks. Prints each run's table; JSON under
# <build>/bench/distributed-*.json.
set -euo pipefail
usage="usage: bench_distributed.sh [build dir]"
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
  [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]] && { echo "$usage"; exit 0; }
  echo "bench_distributed: unexpected $*" >&2; echo "$usage" >&2; exit 2
fi
build="${1:-build}"
mha="$build/tools/mha/mha"
if [[ ! -x "$mha" ]]; then
  echo "bench_distributed: '$build' holds no build (tools/mha/mha): run \`make build\` first, or give the build folder" >&2
  exit 2
fi
cores=$(nproc)
# Open MPI: run as root in containers, more ranks than cores, ranks that yield when idle, no
# binding of a rank to one core.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
       OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
       OMPI_MCA_btl_vader_single_copy_mechanism=none
if ! command -v mpiexec >/dev/null; then
  echo "bench_distributed: no mpiexec (apt-get install openmpi-bin libopenmpi-dev); skipped"
  exit 0
fi
mkdir -p "$build/bench"
run() {  # run NAME P SCHEME extra-flags...
  local name=$1 p=$2 scheme=$3
  shift 3
  local threads=$(( cores / p > 0 ? cores / p : 1 ))
  echo
  OMP_NUM_THREADS=$threads mpiexec -n "$p" "$mha" bench --context-parallel "$scheme" \
    --json "$build/bench/distributed-$name-$scheme-np$p.json" "$@"
}
for p in 1 2 4; do
  for scheme in ring ulysses; do
    run heads4 "$p" "$scheme" --lengths 16384,65536 --repeats 1
  done
done
for p in 1 4; do
  run long "$p" ring --lengths 262144 --heads 1 --kv-heads 1 --no-backward --repeats 1
done
