#!/usr/bin/env bash
# make repro-embrace-fig7 [FAST=1]: EmbRace Fig. 7 where the paper wins — an embedding-dominated
# LM trained across the shaped cluster (docs/CLUSTER.md), one process per host, with dense
# (ring), allgather-raw (one row per token, Horovod/DDP), allgather (rows coalesced) and
# embrace under the fifo, embrace and 2d schedules, interleaved REPS times; the step time at
# equal compute and the stall beside the paper's 1.02–2.41× (pipelines/embrace_fig7.py).
# Model: lstm-lm, d = 256, LSTM hidden 8, context 16, on a Zipf(1.1) stream over V = 100k ids:
# the token embedding (V·d = 25.6 M) is 96 % of the 26.5 M parameters (the untied head is
# V × 8 plus its bias; the LSTM 4·8·(256 + 8 + 2)). Needs root; without it the step says why and is skipped. Outputs in
# data/out/embrace-fig7/ (FAST=1: data/out/embrace-fig7-fast/; 2 hosts, one rate, V = 5000).
# REUSE=1: keep the runs in the output folder and rewrite the tables, figures and section.
source "$(dirname "$0")/lib.sh"
out_dir embrace-fig7
if [ "$FAST" != 0 ]; then
  HOSTS=2; RATES="1gbit"; PS="2"; V=5000; D=32; REPS=1; STEPS=3; SKIP=1
else
  HOSTS=8; RATES="100mbit 1gbit"; PS="4 8"; V=100000; D=256; REPS=${REPS:-3}; STEPS=5; SKIP=2
fi
HIDDEN=8; SEQ=16; BATCH=16; NTOK=400000
CFGS="dense allgather-raw allgather embrace-fifo embrace-embrace embrace-2d"
if ! why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  echo "skipped: ${why#error: }" | tee section.md >&2
  [ "$FAST" != 0 ] && section embrace-fig7 section.md
  exit 0
fi
T0=$(date +%s)

# One repeat runs every configuration once, in the same order, so that the repeats
# interleave the configurations (a load swing hits all of them, not one).
on_cluster() {
  local p rep cfg ex sch
  for p in $PS; do
    for rep in $(seq $REPS); do
      for cfg in $CFGS; do
        ex=${cfg%%-*} sch=()
        [ $ex = embrace ] && sch=(--schedule ${cfg#*-})
        case $cfg in dense) ex=ring ;; allgather*) ex=$cfg ;; esac
        echo "$RATE p$p $cfg r$rep $(cut -d' ' -f1 /proc/loadavg)" >> load.log
        launch $p $B/gradtrain --model lstm-lm --data $PWD/zipf-$V.parquet --d-model $D \
          --hidden $HIDDEN --seq-len $SEQ --batch $BATCH --steps $STEPS --optimizer sgd --lr 0.05 \
          --exchange "$(exchange_of "$ex")" "${sch[@]}" -q --run $cfg-r$rep \
          --metrics $PWD/emb7-$RATE-p$p-$cfg-r$rep.parquet
      done
    done
  done
}
if [ "$REUSE" = 0 ]; then
  "$PY" "$ROOT/pipelines/zipf_tokens.py" $V $NTOK zipf-$V.parquet
  for RATE in $RATES; do
    with_cluster $HOSTS $RATE on_cluster
  done
  echo $(( $(date +%s) - T0 )) > wall_s.txt
fi
# Figures: compute / select / comm per step of every configuration at each P, first repeat.
for RATE in $RATES; do
  run $B/gradreport plot breakdown emb7-$RATE-p*-r1.parquet -o fig7-$RATE.svg >&2
done

{
  echo "Made by \`make repro-embrace-fig7$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/embrace-fig7.sh) on $(date -u +%F),"
  echo -n "$HOSTS shaped hosts on $(nproc) shared cores, one process per host; "
  echo -n "wall time $(cat wall_s.txt) s"
  [ "$REUSE" != 0 ] && echo " (REUSE=1: this text rewritten from the runs' files)." || echo "."
  echo "\`cluster.sh run -np P -- gradtrain --model lstm-lm --data zipf-$V.parquet --d-model $D --hidden $HIDDEN"
  echo "--seq-len $SEQ --batch $BATCH --steps $STEPS --optimizer sgd --lr 0.05 --exchange EX [--schedule S]\`:"
  echo "a Zipf(1.1) stream over V = $V ids, $((BATCH * SEQ)) tokens per rank and step; the token embedding"
  echo "(V·d = $((V * D))) is $(( 100 * V * D / (V * D + V * HIDDEN + V + 4 * HIDDEN * (D + HIDDEN + 2)) )) % of the parameters."
  echo "Configurations interleaved, $REPS repeat(s); per run the median over steps ≥ $SKIP of the slowest"
  echo "rank's step and of the rank means of compute, stall (step − compute − update) and"
  echo "communication; per configuration the median over the repeats (min–max). 1-minute load at"
  echo "the start of the runs: $(awk '{print $5}' load.log | sort -n | sed -n '1p;$p' | paste -sd-) (per run in data/out/$(basename "$OUT")/load.log)."
  echo "The paper: 16 RTX 3090s over 100 Gbps InfiniBand, EmbRace 1.02–2.41× faster than the"
  echo "baselines (Horovod's AllReduce, AllGather, Parallax-style hybrids) end to end (Fig. 7)."
  echo
  "$PY" "$ROOT/pipelines/embrace_fig7.py" . --rates "$RATES" --ps "$PS" --skip $SKIP
  echo
  echo "Figures (compute, selection and communication per step, the first repeat):"
  figs=""
  for RATE in $RATES; do figs="$figs${figs:+, }data/out/$(basename "$OUT")/fig7-$RATE.svg"; done
  echo "$figs."
} > section.md
section embrace-fig7 section.md
expect section.md "^\| dense \|" "^\| allgather-raw \|" "^\| embrace-2d \|" "^### Verdict" \
  "speedup at equal compute"
cat section.md
