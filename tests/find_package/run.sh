#!/usr/bin/env bash
# ctest "find_package": install the built mha into a scratch prefix, configure and build the
# consumer project in this folder against it with find_package(mha), then run the consumer.
# Usage: run.sh <cmake> <mha build dir> <scratch dir> [C++ compiler]
set -euo pipefail

cmake_exe=$1
mha_build=$2
scratch=$3
cxx=${4:-}

here=$(cd "$(dirname "$0")" && pwd)
prefix=$scratch/find_package_prefix
consumer=$scratch/find_package_consumer

rm -rf "$prefix" "$consumer"

echo "== install mha into $prefix"
"$cmake_exe" --install "$mha_build" --prefix "$prefix"

echo "== configure consumer"
args=(-S "$here" -B "$consumer" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if [[ -n "$cxx" ]]; then
  args+=(-DCMAKE_CXX_COMPILER="$cxx")
fi
"$cmake_exe" "${args[@]}"

# The package must come from the scratch prefix, not from some other install on the machine.
mha_dir=$(sed -n 's/^mha_DIR:PATH=//p' "$consumer/CMakeCache.txt")
case "$mha_dir" in
  "$prefix"/*) ;;
  *) echo "find_package(mha) found $mha_dir, expected a path under $prefix" >&2; exit 1 ;;
esac

echo "== build consumer"
"$cmake_exe" --build "$consumer"

echo "== run consumer"
"$consumer/find_package_consumer"
