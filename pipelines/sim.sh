#!/usr/bin/env bash
# make repro-sim [FAST=1]: SimGrid calibrated and validated against the shaped cluster
# (docs/SIMULATE.md). Per link rate, on a fresh cluster of HOSTS hosts:
#   1. calibration: the ring over sizes across 2 hosts (P = 2: one message each way per
#      round, a ping-pong in both directions) and at each P of step 2, recorded (--comm-trace)
#      and replayed on the bare platform; the excess of the measured time gives α (per
#      message) and SMPI's piecewise bandwidth factors per size (pipelines/sim_tables.py fit);
#   2. validation: every algorithm bench runs (ring, rabenseifner, topka, topkdsa, gtopk,
#      gaussiank, oktopk, onebit; deft on dense input) at P = 2 and 4, recorded and replayed
#      with the fitted factors and the recorded compute;
#   3. the table simulated vs measured vs α-β (docs/RESULTS.md section "sim-validation").
# Needs root (docs/CLUSTER.md). Outputs in data/out/sim/ (FAST=1: data/out/sim-fast/, 2 hosts,
# one rate, tiny sizes).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/sim
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/sim-fast
# REUSE=1: keep the runs already in $OUT and only rewrite the table and the section.
REUSE=${REUSE:-0}
[ "$REUSE" = 0 ] && rm -rf "$OUT"
mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES="1gbit"; PS="2"; CAL_SIZES=4K:256K; CAL_ITERS=3; ITERS=2; SIZE=64K
  DENSE="ring"; SPARSE="oktopk"; DEFT=""
else
  HOSTS=4; RATES="100mbit 1gbit"; PS="2 4"; CAL_SIZES=1K:16M; CAL_ITERS=9; ITERS=5; SIZE=4M
  DENSE="ring,rabenseifner,onebit"; SPARSE="topka,topkdsa,gtopk,gaussiank,oktopk"; DEFT="deft"
fi
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee section.md >&2
  exit 0
fi
T0=$(date +%s)

on_cluster() {
  # 1. Calibration: the ring over sizes across 2 hosts (SimGrid's ping-pong calibration, both
  # ways at once) and at every P of the validation (the per-message cost where P processes
  # share the machine's cores).
  for p in $PS; do
    launch $p $B/gradallreduce bench --algo ring --sizes $CAL_SIZES --factor 4 --warmup 1 \
      --iters $CAL_ITERS --format csv --comm-trace cal-$RATE-p$p.parquet > cal-$RATE-p$p.csv
  done
  # 2. Validation runs, one process per host (P = 2 uses 2 of the hosts).
  for p in $PS; do
    launch $p $B/gradallreduce bench --algo $DENSE,$SPARSE --input topk --sizes $SIZE:$SIZE \
      --warmup 1 --iters $ITERS --density 0.01 --format csv --comm-trace val-$RATE-p$p.parquet \
      > val-$RATE-p$p.csv
    if [ -n "$DEFT" ]; then
      launch $p $B/gradallreduce bench --algo $DEFT --input dense --sizes $SIZE:$SIZE \
        --warmup 1 --iters $ITERS --density 0.01 --format csv \
        --comm-trace deft-$RATE-p$p.parquet > deft-$RATE-p$p.csv
    fi
  done
}

for RATE in $RATES; do
  [ "$REUSE" != 0 ] && [ -f fit-$RATE-p${PS##* }.env ] && continue
  with_cluster $HOSTS $RATE on_cluster
  # Replays run with nothing else of ours running: the bare platform first, for the fit.
  for p in $PS; do
    run $B/gradreport simulate cal-$RATE-p$p.parquet --link-rate $RATE --latency 0us \
      --compute recorded --no-phases --format csv > calsim-$RATE-p$p.csv
    python3 "$ROOT/pipelines/sim_tables.py" fit calsim-$RATE-p$p.csv $p > fit-$RATE-p$p.env
    source fit-$RATE-p$p.env  # LATENCY (per link) and BW_FACTOR
    for kind in val deft; do
      [ -f $kind-$RATE-p$p.parquet ] || continue
      run $B/gradreport simulate $kind-$RATE-p$p.parquet --link-rate $RATE --latency $LATENCY \
        --bw-factor "$BW_FACTOR" --compute recorded --no-phases --format csv \
        > sim-$kind-$RATE-p$p.csv
      run $B/gradreport simulate $kind-$RATE-p$p.parquet --link-rate $RATE --latency $LATENCY \
        --compute recorded --no-phases --format csv > bare-$kind-$RATE-p$p.csv
    done
  done
done

{
  echo "Made by \`make repro-sim$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/sim.sh) on $(date -u +%F),"
  echo "SimGrid $(dpkg-query -W -f='${Version}' libsimgrid-dev 2>/dev/null || echo '?'), $HOSTS shaped hosts on $(nproc) shared cores;"
  [ "$REUSE" != 0 ] && echo -n "REUSE=1: this text rewritten from the runs' files. " || echo -n "wall time $(( $(date +%s) - T0 )) s. "
  echo "Per row, medians over $ITERS recorded calls of $SIZE per rank"
  echo "(sparse: density 0.01, pre-selected input; DEFT selects for itself): the measured wall time"
  echo "of the call on its slowest rank (as bench times it), its calibrated replay (fitted α and"
  echo "bandwidth factors, the recorded compute), the bare replay (fitted α, factors 1) and the α-β"
  echo "model on the recorded messages with the fitted α."
  echo
  python3 "$ROOT/pipelines/sim_tables.py" table --rates "$RATES" --ps "$PS"
} > section.md
section sim-validation section.md
cat section.md
