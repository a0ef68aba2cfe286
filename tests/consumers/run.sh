#!/usr/bin/env bash
# ctest "find_package" and "add_subdirectory": build and run a small program that uses mha the two
# ways a CMake project can (fmt's pattern).
#   find_package      install the built mha into a scratch prefix, then configure the consumer in
#                     find_package/ against it with find_package(mha);
#   add_subdirectory  configure the consumer in add_subdirectory/, which adds mha's source tree.
# Both check mha::mha's link interface (link_interface.cmake), build and run the consumer.
# Usage: run.sh <find_package|add_subdirectory> <cmake> <mha source dir> <mha build dir>
#               <scratch dir> [C++ compiler]
set -euo pipefail

mode=$1
cmake_exe=$2
mha_source=$3
mha_build=$4
scratch=$5
cxx=${6:-}

here=$(cd "$(dirname "$0")" && pwd)
consumer=$scratch/consumer_$mode
rm -rf "$consumer"

args=(-S "$here/$mode" -B "$consumer" -DCMAKE_BUILD_TYPE=Release)
if [[ -n "$cxx" ]]; then
  args+=(-DCMAKE_CXX_COMPILER="$cxx")
fi
case "$mode" in
  find_package)
    prefix=$scratch/find_package_prefix
    rm -rf "$prefix"
    echo "== install mha into $prefix"
    "$cmake_exe" --install "$mha_build" --prefix "$prefix"
    args+=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
           -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
    ;;
  add_subdirectory)
    args+=(-DMHA_SOURCE_DIR="$mha_source")
    ;;
  *)
    echo "run.sh: mode: expected find_package or add_subdirectory, got '$mode'" >&2
    exit 2
    ;;
esac

echo "== configure consumer ($mode)"
"$cmake_exe" "${args[@]}"

if [[ "$mode" == find_package ]]; then
  # The package must come from the scratch prefix, not from some other install on the machine.
  mha_dir=$(sed -n 's/^mha_DIR:PATH=//p' "$consumer/CMakeCache.txt")
  case "$mha_dir" in
    "$prefix"/*) ;;
    *) echo "find_package(mha) found $mha_dir, expected a path under $prefix" >&2; exit 1 ;;
  esac
fi

echo "== build consumer"
"$cmake_exe" --build "$consumer" --parallel "$(nproc 2>/dev/null || echo 2)"

echo "== run consumer"
"$consumer/consumer"
