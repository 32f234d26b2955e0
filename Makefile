# gradkit — the entry point. `make demo` and `make test` are the two commands a new user needs.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

APT_PKGS := build-essential pkg-config clang libclang-dev openmpi-bin libopenmpi-dev \
            openssh-client python3-venv ca-certificates
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
VENV := .venv
PY := $(VENV)/bin/python
CARGO_FLAGS := --release --locked
BIN := target/release

.PHONY: all deps deps-apt deps-rust deps-py build demo test test-rust test-py bench clean fmt lint

all: build

## deps: install what is missing (apt packages, the Python venv for interop tests). Idempotent.
deps: deps-apt deps-rust deps-py

deps-apt:
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing $$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

deps-rust:
	@command -v cargo >/dev/null || { echo "error: cargo not found; install Rust >= 1.88 with rustup" >&2; exit 1; }

deps-py: $(VENV)/.ok
$(VENV)/.ok:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check numpy pyarrow
	touch $@

## build: release binaries of the six tools
build: deps-apt deps-rust
	cargo build $(CARGO_FLAGS) --workspace

## demo: a real pipeline on the embedded default (in-process ranks, no mpirun needed)
demo: deps build
	@bash pipelines/demo.sh

## test: every test, unit and integration (tools run as a user would, also under mpirun)
test: deps build
	cargo test $(CARGO_FLAGS) --workspace
	@bash pipelines/test-pipelines.sh

## bench: throughput and volume benchmarks; results go to docs/RESULTS.md by hand
bench: deps build
	@bash pipelines/bench.sh

fmt:
	cargo fmt --all
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets $(CARGO_FLAGS) -- -D warnings

clean:
	cargo clean
	rm -rf data/out $(VENV)
