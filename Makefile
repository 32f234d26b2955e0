# gradkit — the entry point. A new user needs two commands: `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
# mpirun as root (containers, CI) and more ranks than cores (2-core machines).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

APT_PKGS := build-essential pkg-config clang libclang-dev openmpi-bin libopenmpi-dev \
            openssh-client python3-venv ca-certificates libsimgrid-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VENV := .venv
CARGO := cargo
CARGO_FLAGS := --release --locked
BIN := target/release
FAST ?= 0
export FAST

.PHONY: native-module deps-torch test-torch repro-torch check-contributing lint-cuda all help deps deps-apt deps-rust deps-py deps-cuda-py deps-bench build demo test test-py test-cuda-feature gpu-bundle gpu-bundle-files bench stress-mpi lint fmt clean \
        docs check-docs golden-record golden-check \
        repro repro-oktopk repro-deft repro-onebit-lamb repro-embrace

all: build

help:
	@echo "make demo    install what is missing, build, run the demo pipeline (data/out/demo/)"
	@echo "make test    install what is missing, build, check formatting, run every test (twice in a row is fine)"
	@echo "make bench   benchmarks (its goal verdicts go to docs/RESULTS.md § bench-goals)"
	@echo "make repro   every reproduction below; FAST=1 for the quick ones make test runs"
	@echo "make repro-dense | repro-oktopk | repro-deft | repro-onebit-lamb | repro-embrace   (FAST=1: ~1 min)"
	@echo "make repro-oktopk-figs | repro-deft-figs | repro-deft-breakdown   the figures alone, from target/release"
	@echo "make repro-oktopk-closed | repro-onebit-table3   the papers' closed-loop training runs (FAST=1: ~30 s each)"
	@echo "make repro-cluster | repro-embrace-fig7   the shaped multi-host runs (root; docs/CLUSTER.md)"
	@echo "make repro-torch   real PyTorch models with DDP, gradkit's hooks and 1-bit Adam on shaped hosts (root, .venv-torch)"
	@echo "make repro-sim | repro-scale   SimGrid replay: calibrated on the cluster | at 16-256 ranks (docs/SIMULATE.md)"
	@echo "make cluster-up HOSTS=4 RATE=1gbit | cluster-status | cluster-down   (docs/CLUSTER.md)"
	@echo "make build   release binaries in target/release    make deps   what is missing (apt, rustup, venv)"
	@echo "make test-cuda-feature   the cuda feature built, its kernels compiled (NVRTC, ptxas) and its device tests run"
	@echo "make lint-cuda   clippy with the cuda feature (target/clippy-cuda; part of make lint)"
	@echo "make test-py   the Python package's tests (python/, docs/PYTORCH.md) against target/release"
	@echo "make test-torch   the PyTorch bridge's tests (DDP hook, torch.distributed transport) in .venv-torch (installs torch: ~6 GB)"
	@echo "make gpu-bundle   target/gpu-bundle.tar.gz: stripped cuda binaries and tests for pipelines/gpu-check.sh on a GPU node"
	@echo "make stress-mpi RUNS=200   every mpirun error path under load (docs/RELIABILITY.md)"
	@echo "make docs    regenerate the numbers the docs quote from their tables    make check-docs   check them"
	@echo "make golden-record | golden-check [GOLDEN=F]   a refactor's check: every tool's outputs recorded at the base, compared after"
	@echo "make lint    rustfmt check, code shape, clippy (default and cuda features)    make fmt   format    make clean"

## deps: what is missing, and only that (apt packages as root or with sudo; the Python venv
## with numpy, pyarrow, pandas and polars used by the interoperability tests, the gradkit
## Python package of python/, installed editable, and CUDA 13.0's NVRTC and ptxas for the
## kernels' compile check, about 130 MB). Quick when all is present.
deps: deps-apt deps-rust deps-py deps-cuda-py

deps-apt:
	@missing=$$(for p in $(APT_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

deps-rust:
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found; install Rust >= 1.88 with rustup (https://rustup.rs)" >&2; exit 1; }
	@for c in rustfmt clippy; do $(CARGO) $${c/rustfmt/fmt} --version >/dev/null 2>&1 || \
	  rustup component add $$c || { echo "error: cargo $$c is missing (rustup component add $$c)" >&2; exit 1; }; done
	@v=$$(rustc --version | awk '{print $$2}'); \
	  if [ "$$(printf '%s\n' 1.88.0 "$$v" | sort -V | head -1)" != 1.88.0 ]; then \
	    echo "error: rustc $$v is too old; gradkit needs >= 1.88 (rustup update)" >&2; exit 1; fi

# The stamp's name changes when the package list does, so an existing venv gets the new ones.
# The gradkit package of python/ goes on the venv's path as an editable install puts it (a
# .pth file): pip would build its native module again with maturin, which `make build` builds
# with the tools (one compile of the workspace) and puts beside the package.
PTH = import site, sys; open(site.getsitepackages()[0] + "/gradkit-dev.pth", "w").write(sys.argv[1] + "\n")
deps-py: $(VENV)/.ok-4
$(VENV)/.ok-4:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check numpy pyarrow pandas polars
	$(VENV)/bin/python -c '$(PTH)' $(CURDIR)/python
	touch $@

# NVRTC (libnvrtc.so.13) and ptxas from PyPI, for the compile check of the CUDA kernels in
# make test (lib/cuda/tests/nvrtc.rs): no GPU, driver or toolkit needed. Pinned to 13.0:
# NVRTC 13.5's PTX (.version 9.5) is refused by ptxas 13.0 and by CUDA 13.0 drivers.
CUDA_WHEELS := 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-nvcc==13.0.*'
deps-cuda-py: $(VENV)/.ok-cuda-13.0
$(VENV)/.ok-cuda-13.0: $(VENV)/.ok-4
	$(VENV)/bin/pip install -q --disable-pip-version-check $(CUDA_WHEELS)
	touch $@

## build: release binaries of the six tools in target/release (the default members: not the
## test-only CUDA emulation, which `cargo test --workspace` builds), and the Python package's
## native module (python/native), put beside the package as python/gradkit/_native<suffix>
## for the venv's Python (docs/PYTORCH.md; `pip install ./python` builds it with maturin)
build: deps-apt deps-rust
	$(CARGO) build $(CARGO_FLAGS)
	@$(MAKE) --no-print-directory native-module

# The interpreter's extension suffix: another Python does not load a module built for this one.
NATIVE_SUFFIX = $(shell python3 -c 'import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])')
native-module:
	@install -m 755 $(BIN)/lib_native.so python/gradkit/_native$(NATIVE_SUFFIX)

## demo: synthetic trace → selections → plans → every allreduce → short training → report
demo: deps build
	@bash pipelines/demo.sh

## test: formatting, the shape of the code (pipelines/check-shape.py: no function over 80
## lines, no import cycle inside a crate), unit, property and CLI tests (also under mpirun), then every reproduction
## in FAST mode, then the `cuda` feature (docs/GPU.md): built, its device tests run without
## any CUDA installed, and `--device cuda` shown to stop with one `error:` line. It leaves
## the default binaries in target/release, so it passes again in the same checkout, after
## make demo, make bench or any make repro-*.
##
## Time (a fresh clone after make demo is the slow case: nothing of the tests is compiled
## yet; issue 41's goal is 12 minutes on 2 cores): clippy is `make lint`'s, not make test's
## (with the cuda feature it checks every dependency again in a target directory of its own:
## 363 s of CPU, a fifth of a fresh make test's). CONTRIBUTING.md's executed walk-through (make
## check-contributing: it copies the tree first, so the tests' cargo has checked its build and
## let go of the target directory's lock before the walk-through's cargo asks for it) runs in
## the background while the tests run, which mostly wait on processes; the Python package's
## tests run while the reproductions do. Their output is shown if they fail. The test binaries run their tests on at least 4
## threads ($(TEST_THREADS)), for the same reason.
TEST_THREADS := $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -lt 4 ] && n=4; echo $$n)
# The test binaries run in two groups at once (cargo runs one binary at a time, and most of
# them wait on processes): TEST_APART, the CUDA emulation's and the slowest CLI suite, then
# the doc tests; and every other one (TEST_REST: each test target of the workspace that is
# not in TEST_APART, read from cargo metadata, so a new one joins by itself). On a fresh
# clone the two groups took about 200 s together (they were 283 s with gradreport's tests
# in the first group). Both select the whole workspace, so no dependency's features change.
TEST_APART := emulation resident gradtrace
TEST_REST = $(shell $(CARGO) metadata --no-deps --format-version 1 --offline | python3 -c 'import json, sys; apart = set(sys.argv[1:]); print(" ".join(sorted({"--test " + t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"] and t["name"] not in apart})))' $(TEST_APART))
test: deps build
	$(CARGO) fmt --all -- --check
	python3 pipelines/check-shape.py
	$(MAKE) --no-print-directory check-docs
	$(CARGO) test $(CARGO_FLAGS) --workspace --no-run
	@mkdir -p target; trap 'kill $${py:-} $${walk:-} $${apart:-} 2>/dev/null' EXIT; \
	  echo "make test: CONTRIBUTING.md's walk-through runs meanwhile (target/check-contributing.log)"; \
	  $(MAKE) --no-print-directory check-contributing > target/check-contributing.log 2>&1 & walk=$$!; \
	  echo "make test: $(TEST_APART) and the doc tests run meanwhile (target/test-apart.log)"; \
	  { RUST_TEST_THREADS=$(TEST_THREADS) $(CARGO) test $(CARGO_FLAGS) --workspace $(addprefix --test ,$(TEST_APART)) \
	    && $(CARGO) test $(CARGO_FLAGS) --workspace --doc; } > target/test-apart.log 2>&1 & apart=$$!; \
	  RUST_TEST_THREADS=$(TEST_THREADS) $(CARGO) test $(CARGO_FLAGS) --workspace --lib --bins $(TEST_REST) || exit 1; \
	  if ! wait $$apart; then cat target/test-apart.log; echo "error: the tests of target/test-apart.log failed (above)" >&2; exit 1; fi; \
	  grep -E '^ +Running|^test result' target/test-apart.log; \
	  echo "make test: the Python package's tests run meanwhile (target/test-py.log)"; \
	  $(MAKE) --no-print-directory test-py > target/test-py.log 2>&1 & py=$$!; \
	  $(MAKE) --no-print-directory FAST=1 repro; rc=$$?; \
	  if ! wait $$py; then cat target/test-py.log; echo "error: make test-py failed (above)" >&2; exit 1; fi; \
	  echo "make test-py: $$(grep -E '^(Ran|OK|FAILED)' target/test-py.log | tr '\n' ' ')"; \
	  if ! wait $$walk; then cat target/check-contributing.log; echo "error: make check-contributing failed (above)" >&2; exit 1; fi; \
	  grep '^check-contributing: the walk' target/check-contributing.log; \
	  [ $$rc = 0 ] || exit $$rc
	$(MAKE) --no-print-directory test-cuda-feature

## test-py: the Python package's tests (python/tests; torch's only where it is installed),
## against the release binaries in $(BIN)
test-py: deps-py
	GRADKIT_BIN=$(BIN) $(VENV)/bin/python -m unittest discover -s python/tests -t python/tests

## test-torch: the PyTorch side (python/tests/test_torch*.py: the DDP hook against
## gradallreduce on its own recording, the torch.distributed transport's conformance, the
## checkpoint, the 1-bit optimizers, the recorder's torch inputs; test_docs.py with
## docs/PYTORCH.md's torchrun blocks) in a venv of its own, with torch from the registry:
## about 6 GB with its CUDA wheels, so never part of make test, where these tests skip.
TORCH_VENV := .venv-torch
deps-torch: $(TORCH_VENV)/.ok-1
$(TORCH_VENV)/.ok-1:
	python3 -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q --disable-pip-version-check torch numpy pyarrow pandas
	touch $@
test-torch: deps-torch build
	cd python/tests && GRADKIT_BIN=$(CURDIR)/$(BIN) OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR)/python \
	  $(CURDIR)/$(TORCH_VENV)/bin/python -m unittest -v test_torch test_torch_bridge test_docs

## repro-torch [FAST=1] [PARTS=…]: the papers' experiment in real PyTorch (pipelines/repro-torch.sh):
## a CNN and an LSTM LM under DDP's own allreduce, gradkit's hooks and 1-bit Adam, on this machine
## and on 4 shaped hosts at 100 Mbit/s and 1 Gbit/s, 3 interleaved repeats (train); the CNN at
## 100 Mbit/s with 3× the steps for the sparse runs (long); the hook's overhead on a 25 M-parameter
## layer (overhead): docs/RESULTS.md § torch. Needs root and .venv-torch (make deps-torch); says
## why and stops without them.
repro-torch: build
	@bash pipelines/repro-torch.sh

# The `cuda` binaries (built for the device tests, which run them) are uplifted to
# target/release while they are tested; the last line puts the default ones back (fresh, so
# it only links them there again).
#
# Every cargo call here selects the whole workspace: selecting packages (`-p`) resolves the
# features of their dependencies anew, which compiled gradkit-core and everything above it a
# second time (minutes of make test) for the same code.
# `--features cuda`, as a user types it at the root: every member's own `cuda` (gradkit-cuda,
# gradallreduce, gradtrain); candle's CUDA backend is the separate `candle-cuda`.
CUDA_FEATURES := --features cuda
# The NVRTC test must not skip here: the wheels were just made sure of. gradkit-cuda's unit
# tests are the same with and without the feature (they run in `cargo test --workspace`);
# running them here with `-p gradkit-cuda` recompiled gradkit-comm and below (2 minutes) once
# the feature pulled in the NCCL backend.
test-cuda-feature: deps-cuda-py
	GRADKIT_REQUIRE_NVRTC=1 $(CARGO) test $(CARGO_FLAGS) --workspace $(CUDA_FEATURES) --test probe --test device --test nvrtc
	@err=$$($(BIN)/gradallreduce --device cuda 2>&1 >/dev/null); rc=$$?; \
	  echo "cuda feature: gradallreduce --device cuda -> exit $$rc: $$err"; \
	  [ $$rc = 1 ] && [ "$$(printf '%s\n' "$$err" | wc -l)" = 1 ] && [ "$${err#error: }" != "$$err" ] \
	  || { echo "error: expected exit 1 and one 'error:' line from --device cuda" >&2; exit 1; }
	$(MAKE) --no-print-directory gpu-bundle-files
	bash pipelines/gpu-check.sh --dry-run target/gpu-check-dry
	$(CARGO) build $(CARGO_FLAGS) --workspace

## check-contributing: docs/CONTRIBUTING.md §4's walk-through applied as written to a copy of
## the tree (target/contributing-tree): the toy allreduce it adds touches at most 4 files,
## builds, is formatted, and passes the collectives' tests and its own (pipelines/check_contributing.py)
check-contributing:
	python3 pipelines/check_contributing.py

## lint-cuda: the workspace clippy-checked with the `cuda` feature, in a target directory of
## its own (it shares no compiled code with the builds); part of make lint
LINT_CUDA = $(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets $(CUDA_FEATURES) --target-dir target/clippy-cuda -- -D warnings
lint-cuda:
	$(LINT_CUDA)

## docs: rewrite every <!-- gen:NAME --> fragment in docs/ from the tables it quotes (the
## repro sections of docs/RESULTS.md, docs/results/); check-docs: fail where prose and tables
## disagree, and show that each contradiction once found in them would be caught again.
docs:
	python3 pipelines/docs_check.py --write
check-docs:
	python3 pipelines/docs_check.py
	python3 pipelines/docs_check.py --selftest

## golden-record, golden-check: the refactor check of docs/CONTRIBUTING.md §8, not part of
## make test. golden-record runs pipelines/golden.py's cases (every tool, algorithm and flag
## value, --help, the errors) with the binaries in $(BIN) and writes their outputs' digests to
## $(GOLDEN); golden-check runs them again and prints every difference (exit 1) or "N cases, M
## files, all identical". Record at the base commit, refactor, check.
GOLDEN ?= target/golden.json
golden-record: deps-py build
	$(VENV)/bin/python pipelines/golden.py record --bin $(BIN) $(GOLDEN)
golden-check: deps-py build
	$(VENV)/bin/python pipelines/golden.py compare --bin $(BIN) $(GOLDEN)

## gpu-bundle: what pipelines/gpu-check.sh runs on a GPU node, where there is no Rust: the
## `cuda` build of gradallreduce, gradselect and gradtrace and the GPU test binaries, stripped
## (at most 60 MiB), in target/gpu-bundle/ and target/gpu-bundle.tar.gz (docs/GPU.md). Then
## the default binaries are put back in target/release.
BUNDLE := target/gpu-bundle
gpu-bundle: deps-apt deps-rust
	$(MAKE) --no-print-directory gpu-bundle-files
	bash pipelines/gpu-check.sh --dry-run target/gpu-check-dry
	$(CARGO) build $(CARGO_FLAGS) --workspace
	@echo "gpu-bundle: target/gpu-bundle.tar.gz ($$(du -h target/gpu-bundle.tar.gz | cut -f1)); on the GPU node: tar xzf gpu-bundle.tar.gz && gpu-bundle/gpu-check.sh OUTDIR"

gpu-bundle-files:
	$(CARGO) build $(CARGO_FLAGS) --workspace $(CUDA_FEATURES)
	@rm -rf $(BUNDLE) && mkdir -p $(BUNDLE)/bin $(BUNDLE)/tests
	@set -o pipefail; $(CARGO) test $(CARGO_FLAGS) --workspace $(CUDA_FEATURES) --test gpu --test nvrtc --test nccl --no-run --message-format=json \
	  | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]]' \
	  | while read -r t; do n=$$(basename "$$t"); cp "$$t" "$(BUNDLE)/tests/$${n%-*}"; done
	cp $(BIN)/gradallreduce $(BIN)/gradselect $(BIN)/gradtrace $(BUNDLE)/bin/
	strip $(BUNDLE)/bin/* $(BUNDLE)/tests/*
	cp pipelines/gpu-check.sh $(BUNDLE)/
	git describe --always --dirty > $(BUNDLE)/VERSION
	tar -C target -czf target/gpu-bundle.tar.gz gpu-bundle

## deps-bench: mpi4py in the venv, the MPI baseline of make bench (built against
## libopenmpi-dev, which deps-apt installs). make test does not need it.
deps-bench: $(VENV)/.ok-bench-1
$(VENV)/.ok-bench-1: $(VENV)/.ok-4
	$(VENV)/bin/pip install -q --disable-pip-version-check mpi4py
	touch $@

bench: deps deps-bench build
	@bash pipelines/bench.sh

## stress-mpi: every mpirun error path RUNS times under a CPU hog (docs/RELIABILITY.md)
RUNS ?= 200
stress-mpi: deps build
	@bash pipelines/stress-mpi-errors.sh $(RUNS)

include pipelines/oktopk.mk pipelines/deft.mk pipelines/onebit-lamb.mk pipelines/embrace.mk
include pipelines/cluster.mk pipelines/sim.mk pipelines/closed-loop.mk pipelines/dense.mk
repro: repro-dense repro-oktopk repro-deft repro-onebit-lamb repro-embrace repro-oktopk-closed repro-onebit-table3 repro-embrace-fig7 repro-torch

fmt:
	$(CARGO) fmt --all
lint:
	$(CARGO) fmt --all -- --check
	python3 pipelines/check-shape.py
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings
	$(LINT_CUDA)

clean:
	$(CARGO) clean
	rm -rf data/out
