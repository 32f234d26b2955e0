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

.PHONY: all help deps deps-apt deps-rust deps-py deps-bench build demo test test-cuda-feature bench stress-mpi lint fmt clean \
        repro repro-oktopk repro-deft repro-onebit-lamb repro-embrace

all: build

help:
	@echo "make demo    install what is missing, build, run the demo pipeline (data/out/demo/)"
	@echo "make test    install what is missing, build, check formatting, run every test (twice in a row is fine)"
	@echo "make bench   benchmarks (numbers go to docs/RESULTS.md by hand)"
	@echo "make repro   every reproduction below; FAST=1 for the quick ones make test runs"
	@echo "make repro-oktopk | repro-deft | repro-onebit-lamb | repro-embrace   (FAST=1: ~1 min)"
	@echo "make repro-oktopk-figs | repro-deft-figs   the figures alone, from target/release"
	@echo "make repro-cluster   the shaped multi-host runs (root; docs/CLUSTER.md)"
	@echo "make repro-sim | repro-scale   SimGrid replay: calibrated on the cluster | at 16-256 ranks (docs/SIMULATE.md)"
	@echo "make cluster-up HOSTS=4 RATE=1gbit | cluster-status | cluster-down   (docs/CLUSTER.md)"
	@echo "make build   release binaries in target/release    make deps   what is missing (apt, rustup, venv)"
	@echo "make test-cuda-feature   the cuda feature built, clippy-checked and its device tests run"
	@echo "make stress-mpi RUNS=200   every mpirun error path under load (docs/RELIABILITY.md)"
	@echo "make lint    rustfmt check and workspace clippy    make fmt   format    make clean"

## deps: what is missing, and only that (apt packages as root or with sudo; the Python venv
## with numpy, pyarrow, pandas and polars used by the interoperability tests). Quick when
## all is present.
deps: deps-apt deps-rust deps-py

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
deps-py: $(VENV)/.ok-2
$(VENV)/.ok-2:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check numpy pyarrow pandas polars
	touch $@

## build: release binaries of the six tools in target/release
build: deps-apt deps-rust
	$(CARGO) build $(CARGO_FLAGS) --workspace

## demo: synthetic trace → selections → plans → every allreduce → short training → report
demo: deps build
	@bash pipelines/demo.sh

## test: formatting, unit, property and CLI tests (also under mpirun), then every reproduction
## in FAST mode, then the `cuda` feature (docs/GPU.md): built, the workspace clippy-checked
## with it, and its device tests run without any CUDA installed, and `--device cuda` shown to
## stop with one `error:` line. It leaves the default binaries in target/release, so it
## passes again in the same checkout, after make demo, make bench or any make repro-*.
test: deps build
	$(CARGO) fmt --all -- --check
	$(CARGO) test $(CARGO_FLAGS) --workspace
	$(MAKE) --no-print-directory FAST=1 repro
	$(MAKE) --no-print-directory test-cuda-feature

# The `cuda` binaries (built for the device tests, which run them) are uplifted to
# target/release while they are tested; the last line puts the default ones back (fresh, so
# it only links them there again).
#
# Every cargo call here selects the whole workspace: selecting packages (`-p`) resolves the
# features of their dependencies anew, which compiled gradkit-core and everything above it a
# second time (minutes of make test) for the same code.
CUDA_FEATURES := --features gradallreduce/cuda,gradtrain/cuda
test-cuda-feature:
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets $(CUDA_FEATURES) -- -D warnings
	$(CARGO) test $(CARGO_FLAGS) --workspace $(CUDA_FEATURES) --test probe --test device
	$(CARGO) test $(CARGO_FLAGS) -p gradkit-cuda --features cuda --lib
	@err=$$($(BIN)/gradallreduce --device cuda 2>&1 >/dev/null); rc=$$?; \
	  echo "cuda feature: gradallreduce --device cuda -> exit $$rc: $$err"; \
	  [ $$rc = 1 ] && [ "$$(printf '%s\n' "$$err" | wc -l)" = 1 ] && [ "$${err#error: }" != "$$err" ] \
	  || { echo "error: expected exit 1 and one 'error:' line from --device cuda" >&2; exit 1; }
	$(CARGO) build $(CARGO_FLAGS) --workspace

## deps-bench: mpi4py in the venv, the MPI baseline of make bench (built against
## libopenmpi-dev, which deps-apt installs). make test does not need it.
deps-bench: $(VENV)/.ok-bench-1
$(VENV)/.ok-bench-1: $(VENV)/.ok-2
	$(VENV)/bin/pip install -q --disable-pip-version-check mpi4py
	touch $@

bench: deps deps-bench build
	@bash pipelines/bench.sh

## stress-mpi: every mpirun error path RUNS times under a CPU hog (docs/RELIABILITY.md)
RUNS ?= 200
stress-mpi: deps build
	@bash pipelines/stress-mpi-errors.sh $(RUNS)

include pipelines/oktopk.mk pipelines/deft.mk pipelines/onebit-lamb.mk pipelines/embrace.mk
include pipelines/cluster.mk pipelines/sim.mk
repro: repro-oktopk repro-deft repro-onebit-lamb repro-embrace

fmt:
	$(CARGO) fmt --all
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
	rm -rf data/out
