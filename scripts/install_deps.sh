#!/usr/bin/env bash
# Installs the Debian packages mha needs to build, test and benchmark (see DESIGN.md,
# "Dependencies"), plus any package named as an argument (scripts/fuzz.sh adds clang's).
# Idempotent: when everything is already installed it prints one line and touches nothing;
# otherwise it runs `apt-get update` once and installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
  build-essential
  cmake
  pkg-config
  libopenblas-dev
  libopenblas-openmp-dev
  nlohmann-json3-dev
  libcli11-dev
  libpng-dev
  zlib1g-dev
  libhwy-dev
  libutf8proc-dev
  libopenmpi-dev
  openmpi-bin
  libsleef-dev
  libxsmm-dev
  libicu-dev
  libgtest-dev
  libbenchmark-dev
  dataset-fashion-mnist
  python3-dev
  python3-venv
  "$@"
)

missing=()
native=$(dpkg --print-architecture)
for pkg in "${packages[@]}"; do
  # Installed means "install ok installed" (dpkg -s also succeeds for removed-but-not-purged
  # packages) for this machine's architecture or all: with another architecture's copy beside it
  # (multiarch, as make test-arm64 installs arm64's) dpkg-query prints one line for each.
  if ! dpkg-query -W -f='${Status} ${Architecture}\n' "$pkg" 2>/dev/null |
      grep -Eqx "install ok installed ($native|all)"; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_deps: missing ${missing[*]}; this script installs Debian packages with apt-get, which this" \
       "system does not have: install their equivalents by hand (DESIGN.md, \"Dependencies\")" >&2
  exit 1
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo --preserve-env=DEBIAN_FRONTEND)
  else
    echo "install_deps: missing ${missing[*]}, and not root with no sudo available" >&2
    exit 1
  fi
fi

echo "install_deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
