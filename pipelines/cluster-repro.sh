#!/usr/bin/env bash
# make repro-cluster [FAST=1]: the papers' time claims measured across shaped hosts
# (docs/CLUSTER.md, issue 15 points 3–4). Per link rate, on a fresh cluster of HOSTS hosts:
#   1. the α-β calibration: `gradallreduce bench --fit` (ring) at P = 2, 4 and 8 ranks;
#   2. gradtrain's step split compute / selection / communication for dense (ring), TopkA,
#      TopkDSA, gTopk, Gaussiank, Ok-Topk and DEFT, one process per host (P = HOSTS), plus
#      MPI_Allreduce (`native`) of the same gradient size timed by bench;
#   3. LAMB (dense ring) vs 1-bit LAMB (compressed allreduce after --freeze-step);
#   4. EmbRace (--schedule embrace and fifo) vs sparse AllGather vs dense on the transformer LM,
#      time per step and the stall the schedule removes (section "cluster-embrace");
#   5. (with 2.) Ok-Topk and gTop-k on dense vs pre-selected input, each rank's own gradient
#      (`gradallreduce bench --algo oktopk,gtopk`, issue 19), one process per host.
# Steps 2–5 run REPEATS times (default 3), interleaved: repeat r of every configuration before
# repeat r+1, each repeat's files in rR/; the α-β fit (step 1) runs once per rate. The tables of
# each repeat (rR/section.md) are merged by pipelines/merge_repeats.py: every number that
# differs between repeats is printed as the median over repeats (min–max).
# REUSE=1 measures nothing: it rewrites the sections from the files of the last run.
# PARTS="cal train lamb embrace" (the default) runs all; PARTS=embrace runs step 4 alone (with
# the α-β fit at P = HOSTS that its predictions need) and rewrites only its section.
# pipelines/cluster-tables.py turns the metrics into the tables of docs/RESULTS.md "cluster",
# each with the α-β prediction (fitted on this cluster at P = HOSTS) beside the measurement.
# Needs root; outputs in data/out/cluster/ (FAST=1: data/out/cluster-fast/; 2 hosts, one rate,
# tiny sizes, < 10 s).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/cluster
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/cluster-fast  # a FAST run keeps the full run's files
PARTS=${PARTS:-cal train lamb embrace}
REPEATS=${REPEATS:-3}
has() { [[ " $PARTS " == *" $1 "* ]]; }
MAIN=0; { has cal || has train || has lamb; } && MAIN=1
REUSE=${REUSE:-0}  # REUSE=1: no measurement, the sections rewritten from the files of the last run
if [ "$REUSE" = 0 ]; then
  if [ $MAIN = 1 ]; then rm -rf "$OUT"; fi
  mkdir -p "$OUT" && cd "$OUT" && rm -f r*/emb-* load-emb.txt
else
  cd "$OUT" || { echo "error: REUSE=1: no $OUT from an earlier make repro-cluster" >&2; exit 1; }
fi
# Every sparse exchange of the headline, dense first (the target of time-to-loss).
EXCH="dense topk topkdsa gtopk gaussiank oktopk deft"
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES="1gbit"; PS="2"; CAL_SIZES=4K:1M; ITERS=2; STEPS=6; SPARSE_STEPS=8; BATCH=16
  HIDDEN=128; EXCH="dense oktopk"; LAMB_STEPS=6; FREEZE=3; STEPS8=0; OK_SIZE=1M
  EMB_STEPS=0  # step 4 is skipped in FAST (its LM needs ≈ 1 min per rate to mean anything)
else
  # MLP 64-1024-1024-10 (n = 1.13 M parameters, 4.5 MB of gradient): a dense ring step sends
  # 6.8 MB per host, i.e. ≈ 0.55 s at 100 Mbit/s and 0.055 s at 1 Gbit/s against ≈ 0.05–0.1 s of
  # compute on this machine — communication:compute measured 7–10 and 1.1–1.2, the two ends of
  # the papers' range (Ok-Topk Fig. 12, 1-bit LAMB Table 5).
  # Sparse runs go on to SPARSE_STEPS to show when they reach the dense run's final loss; P = 8
  # runs (two ranks per host) of the sparse exchanges only, STEPS8 steps.
  HOSTS=4; RATES="100mbit 1gbit"; PS="2 4 8"; CAL_SIZES=4K:16M; ITERS=3; STEPS=100; SPARSE_STEPS=200
  BATCH=32; HIDDEN=1024; LAMB_STEPS=40; FREEZE=10; STEPS8=50
  # Step 5: 64 MiB of gradient per rank (16.8 M elements, k = 1 %), as make bench on one host.
  OK_SIZE=64M
  # Step 4: transformer-lm (d 64, 2 blocks, context 32) on synthetic-lm at V = 4096, batch 8
  # sequences (256 tokens) per rank: n = 636 k parameters, of which the token embedding
  # (V·d = 262 k, 1 MB) is the part EmbRace exchanges sparsely (≈ 170 distinct rows a step, 4 %
  # of V) and lm_head (V·d, dense in every exchange) is most of the rest. A dense ring step
  # sends 3.8 MB per host (0.3 s at 100 Mbit/s, 30 ms at 1 Gbit/s) against ≈ 0.1 s of compute:
  # comm:compute ≈ 3 and ≈ 0.3–0.5, and the embedding is 41 % of dense's bytes.
  EMB_V=4096; EMB_D=64; EMB_BATCH=8; EMB_STEPS=30
fi
EMB_V=${EMB_V:-0}; EMB_D=${EMB_D:-0}; EMB_BATCH=${EMB_BATCH:-0}
P=$HOSTS
MODEL="--model mlp --data digits --hidden $HIDDEN"
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee section.md >&2
  # A full run keeps the measured section of docs/RESULTS.md; FAST leaves the reason beside it.
  [ "$FAST" != 0 ] && section cluster section.md
  exit 0
fi

on_cluster() {
  # 1. α-β calibration across the hosts at each P (P = 8: two ranks per host); step 4 alone
  # needs only P = HOSTS.
  local cal_ps=$PS
  has cal || cal_ps=$P
  for p in $cal_ps; do
    launch $p $B/gradallreduce bench --algo ring --sizes $CAL_SIZES --factor 4 --warmup 1 \
      --iters $ITERS --fit --metrics cal-$RATE-p$p.parquet > cal-$RATE-p$p.md 2> cal-$RATE-p$p.err
  done
  local rep
  for rep in $(seq 1 "$REPEATS"); do
    R=r$rep/ && mkdir -p r$rep
    has train && train_runs
    has lamb && lamb_runs
    has embrace && [ "$EMB_STEPS" != 0 ] && embrace_runs
  done
  return 0
}

train_runs() {
  # 2. headline runs (the order is the same at every rate; load is recorded per run).
  local steps
  for ex in $EXCH; do
    local dens=(--density 0.01) steps=$SPARSE_STEPS
    [ $ex = dense ] && dens=() steps=$STEPS
    echo "${R%/} $ex P=$P $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
    launch $P $B/gradtrain $MODEL --steps $steps --batch $BATCH --optimizer sgd --lr 0.1 \
      --exchange "$(exchange_of "$ex")" "${dens[@]}" -q --run $ex-$RATE --metrics ${R}train-$ex-$RATE.parquet
  done
  if [ "$STEPS8" != 0 ]; then
    for ex in $EXCH; do
      [ $ex = dense ] && continue
      echo "${R%/} $ex P=$((2 * P)) $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
      launch $((2 * P)) $B/gradtrain $MODEL --steps $STEPS8 --batch $BATCH --optimizer sgd \
        --lr 0.1 --exchange "$(exchange_of "$ex")" --density 0.01 -q --run $ex-p8-$RATE --metrics ${R}train8-$ex-$RATE.parquet
    done
  fi
  # MPI_Allreduce of the same gradient (bytes = 4n), the dense-native row's communication.
  local nb
  nb=$("$PY" -c 'import sys,pyarrow.parquet as pq; t=pq.read_table(sys.argv[1]).to_pydict(); print(4*int(max(v for m,v in zip(t["metric"],t["value"]) if m=="nnz")))' ${R}train-dense-$RATE.parquet)
  launch $P $B/gradallreduce bench --algo native,ring --sizes $nb:$nb --warmup 1 --iters $ITERS \
    --metrics ${R}native-$RATE.parquet > ${R}native-$RATE.md 2> ${R}native-$RATE.err
  # 5. Ok-Topk's own selection against its exchange: dense vs pre-selected input.
  echo "${R%/} okinput P=$P $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
  launch $P $B/gradallreduce bench --algo oktopk,gtopk --sizes $OK_SIZE:$OK_SIZE --warmup 2 \
    --iters $((ITERS * 3)) --metrics ${R}okinput-$RATE.parquet > ${R}okinput-$RATE.md 2> ${R}okinput-$RATE.err
}

lamb_runs() {
  # 3. LAMB vs 1-bit LAMB.
  echo "${R%/} lamb $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
  launch $P $B/gradtrain $MODEL --steps $LAMB_STEPS --batch $BATCH --optimizer lamb --lr 0.01 \
    --exchange ring -q --run lamb-$RATE --metrics ${R}lamb-$RATE.parquet
  echo "${R%/} onebit-lamb $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt
  launch $P $B/gradtrain $MODEL --steps $((LAMB_STEPS * 3 / 2)) --batch $BATCH --optimizer onebit-lamb \
    --lr 0.01 --exchange onebit --freeze-step $FREEZE -q --run onebit-lamb-$RATE \
    --metrics ${R}onebitlamb-$RATE.parquet
}

embrace_runs() {
  # 4. EmbRace vs AllGather vs dense, and EmbRace's schedule vs fifo, one process per host.
  # SGD (no momentum): the row-wise update makes all four runs train identically.
  local run ex sch
  for run in dense allgather embrace-fifo embrace-embrace; do
    ex=${run%%-*} sch=()
    [ $ex = embrace ] && sch=(--schedule ${run#*-})
    echo "${R%/} emb-$run P=$P $RATE $(cut -d' ' -f1-3 /proc/loadavg)" >> load-emb.txt
    launch $P $B/gradtrain --model transformer-lm --data synthetic-lm --vocab $EMB_V \
      --tokens 100000 --d-model $EMB_D --batch $EMB_BATCH --steps $EMB_STEPS --optimizer sgd \
      --lr 0.1 --exchange "$(exchange_of "$ex")" "${sch[@]}" -q --run $run-$RATE --metrics ${R}emb-$run-$RATE.parquet
  done
}

# per_repeat FILE ARGS…: cluster-tables.py ARGS in each repeat's directory (beside the α-β fit's
# files of step 1), written to rR/FILE, then the repeats merged (median (min–max) of every number
# that differs) on stdout, after a line saying how many repeats.
per_repeat() {
  local file=$1 d
  shift
  for d in $(seq 1 "$REPEATS"); do
    (cd r$d && ln -sf ../cal-*.parquet ../cal-*.md . 2>/dev/null) || true
    (cd r$d && "$PY" "$ROOT/pipelines/cluster-tables.py" "$@") > r$d/$file
  done
  echo "Every number that differed between the $REPEATS interleaved repeats (each run once per repeat,"
  echo "repeat r of every configuration before repeat r + 1) is the median over the repeats with its"
  echo "min–max in parentheses, each ratio computed within its repeat first; the repeats' own tables are"
  echo "data/out/cluster/r1…r$REPEATS/$file (pipelines/merge_repeats.py)."
  echo
  "$PY" "$ROOT/pipelines/merge_repeats.py" $(seq -f "r%g/$file" 1 "$REPEATS")
}

T0=$(date +%s)
UP0=$(uptime)
if [ "$REUSE" = 0 ]; then
  for RATE in $RATES; do
    with_cluster $HOSTS $RATE on_cluster
  done
fi
if has embrace && [ "$EMB_STEPS" != 0 ]; then
  [ "$REUSE" = 0 ] && {
  echo "Made by \`make repro-cluster\` (pipelines/cluster-repro.sh, step 4; \`PARTS=embrace\` runs it alone) on"
  echo "$(date -u +%F), $(nproc) cores shared by every rank and by other jobs; $HOSTS hosts, links shaped both ways."
  echo "Load (uptime) at the start: \`${UP0##*load average: }\`, at the end: \`$(uptime | sed 's/.*load average: //')\`;"
  echo "1-minute load average at the start of each run: $(awk '{print $(NF-2)}' load-emb.txt | sort -n | sed -n '1p;$p' | paste -sd- )"
  echo "(per run in data/out/cluster/load-emb.txt). Wall time: $(( $(date +%s) - T0 )) s$( [ $MAIN = 1 ] && echo ' (all steps)')."
  echo
  } > header-embrace.md
  { cat header-embrace.md
  per_repeat section-embrace.md --part embrace --hosts $HOSTS --rates "$RATES" --ps "$P" \
    --emb-v $EMB_V --emb-d $EMB_D --emb-batch $EMB_BATCH --emb-steps $EMB_STEPS --fast $FAST
  } > section-embrace.md
  section cluster-embrace section-embrace.md
  expect section-embrace.md "^\| dense " "^\| embrace-embrace " "^\| embrace-fifo " "^### Verdict"
  cat section-embrace.md
fi
[ $MAIN = 1 ] || exit 0
[ "$REUSE" = 0 ] && {
echo "Made by \`make repro-cluster$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/cluster-repro.sh) on $(date -u +%F), $(nproc) cores"
echo "shared by every rank and by other jobs; $HOSTS hosts, links shaped to each rate both ways."
echo "Load (uptime) at the start: \`${UP0##*load average: }\`, at the end: \`$(uptime | sed 's/.*load average: //')\`;"
echo "1-minute load average at the start of each run: $(awk '{print $(NF-2)}' load.txt | sort -n | sed -n '1p;$p' | paste -sd- ) (per run in"
echo "data/out/cluster/load.txt). Wall time of the whole reproduction: $(( $(date +%s) - T0 )) s."
echo
} > header.md
{ cat header.md
per_repeat section.md --hosts $HOSTS --rates "$RATES" --ps "$PS" \
  --exch "$EXCH" --freeze $FREEZE --model "$MODEL" --steps $STEPS --batch $BATCH \
  --sparse-steps $SPARSE_STEPS --steps8 $STEPS8 --lamb-steps $LAMB_STEPS --cal-sizes $CAL_SIZES --fast $FAST
} > section.md
section cluster section.md
expect section.md "^### α-β calibration" "^\| dense " "^\| oktopk " "^### 1-bit LAMB" \
  "^### Ok-Topk on dense vs pre-selected input"
cat section.md
