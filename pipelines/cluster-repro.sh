#!/usr/bin/env bash
# make repro-cluster [FAST=1]: the papers' time claims measured across shaped hosts
# (docs/CLUSTER.md, issue 15 points 3–4). Per link rate, on a fresh cluster of HOSTS hosts:
#   1. the α-β calibration: `gradallreduce bench --fit` (ring) at P = 2, 4 and 8 ranks;
#   2. gradtrain's step split compute / selection / communication for dense (ring), TopkA,
#      TopkDSA, gTopk, Gaussiank, Ok-Topk and DEFT, one process per host (P = HOSTS), plus
#      MPI_Allreduce (`native`) of the same gradient size timed by bench;
#   3. LAMB (dense ring) vs 1-bit LAMB (compressed allreduce after --freeze-step).
# pipelines/cluster-tables.py turns the metrics into the tables of docs/RESULTS.md "cluster",
# each with the α-β prediction (fitted on this cluster at P = HOSTS) beside the measurement.
# Needs root; outputs in data/out/cluster/. FAST=1: 2 hosts, one rate, tiny sizes (< 1 min).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/cluster
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || PY=python3
# Every sparse exchange of the headline, dense first (the target of time-to-loss).
EXCH="dense topk topkdsa gtopk gaussiank oktopk deft"
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES="1gbit"; PS="2"; CAL_SIZES=4K:1M; ITERS=2; STEPS=6; SPARSE_STEPS=8; BATCH=16
  HIDDEN=128; EXCH="dense oktopk"; LAMB_STEPS=6; FREEZE=3; STEPS8=0
else
  # MLP 64-1024-1024-10 (n = 1.13 M parameters, 4.5 MB of gradient): a dense ring step sends
  # 6.8 MB per host, i.e. ≈ 0.55 s at 100 Mbit/s and 0.055 s at 1 Gbit/s against ≈ 0.05–0.1 s of
  # compute on this machine — communication:compute ≈ 5–10 and ≈ 0.5–1, the two ends of the
  # papers' range (Ok-Topk Fig. 12, 1-bit LAMB Table 5).
  # Sparse runs go on to SPARSE_STEPS to show when they reach the dense run's final loss; P = 8
  # runs (two ranks per host) of the sparse exchanges only, STEPS8 steps.
  HOSTS=4; RATES="100mbit 1gbit"; PS="2 4 8"; CAL_SIZES=4K:16M; ITERS=3; STEPS=100; SPARSE_STEPS=200
  BATCH=32; HIDDEN=1024; LAMB_STEPS=40; FREEZE=10; STEPS8=50
fi
P=$HOSTS
MODEL="--model mlp --data digits --hidden $HIDDEN"
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee section.md >&2
  section cluster section.md
  exit 0
fi

on_cluster() {
  # 1. α-β calibration across the hosts at each P (P = 8: two ranks per host).
  for p in $PS; do
    launch $p $B/gradallreduce bench --algo ring --sizes $CAL_SIZES --factor 4 --warmup 1 \
      --iters $ITERS --fit --metrics cal-$RATE-p$p.parquet > cal-$RATE-p$p.md 2> cal-$RATE-p$p.err
  done
  # 2. headline runs (the order is the same at every rate; load is recorded per run).
  local steps
  for ex in $EXCH; do
    local dens=(--density 0.01) steps=$SPARSE_STEPS
    [ $ex = dense ] && dens=() steps=$STEPS
    echo "$ex P=$P $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
    launch $P $B/gradtrain $MODEL --steps $steps --batch $BATCH --optimizer sgd --lr 0.1 \
      --exchange $ex "${dens[@]}" -q --run $ex-$RATE --metrics train-$ex-$RATE.parquet
  done
  if [ "$STEPS8" != 0 ]; then
    for ex in $EXCH; do
      [ $ex = dense ] && continue
      echo "$ex P=$((2 * P)) $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
      launch $((2 * P)) $B/gradtrain $MODEL --steps $STEPS8 --batch $BATCH --optimizer sgd \
        --lr 0.1 --exchange $ex --density 0.01 -q --run $ex-p8-$RATE --metrics train8-$ex-$RATE.parquet
    done
  fi
  # MPI_Allreduce of the same gradient (bytes = 4n), the dense-native row's communication.
  local nb
  nb=$("$PY" -c 'import sys,pyarrow.parquet as pq; t=pq.read_table(sys.argv[1]).to_pydict(); print(4*int(max(v for m,v in zip(t["metric"],t["value"]) if m=="nnz")))' train-dense-$RATE.parquet)
  launch $P $B/gradallreduce bench --algo native,ring --sizes $nb:$nb --warmup 1 --iters $ITERS \
    --metrics native-$RATE.parquet > native-$RATE.md 2> native-$RATE.err
  # 3. LAMB vs 1-bit LAMB.
  echo "lamb $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
  launch $P $B/gradtrain $MODEL --steps $LAMB_STEPS --batch $BATCH --optimizer lamb --lr 0.01 \
    --exchange dense -q --run lamb-$RATE --metrics lamb-$RATE.parquet
  echo "onebit-lamb $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
  launch $P $B/gradtrain $MODEL --steps $((LAMB_STEPS * 3 / 2)) --batch $BATCH --optimizer onebit-lamb \
    --lr 0.01 --exchange onebit --freeze-step $FREEZE -q --run onebit-lamb-$RATE \
    --metrics onebitlamb-$RATE.parquet
}

T0=$(date +%s)
UP0=$(uptime)
for RATE in $RATES; do
  with_cluster $HOSTS $RATE on_cluster
done
{
echo "Made by \`make repro-cluster$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/cluster-repro.sh) on $(date -u +%F), $(nproc) cores"
echo "shared by every rank and by other jobs; $HOSTS hosts, links shaped to each rate both ways."
echo "Load (uptime) at the start: \`${UP0##*load average: }\`, at the end: \`$(uptime | sed 's/.*load average: //')\`;"
echo "per run in data/out/cluster/load.txt. Wall time of the whole reproduction: $(( $(date +%s) - T0 )) s."
echo
"$PY" "$ROOT/pipelines/cluster-tables.py" --hosts $HOSTS --rates "$RATES" --ps "$PS" \
  --exch "$EXCH" --freeze $FREEZE --model "$MODEL" --steps $STEPS --batch $BATCH \
  --sparse-steps $SPARSE_STEPS --steps8 $STEPS8 --lamb-steps $LAMB_STEPS --cal-sizes $CAL_SIZES --fast $FAST
} > section.md
section cluster section.md
expect section.md "^### α-β calibration" "^\| dense " "^\| oktopk " "^### 1-bit LAMB"
cat section.md
