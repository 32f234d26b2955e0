#!/usr/bin/env bash
# make repro-torch [FAST=1]: the papers' experiment in real PyTorch (issue 43 point 6). A CNN and
# an LSTM language model (pipelines/torch_bench.py, generated data) trained under
# torch.distributed (gloo) per link rate (and `local`: the ranks on this machine, unshaped),
# with: DDP's own bucketed allreduce overlapped with the backward pass (`default`, the papers'
# DenseOvlp), gradkit's `ring`, `topka`, `gtopk`, `oktopk` and `deft` as DDP's communication
# hook (density 1 %), and gradkit's 1-bit Adam (`onebit-adam`, no DDP); on HOSTS shaped hosts
# (pipelines/cluster.sh, one rank per host). REPEATS interleaved repeats, each its own seed
# (every configuration's repeat r before any repeat r+1). Then the hook's overhead
# (pipelines/torch_overhead.py: a 25 M-parameter layer in one bucket, `ring` as the hook vs
# DDP's own allreduce, on this machine). pipelines/torch_tables.py turns rank 0's JSON lines
# into docs/RESULTS.md § torch: time per step, time to the `default` run's loss, final loss and
# accuracy, bytes per step and rank, median (min–max) over the repeats, and the goals' verdicts.
# PARTS="train long overhead" (the default) runs all three; `long`: at 100 Mbit/s the CNN's
# sparse and 1-bit runs get 3× the steps, for the time to the dense run's loss (the goal's
# table); any part alone keeps the others' files and the tables are made from all; PARTS=none
# measures nothing and rewrites the section from the last run's files.
# TRANSPORT=mpi (the default): gradkit's messages (hooks, 1-bit Adam) carried by gradkit's MPI
# backend (every run is started by mpirun); TRANSPORT=torch: by the process group (gloo), as
# under torchrun. DDP's own allreduce is gloo's either way.
# Needs root (network namespaces) and torch in .venv-torch (`make deps-torch`, about 6 GB);
# without either it says so and stops (exit 0). FAST=1: 2 hosts, 1 Gbit/s, one repeat, a few
# steps, outputs in data/out/torch-fast/ (make test runs it only where .venv-torch exists).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/torch
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/torch-fast
TPY=$ROOT/.venv-torch/bin/python
PARTS=${PARTS:-train long overhead}
TRANSPORT=${TRANSPORT:-mpi}
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
if [ ! -x "$TPY" ] || ! "$TPY" -c 'import torch' 2>/dev/null; then
  echo "skipped: torch is not installed in .venv-torch (make deps-torch: about 6 GB)" | tee "$OUT/section.md" >&2
  exit 0
fi
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee "$OUT/section.md" >&2
  exit 0
fi
EXCH=${EXCH:-default ring topka gtopk oktopk deft onebit-adam}
MODELS=${MODELS:-cnn lstm}
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES=1gbit; REPEATS=1; STEPS=4; EXCH="default oktopk onebit-adam"; MODELS=cnn; OVER_STEPS=3
  PARTS=${PARTS/long/}  # FAST: no long runs
else
  HOSTS=${HOSTS:-4}; RATES=${RATES:-local 100mbit 1gbit}; REPEATS=${REPEATS:-3}; STEPS=${STEPS:-50}; OVER_STEPS=8
fi
LONG_STEPS=$((3 * STEPS)); LONG_EXCH="default topka oktopk onebit-adam"
# one_run RATE MODEL EXCHANGE REPEAT: one training run, its JSON line appended to OUT/RATE.jsonl
# (RATE `local` or `100mbit-long` and the like: the links as they are up).
one_run() {
  local launch=(mpirun -np "$HOSTS" -x MASTER_ADDR=127.0.0.1)
  if [ "$1" != local ]; then  # a cluster is up
    launch=("$ROOT/pipelines/cluster.sh" run -np "$HOSTS" -- -x MASTER_ADDR="$master" -x GLOO_SOCKET_IFNAME=eth0)
  fi
  run "${launch[@]}" -x MASTER_PORT=29517 -x OMP_NUM_THREADS=1 \
    "$TPY" "$ROOT/pipelines/torch_bench.py" --model "$2" --exchange "$3" --density 0.01 \
    --steps "$STEPS" --repeat "$4" --seed "$4" --transport "$TRANSPORT" --out "$OUT/$1.jsonl"
}
if has train; then
  rm -f "$OUT"/*.jsonl
  for rate in $RATES; do
    if [ "$rate" != local ]; then
      "$ROOT/pipelines/cluster.sh" up --hosts "$HOSTS" --rate "$rate" >&2
      trap '"$ROOT/pipelines/cluster.sh" down >&2 || true' EXIT
      # torch.distributed's rendezvous: rank 0's host (the first `host=NAMESPACE ADDRESS` line).
      master=$(awk -F= '$1 == "host" { split($2, a, " "); print a[2]; exit }' "$ROOT/data/cluster/cluster.env")
    fi
    for r in $(seq 1 "$REPEATS"); do
      for model in $MODELS; do
        for ex in $EXCH; do one_run "$rate" "$model" "$ex" "$r"; done
      done
    done
    if [ "$rate" != local ]; then
      "$ROOT/pipelines/cluster.sh" down >&2
      trap - EXIT
    fi
  done
fi
# The time to the dense run's loss, where the sparse exchanges get the steps they need: at
# 100 Mbit/s, the CNN, `default` for STEPS steps and the others for LONG_STEPS (3×).
if has long; then
  rm -f "$OUT/100mbit-long.jsonl"
  "$ROOT/pipelines/cluster.sh" up --hosts "$HOSTS" --rate 100mbit >&2
  trap '"$ROOT/pipelines/cluster.sh" down >&2 || true' EXIT
  master=$(awk -F= '$1 == "host" { split($2, a, " "); print a[2]; exit }' "$ROOT/data/cluster/cluster.env")
  for r in $(seq 1 "$REPEATS"); do
    for ex in $LONG_EXCH; do
      steps=$LONG_STEPS
      [ "$ex" = default ] && steps=$STEPS
      STEPS=$steps one_run 100mbit-long cnn "$ex" "$r"
    done
  done
  "$ROOT/pipelines/cluster.sh" down >&2
  trap - EXIT
fi
if has overhead; then
  rm -f "$OUT/overhead.jsonl"
  for r in $(seq 1 "$REPEATS"); do
    for ex in default ring; do
      run mpirun -np "$HOSTS" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29518 -x OMP_NUM_THREADS=1 \
        "$TPY" "$ROOT/pipelines/torch_overhead.py" --exchange "$ex" --steps "$OVER_STEPS" --repeat "$r" \
        --out "$OUT/overhead.jsonl"
    done
  done
fi
"$TPY" "$ROOT/pipelines/torch_tables.py" "$OUT"/*.jsonl > "$OUT/section.md"
cat "$OUT/section.md"
[ "$FAST" != 0 ] && expect "$OUT/section.md" '\| default \|' '\| oktopk \|' '\| onebit-adam \|' "hook's overhead"
section torch "$OUT/section.md"
