#!/usr/bin/env bash
# make repro-sim [FAST=1]: SimGrid calibrated and validated against the shaped cluster
# (docs/SIMULATE.md). Per link rate, on a fresh cluster of HOSTS hosts:
#   1. calibration: the ring over sizes 4 B … 64 MiB across 2 hosts (P = 2: one message each
#      way per round, SimGrid's ping-pong in both directions at once) and over small sizes at
#      each other P, recorded (--comm-trace) and replayed on the bare platform; the excess of
#      the measured time gives the per-message overhead α (at each P: it grows with the
#      processes sharing the 2 cores) and SMPI's piecewise bandwidth factors per size
#      (pipelines/sim_tables.py fit);
#   2. validation: every algorithm bench runs (ring, rabenseifner, topka, topkdsa, gtopk,
#      gaussiank, oktopk, onebit; deft, cltk and topk-union on dense input) and EmbRace's
#      AlltoAlls and its AllGather baseline (gradtrain) at P = 2, 4 and 8, recorded and replayed with the fitted factors, the per-message
#      overhead as SMPI's send/receive overheads, and the recorded compute;
#   3. the table simulated vs measured vs α-β (docs/RESULTS.md section "sim-validation").
# Steps 1–2 run REPEATS times (default 3), interleaved: repeat r of both rates before repeat
# r + 1, each a complete calibration and validation in $OUT/rR/; the table gives every ratio
# as the median (min–max) over the repeats, each taken within its repeat.
# Needs root (docs/CLUSTER.md). Outputs in data/out/sim/ (FAST=1: data/out/sim-fast/, 2 hosts,
# one rate, tiny sizes).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/sim
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/sim-fast
# REUSE=1: keep the runs already in $OUT, redo the replays and rewrite the table and section;
# REUSE=2: keep the replays too.
REUSE=${REUSE:-0}
REPEATS=${REPEATS:-3}
[ "$FAST" != 0 ] && REPEATS=1
[ "$REUSE" = 0 ] && rm -rf "$OUT"
mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES="1gbit"; PS="2"; CAL_SIZES=4K:256K; CAL_FACTOR=4; CAL_ITERS=3; ITERS=2; SIZE=64K
  DENSE="ring"; SPARSE="oktopk"; DEFT=""
else
  # The calibration's sizes double (a factor per power of 2 of the message size): the sparse
  # calls' messages (tens of KiB) fall between 4-fold sizes where the token bucket's burst
  # makes the factor change fastest (docs/SIMULATE.md, "Calibration").
  HOSTS=8; RATES="100mbit 1gbit"; PS="2 4 8"; CAL_SIZES=4:64M; CAL_FACTOR=2; CAL_ITERS=5; ITERS=9; SIZE=4M
  DENSE="ring,rabenseifner,onebit"; SPARSE="topka,topkdsa,gtopk,gaussiank,oktopk"
  DEFT="deft,cltk,topk-union"  # these select for themselves: dense input
fi
QUIET_TRIES=12; [ "$FAST" != 0 ] && QUIET_TRIES=0
# tbf's burst: 1 ms of the rate (at least 16 KiB) instead of the cluster's default 2 ms / 64 KiB.
# A message that fits in the burst passes at memory speed, which neither a real NIC nor
# SimGrid's links do; with 64 KiB at 100 Mbit/s, Top-k's 40 KiB messages went 2.7× faster than
# the rate. At 1 Gbit/s 1 ms is 125 KB, which a sparse call's 84 KB messages still fit in after
# the compute before the call; 16 KiB there (CLUSTER_BURST=16384, tried on 2026-11-27) fixes
# P = 2 but the 16 small buckets of 8 hosts then cost more CPU than 2 cores have, and the
# shaped links fall to a quarter of their P = 2 speed (docs/SIMULATE.md, "Calibration").
export CLUSTER_BURST=${CLUSTER_BURST:-1ms}
EMB_STEPS=$(( ITERS + 1 ))   # EmbRace's AlltoAlls: gradtrain steps, the first left out
# The overhead per message at every P, from the ring over small sizes (64 B … 4 KiB).
SMALL_SIZES=64:4K
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee section.md >&2
  exit 0
fi
T0=$(date +%s)

# quiet: wait (at most a minute) for the 1-minute load to fall below 1.5, and log it: the
# measured side is the machine's 2 shared cores.
quiet() {
  local i
  for i in $(seq $QUIET_TRIES); do
    awk '{exit !($1 < 1.5)}' /proc/loadavg && break
    sleep 5
  done
  echo "$1 $(cut -d' ' -f1 /proc/loadavg)" >> load.log
}

on_cluster() {
  # 1. Calibration: the ring over sizes across 2 hosts (SimGrid's ping-pong calibration, both
  # ways at once), and over small sizes at every other P of the validation (the per-message
  # cost where P processes share the machine's cores).
  quiet cal-$RATE-p2
  launch 2 $B/gradallreduce bench --algo ring --sizes $CAL_SIZES --factor $CAL_FACTOR --warmup 1 \
    --iters $CAL_ITERS --format csv --comm-trace cal-$RATE-p2.parquet > cal-$RATE-p2.csv
  for p in $PS; do
    [ $p = 2 ] && continue
    quiet small-$RATE-p$p
    launch $p $B/gradallreduce bench --algo ring --sizes $SMALL_SIZES --factor 4 --warmup 1 \
      --iters $ITERS --format csv --comm-trace small-$RATE-p$p.parquet > small-$RATE-p$p.csv
  done
  # 2. Validation runs, one process per host (P = 2 uses 2 of the hosts).
  for p in $PS; do
    quiet val-$RATE-p$p
    launch $p $B/gradallreduce bench --algo $DENSE,$SPARSE --input topk --sizes $SIZE:$SIZE \
      --warmup 1 --iters $ITERS --density 0.01 --format csv --comm-trace val-$RATE-p$p.parquet \
      > val-$RATE-p$p.csv
    if [ -n "$DEFT" ]; then
      launch $p $B/gradallreduce bench --algo $DEFT --input dense --sizes $SIZE:$SIZE \
        --warmup 1 --iters $ITERS --density 0.01 --format csv \
        --comm-trace deft-$RATE-p$p.parquet > deft-$RATE-p$p.csv
    fi
    # EmbRace's AlltoAlls in gradtrain (transformer-lm, an embedding of 4096 × 64), and its
    # AllGather baseline (the embedding's sparse rows allgathered) on the same model.
    [ "$FAST" != 0 ] && continue
    local kind ex
    for kind in emb embag; do
      ex=(embrace --schedule fifo); [ $kind = embag ] && ex=(allgather)
      launch $p $B/gradtrain --model transformer-lm --data synthetic-lm --vocab 4096 --tokens 40000 \
        --d-model 64 --layers 1 --heads 4 --seq-len 32 --batch 13 --steps $EMB_STEPS \
        --optimizer sgd --lr 0.05 --exchange "${ex[@]}" -q --comm-trace $PWD/$kind-$RATE-p$p.parquet
    done
  done
}

# replays RATE: the calibration's bare replays, the fits (medians, and fastest calls) and the
# validation runs replayed with each.
replays() {
  local p kind env out
  local bare=(--link-rate $RATE --latency 0us --compute recorded --no-phases --format csv)
  run $B/gradreport simulate cal-$RATE-p2.parquet "${bare[@]}" > calsim-$RATE-p2.csv
  for p in $PS; do
    local small=()
    if [ $p != 2 ]; then
      run $B/gradreport simulate small-$RATE-p$p.parquet "${bare[@]}" > smallsim-$RATE-p$p.csv
      small=(smallsim-$RATE-p$p.csv $p)
    fi
    python3 "$ROOT/pipelines/sim_tables.py" fit calsim-$RATE-p2.csv 2 "${small[@]}" > fit-$RATE-p$p.env
    python3 "$ROOT/pipelines/sim_tables.py" fit calsim-$RATE-p2.csv 2 "${small[@]}" --fastest \
      > fitfast-$RATE-p$p.env
    for kind in val deft emb embag; do
      [ -f $kind-$RATE-p$p.parquet ] || continue
      local phases=(--no-phases)
      [[ $kind == emb* ]] && phases=()
      for env in fit fitfast; do
        source $env-$RATE-p$p.env  # LATENCY (α/2), OVERHEAD_S (α/2) and BW_FACTOR
        out=sim; [ $env = fitfast ] && out=simfast
        # Calibrated: the link (latency 0, the fitted factors) and α as SMPI's per-message
        # send (isend) and receive overheads, which a rank pays one message after another.
        run $B/gradreport simulate $kind-$RATE-p$p.parquet --link-rate $RATE --latency 0us \
          --bw-factor "$BW_FACTOR" --smpi-cfg "smpi/ois:0:$OVERHEAD_S:0" \
          --smpi-cfg "smpi/os:0:$OVERHEAD_S:0" --smpi-cfg "smpi/or:0:$OVERHEAD_S:0" \
          --compute recorded "${phases[@]}" --format csv > $out-$kind-$RATE-p$p.csv
      done
      source fit-$RATE-p$p.env
      # Bare: α as link latency (the α-β column uses the same α), factors 1.
      run $B/gradreport simulate $kind-$RATE-p$p.parquet --link-rate $RATE --latency $LATENCY \
        --compute recorded "${phases[@]}" --format csv > bare-$kind-$RATE-p$p.csv
    done
  done
}

DIRS=$(seq -f 'r%g' "$REPEATS")
for R in $DIRS; do
  for RATE in $RATES; do
    mkdir -p "$OUT/$R" && cd "$OUT/$R"
    # REUSE=1: measure only a rate whose runs are not all there; the replays are redone.
    if [ "$REUSE" = 0 ] || [ ! -f val-$RATE-p${PS##* }.parquet ]; then
      with_cluster $HOSTS $RATE on_cluster
    fi
  done
done
# Replays run with nothing else of ours running, after every measurement (REUSE=2: keep them).
for R in $DIRS; do
  cd "$OUT/$R"
  for RATE in $RATES; do
    [ "$REUSE" = 2 ] || replays
  done
done
cd "$OUT"

{
  echo "Made by \`make repro-sim$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/sim.sh) on $(date -u +%F),"
  echo "SimGrid $(dpkg-query -W -f='${Version}' libsimgrid-dev 2>/dev/null || echo '?'), $HOSTS shaped hosts (tbf burst $(case $CLUSTER_BURST in *ms) echo "$CLUSTER_BURST of the rate, at least 16 KiB" ;; *) echo "$CLUSTER_BURST B" ;; esac)) on $(nproc) shared cores;"
  [ "$REUSE" != 0 ] && echo -n "REUSE=$REUSE: this text rewritten from the runs' files. " || echo -n "wall time $(( $(date +%s) - T0 )) s. "
  [ "$REPEATS" = 1 ] && echo "One repeat (${OUT#$ROOT/}/r1/)." ||
    echo "$REPEATS interleaved repeats (${OUT#$ROOT/}/rR/), each a calibration and a validation of its own."
  echo "Per row and repeat, medians over $ITERS recorded calls of $SIZE per rank"
  echo "(sparse: density 0.01, pre-selected input; DEFT selects for itself): the measured wall time"
  echo "of the call on its slowest rank (as bench times it, every call between two barriers), its calibrated replay (fitted α and"
  echo "bandwidth factors, the recorded compute), the bare replay (fitted α, factors 1) and the α-β"
  echo "model on the recorded messages with the fitted α. EmbRace: its two AlltoAlls (lookup and"
  echo "gradient phases) in $ITERS gradtrain steps (transformer-lm, 4096 × 64 embedding, batch 13 × 32);"
  echo "AllGather: the same model's embedding rows allgathered (gradtrain --exchange allgather)."
  echo "The cells are the median (min–max) over the repeats where these differ; every ratio is"
  echo "taken within its repeat first."
  echo "1-minute load when each measurement started (it waits up to a minute for < 1.5): median"
  cat r*/load.log | python3 -c "import sys; sys.path.insert(0, '$ROOT/pipelines'); from spread import spread; v = [float(l.split()[1]) for l in sys.stdin]; print(spread(v, '{:.2f}'), 'over', len(v), 'measurements (rR/load.log).')"
  echo
  python3 "$ROOT/pipelines/sim_tables.py" table --rates "$RATES" --ps "$PS" --repeats "$DIRS"
} > section.md
section sim-validation section.md
cat section.md
