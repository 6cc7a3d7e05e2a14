# ferrofeed's one task runner: CI (.ci/run) and the README use these targets.
# `make help` lists them.

.DEFAULT_GOAL := help
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
WHEEL_DIR := target/wheels
# mosaicml-streaming, whose MDSWriter writes tests/test_mds.py's datasets (installed without its
# pins by install-test: see pyproject.toml's test extra).
STREAMING_VERSION := 0.13.0
export PYO3_PYTHON := $(abspath $(PY))

# Two builds of the extension:
# - The local build (`make install`, `make demo`, `make test`): one extension for this
#   machine, optimised as release but without LTO (Cargo.toml's `fast` profile: parallel
#   codegen), linked by the system's linker. It is about a third quicker to compile than the
#   release build, and `make test-rust` runs `cargo test` with the same profile, so the
#   tests reuse every dependency the wheel compiled. It costs 1-2% more CPU per image than
#   the release build's portable extension (BENCHMARKS.md, "Build times").
# - The release wheel (`make wheel`): manylinux2014 through zig, fat LTO, and on x86_64 a
#   second extension for x86-64-v3 CPUs; what users install. `make install BUILD=release`
#   (and so `make demo` or `make test` with BUILD=release) installs it instead. The benchmark
#   targets (bench*, compare*) install it by default: their figures are the release wheel's.
BENCH_GOALS := $(filter bench bench-% compare compare-%,$(MAKECMDGOALS))
BUILD ?= $(if $(BENCH_GOALS),release,local)
ifeq ($(filter local release,$(BUILD)),)
$(error BUILD=$(BUILD): expected local or release)
endif
LOCAL_PROFILE := fast

# The build tools live in a venv of their own, so that $(VENV) holds only ferrofeed, what it
# needs at run time, and what you add to it: maturin for both builds; zig (the ziglang
# package, to link against glibc 2.17), auditwheel (to check the result) and wheel (to add
# the x86-64-v3 extension) for the release wheel only.
BUILD_VENV := target/build-venv
BUILD_PY := $(BUILD_VENV)/bin/python
BUILD_PIP := $(BUILD_PY) -m pip --disable-pip-version-check
RELEASE_TOOLS := $(BUILD_VENV)/.release-tools
# A manylinux2014 wheel: installs on any x86_64 Linux with glibc >= 2.17, no compiler needed.
MATURIN_FLAGS ?= --release --compatibility manylinux2014 --zig
# Each wheel is built once per tree: again only when one of its inputs changed (a second
# venv, as .ci/run's, installs the same wheel).
WHEEL_STAMP := $(WHEEL_DIR)/.built
LOCAL_WHEEL_DIR := target/local-wheel
LOCAL_STAMP := $(LOCAL_WHEEL_DIR)/.built
WHEEL_INPUTS := Cargo.toml Cargo.lock pyproject.toml README.md \
	$(shell find src python -type f -not -name '*.so' -not -name '*.pyc')
# The wheel that `make install` installs.
INSTALL_DIR := $(if $(filter release,$(BUILD)),$(WHEEL_DIR),$(LOCAL_WHEEL_DIR))
INSTALL_STAMP := $(if $(filter release,$(BUILD)),$(WHEEL_STAMP),$(LOCAL_STAMP))

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

.PHONY: venv
venv: $(PY) ## Create the virtual environment (.venv)

.PHONY: build-deps
build-deps: ## Install cmake and nasm (libjpeg-turbo's build) with apt-get, when missing
	@if ! command -v cmake >/dev/null 2>&1 || ! command -v nasm >/dev/null 2>&1; then \
		SUDO=""; if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
		echo "installing cmake and nasm (to build libjpeg-turbo from source)"; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq cmake nasm; \
	fi

$(BUILD_PY):
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_PIP) install -q "maturin>=1.8,<2"

$(RELEASE_TOOLS): | $(BUILD_PY)
	$(BUILD_PIP) install -q "ziglang>=0.13" "auditwheel>=6" "wheel>=0.42"
	touch $@

# $(call build_wheel,OUT_DIR,EXTRA_MATURIN_FLAGS[,MORE]): build, run MORE (a recipe line, e.g.
# add_v3_build), then fail unless auditwheel finds the wheel consistent with a manylinux tag.
define build_wheel
	rm -f $(1)/ferrofeed-*.whl
	PATH="$(abspath $(BUILD_VENV))/bin:$$PATH" PYO3_PYTHON="$(abspath $(BUILD_PY))" \
		$(BUILD_VENV)/bin/maturin build $(MATURIN_FLAGS) $(2) --out $(1)
	$(3)
	$(BUILD_VENV)/bin/auditwheel show $(1)/ferrofeed-*.whl | tee $(1)/auditwheel.txt
	@tr -s ' \n' ' ' < $(1)/auditwheel.txt | grep -qE 'consistent with the following platform tag: "manylinux_' \
		|| { echo "auditwheel: the wheel is not manylinux (see above)" >&2; exit 1; }
endef

# The x86_64 wheel holds a second build of the extension, compiled for x86-64-v3 (AVX2, FMA,
# BMI2, ...: CPUs from 2013 on), as ferrofeed/_core_x86_64_v3.abi3.so beside the portable
# _core.abi3.so; `import ferrofeed` loads it where the CPU runs it (python/ferrofeed/_native.py).
# It decodes with about 4% less CPU (BENCHMARKS.md). A target dir of its own keeps both builds
# incremental; `wheel pack` rewrites the wheel's RECORD with the added file.
V3_DIR := target/x86-64-v3
V3_ENV := RUSTFLAGS="-C target-cpu=x86-64-v3" CFLAGS="-march=x86-64-v3"
HOST_ARCH := $(shell uname -m)

# $(call add_v3_build,OUT_DIR): build the x86-64-v3 extension and add it to OUT_DIR's wheel.
define add_v3_build
	rm -rf $(V3_DIR)/wheel $(V3_DIR)/v3 $(V3_DIR)/merged
	PATH="$(abspath $(BUILD_VENV))/bin:$$PATH" PYO3_PYTHON="$(abspath $(BUILD_PY))" $(V3_ENV) \
		$(BUILD_VENV)/bin/maturin build $(MATURIN_FLAGS) --target-dir $(V3_DIR) --out $(V3_DIR)/wheel
	$(BUILD_PY) -m wheel unpack -d $(V3_DIR)/v3 $(V3_DIR)/wheel/ferrofeed-*.whl
	$(BUILD_PY) -m wheel unpack -d $(V3_DIR)/merged $(1)/ferrofeed-*.whl
	pkg=$$(echo $(V3_DIR)/merged/ferrofeed-*/ferrofeed) && \
		cp $(V3_DIR)/v3/ferrofeed-*/ferrofeed/_core.abi3.so "$$pkg/_core_x86_64_v3.abi3.so"
	rm -f $(1)/ferrofeed-*.whl
	$(BUILD_PY) -m wheel pack -d $(1) $(V3_DIR)/merged/ferrofeed-*
endef

$(WHEEL_STAMP): $(WHEEL_INPUTS) | $(RELEASE_TOOLS) build-deps
	rm -f $@
	$(call build_wheel,$(WHEEL_DIR),,$(if $(filter x86_64,$(HOST_ARCH)),$(call add_v3_build,$(WHEEL_DIR))))
	touch $@

.PHONY: wheel
wheel: $(WHEEL_STAMP) ## Build the release (manylinux2014, two extensions on x86_64) wheel into target/wheels, checked by auditwheel
	@ls $(WHEEL_DIR)/ferrofeed-*.whl

$(LOCAL_STAMP): $(WHEEL_INPUTS) | $(BUILD_PY) build-deps
	rm -f $@ $(LOCAL_WHEEL_DIR)/ferrofeed-*.whl
	PATH="$(abspath $(BUILD_VENV))/bin:$$PATH" PYO3_PYTHON="$(abspath $(BUILD_PY))" \
		$(BUILD_VENV)/bin/maturin build --profile $(LOCAL_PROFILE) --out $(LOCAL_WHEEL_DIR)
	touch $@

.PHONY: local-wheel
local-wheel: $(LOCAL_STAMP) ## Build the local wheel (one extension for this machine, no LTO) into target/local-wheel
	@ls $(LOCAL_WHEEL_DIR)/ferrofeed-*.whl

.PHONY: wheel-aarch64
wheel-aarch64: | $(RELEASE_TOOLS) build-deps ## Cross-compile the manylinux2014 aarch64 wheel into target/wheels-aarch64 (with zig)
	rustup target add aarch64-unknown-linux-gnu
	$(call build_wheel,target/wheels-aarch64,--target aarch64-unknown-linux-gnu)

.PHONY: install
install: $(PY) $(INSTALL_STAMP) ## Build the local wheel (BUILD=release: the release wheel) and install it, with its dependencies, into .venv
	$(PIP) uninstall -q -y ferrofeed
	$(PIP) install -q $(INSTALL_DIR)/ferrofeed-*.whl

.PHONY: demo
demo: install ## Install ferrofeed and run its main job (ferrofeed demo)
	$(VENV)/bin/ferrofeed demo

.PHONY: install-test
install-test: install ## Install the wheel with everything the tests need
	$(PIP) install -q "$$(ls $(INSTALL_DIR)/ferrofeed-*.whl)[test,lint]"
	$(PIP) install -q --no-deps "mosaicml-streaming==$(STREAMING_VERSION)"

.PHONY: build-dev
build-dev: $(PY) ## Build the extension in place (editable, debug) for quick iteration
	$(PIP) install -q "maturin>=1.8,<2"
	$(VENV)/bin/maturin develop

.PHONY: format
format: $(PY) ## Format Rust and Python code
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches examples
	$(VENV)/bin/ruff check --fix python tests benches examples

.PHONY: lint-rust
lint-rust: build-deps ## cargo fmt --check and clippy with warnings denied
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --no-default-features -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings

.PHONY: lint-python
lint-python: ## ruff, ruff format --check, mypy and stubtest (needs install-test)
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy
	cd /tmp && $(abspath $(PY)) -m mypy.stubtest ferrofeed --allowlist $(abspath .stubtest-allowlist)

.PHONY: lint
lint: lint-rust lint-python ## All lints

.PHONY: test-rust
test-rust: build-deps ## Rust unit, property and doc tests
	cargo test --profile $(LOCAL_PROFILE)

.PHONY: test-rust-slow
test-rust-slow: build-deps ## The Rust image tests again, on the pure-Rust JPEG decoder (a second build of the crate)
	cargo test --profile $(LOCAL_PROFILE) --lib --no-default-features image

# The test tiers: `make test` leaves out the pytest tests marked `slow` (the soak, multi-node
# and object-storage suites, and the smoke runs of the benchmarks) and the Rust image tests
# on zune-jpeg (test-rust-slow); `make test-slow` runs only those, `make test-all` everything
# (CI does). pytest runs on PYTEST_WORKERS processes (pytest-xdist; 0 or 1: in this one);
# PYTEST_ARGS adds options (e.g. -x, -k NAME).
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
PYTEST := $(PY) -m pytest $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS)) $(PYTEST_ARGS)

.PHONY: test-python
test-python: ## pytest's default tier (all but the tests marked slow) against the installed wheel
	$(PYTEST) -m "not slow"

.PHONY: test
test: install-test test-rust test-python ## Install what the tests need, then run the Rust tests and pytest's default tier

.PHONY: test-slow
test-slow: install-test test-rust-slow ## The slow tier: pytest's soak, multi-node, object-storage and benchmark smoke tests, and test-rust-slow
	$(PYTEST) -m slow

.PHONY: test-all
test-all: test test-slow ## Every test: `make test`, then the slow tier (what CI runs)

# The tests of the release wheel's two extensions (the x86-64-v3 one is chosen where the CPU
# runs it, and both give the same bytes) skip with the local build, which has one: this
# installs the release wheel into .venv (with what the tests need) and runs them, and the
# packaging and demo tests, against it. CI runs it after test-all.
RELEASE_TESTS := tests/test_native_build.py tests/test_packaging.py tests/test_demo.py

.PHONY: test-release
test-release: ## Build the release wheel, install it into .venv, run the tests of its builds against it
	$(MAKE) install-test BUILD=release
	$(PY) -m pytest $(RELEASE_TESTS)

# --- reliability: fuzzing and sanitizers (nightly toolchain; see RELIABILITY.md) ---
NIGHTLY ?= +nightly
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := arena decode shards
HOST_TRIPLE = $(shell rustc -vV | sed -n 's/^host: //p')

.PHONY: fuzz-deps
fuzz-deps: ## Install cargo-fuzz when missing
	@command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked

.PHONY: fuzz
fuzz: fuzz-deps build-deps ## Run each fuzz target for FUZZ_SECONDS (default 60) from its corpus
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		cargo $(NIGHTLY) fuzz run -O $$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=20; \
	done

.PHONY: fuzz-replay
fuzz-replay: fuzz-deps build-deps ## Run the fuzz targets once over their corpus and regression inputs
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		dirs="corpus/$$t"; [ -d regressions/$$t ] && dirs="$$dirs regressions/$$t"; \
		cargo $(NIGHTLY) fuzz run -O $$t $$dirs -- -runs=0 -rss_limit_mb=2048; \
	done

.PHONY: sanitize
sanitize: ## Unit tests of the arena, staging, DLPack, pixel-kernel and scratch-buffer code under AddressSanitizer (nightly)
	RUSTFLAGS="-Zsanitizer=address" ASAN_OPTIONS=detect_leaks=1 \
		cargo $(NIGHTLY) test --lib --target $(HOST_TRIPLE) --target-dir target/asan \
		--no-default-features --features cuda -- arena:: staging:: dlpack:: image::ops:: image::buffer::

.PHONY: valgrind
valgrind: build-deps ## The image unit tests (libjpeg-turbo's C code included) under valgrind memcheck
	@command -v valgrind >/dev/null 2>&1 || { echo "valgrind is not installed"; exit 1; }
	bin=$$(cargo test --lib --no-run --message-format=json 2>/dev/null | \
		sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -1); \
	JSIMD_FORCENONE=1 valgrind -q --error-exitcode=99 "$$bin" image:: --test-threads=1

.PHONY: miri
miri: ## The DLPack export and deleters under Miri (nightly, with the miri component)
	cargo $(NIGHTLY) miri test --lib --no-default-features -- dlpack::export

# MALLOC_ARENA_MAX=2: every epoch starts new threads, which glibc spreads over up to 8 malloc
# arenas per core; their fragmentation adds a few MiB of RSS over the first epochs that is
# not memory ferrofeed holds (RELIABILITY.md, "Soak", has both runs). OPENBLAS_NUM_THREADS=1:
# NumPy's BLAS threads come and go around forks of their own accord.
SOAK_ENV ?= MALLOC_ARENA_MAX=2 OPENBLAS_NUM_THREADS=1

.PHONY: soak
soak: install-test ## 10 epochs over 20,000 generated images: RSS, fds, threads and /dev/shm must not grow (tests/soak.py)
	$(SOAK_ENV) FERROFEED_SOAK_IMAGES=$${FERROFEED_SOAK_IMAGES:-20000} \
		FERROFEED_SOAK_EPOCHS=$${FERROFEED_SOAK_EPOCHS:-10} $(PY) tests/soak.py

.PHONY: bench-deps
bench-deps: ## Install FFmpeg 5's shared libraries (SPDL's image decoding) with apt-get, when missing
	@if ! ldconfig -p | grep 'libavcodec\.so\.59' >/dev/null; then \
		SUDO=""; if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
		echo "installing FFmpeg 5 libraries (for SPDL in benches/decode_vs_pillow.py)"; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq \
			libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8; \
	fi

.PHONY: bench
bench: install-test bench-deps ## Criterion benches and the Python comparisons (see BENCHMARKS.md)
	cargo bench --bench arena --bench pipeline --bench image
	cargo bench --bench image --no-default-features
	$(PIP) install -q "spdl==0.8.0"
	$(PY) benches/ram_study.py
	$(PY) benches/pipeline_overhead.py --spdl-n 20000
	$(PY) benches/decode_vs_pillow.py
	$(PY) benches/loader_images.py
	$(PY) benches/loader_workers.py
	$(PY) benches/ram_loaders.py

# --- the comparison with other loaders (benches/compare.py; BENCHMARKS.md, "Side by side") ---
COMPARE_ARGS ?=
# dataloader-rs needs Python >= 3.13: it gets a venv of its own, made from PYTHON313 (default:
# the first of python3.13, python3.14 and pyenv's 3.13+ that runs). None: it is left out.
PYTHON313 ?=
PY313_VENV := .venv-py313
COMPARE_PEERS := "torch>=2.3" "pillow>=10" "scikit-image>=0.22" "matplotlib>=3.8" "tqdm>=4.60" \
	"spdl==0.8.0" "pyarrow>=15" "webdataset>=0.2.100" "datasets>=3" "moto[server]>=5" "boto3>=1.26"
# torchvision (decode_jpeg + transforms.v2) must be a release built for the torch installed
# above: `compare.py --torchvision-requirement` names the range for it (0.(m+15) for torch 2.m;
# the stable-ABI 0.29+ for torch 2.14 on). It is installed with --no-deps: its requirement on
# torch would otherwise let pip swap the installed torch (a CUDA or local build) for another.

.PHONY: compare-deps
compare-deps: install bench-deps ## Install the compared loaders (PyTorch, Pillow, torchvision, SPDL 0.8, webdataset, HF datasets, datago, dataloader-rs where they install)
	$(PIP) install -q $(COMPARE_PEERS)
	@req=$$($(PY) benches/compare.py --torchvision-requirement) \
		&& $(PIP) install -q --no-deps "$$req" \
		|| echo "compare: no torchvision for the installed torch here; its loader is left out"
	@$(PIP) install -q datago || echo "compare: datago does not install here; it is left out"
	@py313=""; \
	for c in $(PYTHON313) python3.13 python3.14 \
			$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[3-9]*/bin/python3 2>/dev/null); do \
		if "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null; then \
			py313="$$c"; break; \
		fi; \
	done; \
	if [ -z "$$py313" ]; then \
		echo "compare: no Python >= 3.13 here; dataloader-rs (which needs it) is left out"; \
	else \
		[ -x $(PY313_VENV)/bin/python ] || "$$py313" -m venv $(PY313_VENV); \
		$(PY313_VENV)/bin/python -m pip --disable-pip-version-check install -q \
			dataloader-rs "pillow>=10" "numpy>=2.2" \
			|| echo "compare: dataloader-rs does not install in $(PY313_VENV); it is left out"; \
	fi

.PHONY: compare
compare: compare-deps ## Every loader side by side, and the shards job from object storage: JSON, tables and plots in benches/results (COMPARE_ARGS=--quick: a short run)
	py313=""; \
	if $(PY313_VENV)/bin/python -c 'import dataloader_rs' 2>/dev/null; then \
		py313="--py313=$(abspath $(PY313_VENV))/bin/python"; \
	fi; \
	$(PY) benches/compare.py $$py313 $(COMPARE_ARGS)
	$(PY) benches/remote_compare.py $(REMOTE_COMPARE_ARGS)

.PHONY: compare-shards
compare-shards: compare-deps ## The shards job alone (tar and Parquet: ferrofeed, webdataset, HF datasets): benches/results/shards_compare.*
	$(PY) benches/compare.py --jobs shards --name shards_compare $(COMPARE_ARGS)

# benches/remote_compare.py takes --quick from COMPARE_ARGS (its other options are its own).
REMOTE_COMPARE_ARGS ?= $(filter --quick,$(COMPARE_ARGS))

.PHONY: compare-remote
compare-remote: compare-deps ## The shards job from object storage (moto's S3, HTTP, +20 ms/request) against local disk and webdataset: benches/results/remote_compare.*
	$(PY) benches/remote_compare.py $(REMOTE_COMPARE_ARGS)

.PHONY: bench-workers
bench-workers: install-test ## Python transforms in worker processes against PyTorch's DataLoader (benches/loader_workers.py)
	$(PY) benches/loader_workers.py

# benches/scaling.py's options, e.g. SCALING_ARGS="--threads 1,2,4 --batch-sizes 32", --quick (a
# short run), --proxy-only, or --compare (PyTorch + Pillow and torchvision v2 beside it: run
# `make compare-deps` first).
SCALING_ARGS ?=

.PHONY: bench-scaling
bench-scaling: install-test ## The native chain at 1-32 threads, batches of 32 and 256, folders and tar shards: images/s, threads busy, CPU per image (benches/scaling.py)
	$(PY) benches/scaling.py $(SCALING_ARGS)

# benches/pack_compare.py's options, e.g. PACK_COMPARE_ARGS="--n 2000 --repeats 5" or --quick.
PACK_COMPARE_ARGS ?=

.PHONY: bench-pack
bench-pack: install-test ## Packing 2,000 JPEGs into tar shards: ferrofeed pack against webdataset's ShardWriter loop (copy, and Pillow re-encode) and LitData's optimize() (installed apart, into target/litdata) (benches/pack_compare.py)
	$(PY) -m pip install --quiet --target target/litdata --no-deps litdata lightning-utilities
	$(PY) benches/pack_compare.py --litdata target/litdata $(PACK_COMPARE_ARGS)

.PHONY: bench-mix
bench-mix: install-test ## A Mix of two sources against the same images as one source, side by side (folder and tar), and a mixture's resume cost at 10^6 and 10^8 samples (benches/mix_cost.py)
	$(PY) benches/mix_cost.py $(MIX_ARGS)

.PHONY: bench-gpu
bench-gpu: install-test ## On a CUDA machine: copies to the GPU and loaders ending there, against PyTorch's pin_memory=True (benches/gpu_feed.py)
	$(PY) benches/gpu_feed.py $(GPU_FEED_ARGS)

.PHONY: device-pack
device-pack: wheel install-test ## For a lent GPU machine (no network): the release wheel, pytest and the bench photos into target/device; there, `bash benches/device_check.sh` with target/device carried
	$(PY) benches/device_pack.py --wheel "$$(ls -t $(WHEEL_DIR)/ferrofeed-*abi3*x86_64*.whl | head -1)"

.PHONY: bench-ram-workers
bench-ram-workers: install-test ## RAM of 2 ranks x 4 workers over 1M annotations: ferrofeed vs PyTorch's DataLoader (benches/ram_loaders.py)
	$(PY) benches/ram_loaders.py $(RAM_LOADERS_ARGS)

.PHONY: clean
clean: ## Remove build outputs (keeps .venv)
	cargo clean
	rm -rf $(WHEEL_DIR) $(LOCAL_WHEEL_DIR) python/ferrofeed/*.so
