#!/usr/bin/env bash
# make repro-torch [FAST=1]: the papers' experiment in real PyTorch (issue 43 point 6). A CNN and
# an LSTM language model (pipelines/torch_bench.py, generated data) trained under
# torch.distributed (gloo) on HOSTS shaped hosts (pipelines/cluster.sh, one rank per host), per
# link rate (and `local`: the ranks on this machine, unshaped, for the hook's overhead), with: DDP's own bucketed allreduce overlapped with the backward pass (`default`,
# the papers' DenseOvlp), gradkit's `ring`, `topka`, `gtopk`, `oktopk` and `deft` as DDP's
# communication hook (density 1 %), and gradkit's 1-bit Adam (`onebit-adam`, no DDP). REPEATS
# interleaved repeats, each its own seed (every configuration's repeat r before any repeat r+1);
# pipelines/torch_tables.py turns rank 0's JSON lines into docs/RESULTS.md § torch: time per
# step, time to the `default` run's loss, final loss and accuracy, bytes per step and rank,
# median (min–max) over the repeats.
# Needs root (network namespaces) and torch in .venv-torch (`make deps-torch`, about 6 GB);
# without either it says so and stops (exit 0). FAST=1: 2 hosts, 1 Gbit/s, one repeat, a few
# steps, outputs in data/out/torch-fast/ (make test runs it only where .venv-torch exists).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/torch
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/torch-fast
TPY=$ROOT/.venv-torch/bin/python
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
  HOSTS=2; RATES=1gbit; REPEATS=1; STEPS=4; EXCH="default oktopk onebit-adam"; MODELS=cnn
else
  HOSTS=${HOSTS:-4}; RATES=${RATES:-local 100mbit 1gbit}; REPEATS=${REPEATS:-3}; STEPS=${STEPS:-50}
fi
rm -f "$OUT"/*.jsonl
# one_run RATE MODEL EXCHANGE REPEAT: one training run, its JSON line appended to OUT/RATE.jsonl.
one_run() {
  local launch=(mpirun -np "$HOSTS" -x MASTER_ADDR=127.0.0.1)
  if [ "$1" != local ]; then
    launch=("$ROOT/pipelines/cluster.sh" run -np "$HOSTS" -- -x MASTER_ADDR="$master" -x GLOO_SOCKET_IFNAME=eth0)
  fi
  run "${launch[@]}" -x MASTER_PORT=29517 -x OMP_NUM_THREADS=1 \
    "$TPY" "$ROOT/pipelines/torch_bench.py" --model "$2" --exchange "$3" --density 0.01 \
    --steps "$STEPS" --repeat "$4" --seed "$4" --out "$OUT/$1.jsonl"
}
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
"$TPY" "$ROOT/pipelines/torch_tables.py" "$OUT"/*.jsonl > "$OUT/section.md"
cat "$OUT/section.md"
section torch "$OUT/section.md"
