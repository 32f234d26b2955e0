#!/usr/bin/env bash
# make repro-scale, the other three papers and Ok-Topk's weak scaling (docs/SIMULATE.md):
# in-process recordings (ranks as threads, --comm-trace; one algorithm per process, so a
# 256-rank recording holds one algorithm's buffers) replayed by `gradreport simulate` on
# platforms after each paper's cluster, communication only (--compute none):
#   deft     DEFT vs Top-k (topk-union) and CLT-k: DEFT's LSTM (gradtrace --shape lstm, shrunk
#            ×0.05 and scaled back), density 0.001, P = 16 and 32 on 8 nodes × 4 GPUs;
#   onebit   1-bit LAMB (onebit) vs LAMB's fp16 ring allreduce, scaled to BERT-Large,
#            P = 16…256 on its Ethernet (4.1 Gbit/s, 4 GPUs/node) and InfiniBand (100 Gbit/s,
#            8 GPUs/node) clusters, beside its Table 2 allreduce times;
#   embrace  EmbRace's AlltoAll vs the AllGather and dense AllReduce exchanges (gradtrain's
#            transformer-lm), embedding scaled to GNMT-8's, P = 4, 8, 16 on 4 GPUs/node;
#   weak     Ok-Topk's weak-scaling efficiency 32 → 256 (its definition: time at 32 over time
#            at P, per-rank work fixed), communication side, scaled to its BERT, on the
#            Aries dragonfly of pipelines/scale.sh.
# PARTS="deft onebit …" picks parts; REUSE=1 keeps recordings and replays already in $OUT and
# only rewrites the sections; FAST=1: small P, a quick check of the pipeline.
source "$(dirname "$0")/lib.sh"
PARTS=${PARTS:-"deft onebit embrace weak"}
out_dir scale-papers
TABLES=("$ROOT/pipelines/scale_papers.py")
if [ "$FAST" != 0 ]; then
  DEFT_PS="4"; ONEBIT_PS="8"; EMB_PS="4"; WEAK_PS="8 16"
else
  DEFT_PS="16 32"; ONEBIT_PS="16 32 64 128 256"; EMB_PS="4 8 16"; WEAK_PS="32 64 128 256"
fi

# timed NAME CMD…: run CMD (echoed) unless REUSE=1 found NAME.time; its wall time and peak
# memory go to NAME.time.
timed() {
  local name=$1
  shift
  [ "$REUSE" != 0 ] && [ -f "$name.time" ] && return 0
  printf '+ %s\n' "$*" | sed "s#$B/##g" >&2
  /usr/bin/time -f "%e %M" -o "$name.tmp" "$@"
  mv "$name.tmp" "$name.time"
}

# replay NAME REC SCALE PLATFORM…: NAME.csv, the step totals of REC replayed (no phases).
replay() {
  local name=$1 rec=$2 scale=$3
  shift 3
  timed "$name" $B/gradreport simulate "$rec" "$@" --scale-bytes "$scale" --compute none \
    --no-phases --format csv -o "$name.csv" > /dev/null
}

part_deft() {
  local p a
  for p in $DEFT_PS; do
    [ "$REUSE" != 0 ] && [ -f lstm-p$p.done ] || {
      run $B/gradtrace synthetic --shape lstm --scale 0.05 --ranks $p --steps 2 --seed 1 -q \
        -o lstm-p$p.parquet
      for a in deft topk-union cltk; do
        timed rec-deft-$a-p$p $B/gradallreduce --algo $a --density 0.001 lstm-p$p.parquet \
          -o /dev/null -q --comm-trace deft-$a-p$p.parquet > /dev/null
      done
      rm lstm-p$p.parquet && touch lstm-p$p.done
    }
    for a in deft topk-union cltk; do
      # DEFT's interconnect is not stated: a 10 Gbit/s and a 100 Gbit/s one, 4 GPUs per node.
      replay sim-deft-$a-p$p-10g deft-$a-p$p.parquet "$DEFT_SCALE" --link-rate 10Gbps \
        --latency 5us --hosts-per-node 4
      replay sim-deft-$a-p$p-100g deft-$a-p$p.parquet "$DEFT_SCALE" --link-rate 100Gbps \
        --latency 1us --hosts-per-node 4
    done
  done
}

part_onebit() {
  local p a
  for p in $ONEBIT_PS; do
    for a in ring onebit; do
      # LAMB sends fp16: the f32 ring's messages at half the scale (its sizes are linear in the
      # buffer; ring-fp16 itself rounds 128 ranks' sums past bench's correctness check).
      local sc=$ONEBIT_SCALE
      [ $a = ring ] && sc=$(python3 -c "print($ONEBIT_SCALE / 2)")
      timed rec-ob-$a-p$p $B/gradallreduce bench --algo $a --sizes 4M:4M --warmup 0 --iters 1 \
        --ranks $p --format csv -q --comm-trace ob-$a-p$p.parquet > rec-ob-$a-p$p.csv
      # 1-bit LAMB's clusters (onebit-lamb.md §4): 40 GbE at 4.1 Gbit/s effective, 4 V100 per
      # node; 100 Gbit/s InfiniBand EDR, 8 V100 per node (NVLink inside both).
      replay sim-ob-$a-p$p-eth ob-$a-p$p.parquet "$sc" --link-rate 4.1Gbps \
        --latency 25us --hosts-per-node 4
      replay sim-ob-$a-p$p-ib ob-$a-p$p.parquet "$sc" --link-rate 100Gbps \
        --latency 1us --hosts-per-node 8
    done
  done
}

part_embrace() {
  local p ex
  for p in $EMB_PS; do
    for ex in embrace allgather dense; do
      local sch=()
      [ $ex = embrace ] && sch=(--schedule fifo)
      timed rec-emb-$ex-p$p $B/gradtrain --model transformer-lm --data synthetic-lm --vocab 4096 \
        --tokens 40000 --d-model 64 --layers 1 --heads 4 --seq-len 32 --batch 13 --steps 2 \
        --optimizer sgd --lr 0.05 --exchange "$(exchange_of "$ex")" "${sch[@]}" --ranks $p -q \
        --comm-trace emb-$ex-p$p.parquet > /dev/null
      # EmbRace's clusters: 4 servers × 4 GPUs, 100 Gbit/s InfiniBand (embrace.md §4). Phases
      # kept: the embedding's own exchanges are phases of the step.
      timed sim-emb-$ex-p$p $B/gradreport simulate emb-$ex-p$p.parquet --link-rate 100Gbps \
        --latency 1us --hosts-per-node 4 --scale-bytes "$EMB_SCALE" --compute none --steps 1 \
        --format csv -o sim-emb-$ex-p$p.csv > /dev/null
    done
  done
}

part_weak() {
  local p a
  for p in $WEAK_PS; do
    for a in oktopk ring; do
      # One warm-up call first (not recorded): Ok-Topk's first call sets its thresholds and
      # regions from scratch, which its later steps reuse (the paper's steady state).
      timed rec-weak-$a-p$p $B/gradallreduce bench --algo $a --input topk --sizes 1M:1M \
        --warmup 1 --iters 1 --density 0.01 --ranks $p --format csv -q \
        --comm-trace weak-$a-p$p.parquet > rec-weak-$a-p$p.csv
      replay sim-weak-$a-p$p weak-$a-p$p.parquet "$WEAK_SCALE" --topology dragonfly \
        --link-rate 10GBps --latency 1us
    done
  done
  # Ok-Topk at the largest P phase by phase against Table 1's formula (--model-n: the
  # formula column, and on stderr why each phase is far from it).
  p=${WEAK_PS##* }
  timed sim-weak-phases-p$p $B/gradreport simulate weak-oktopk-p$p.parquet --topology dragonfly \
    --link-rate 10GBps --latency 1us --scale-bytes "$WEAK_SCALE" --compute none \
    --model-n 133547324 --density 0.01 --format csv -o sim-weak-phases-p$p.csv \
    > /dev/null 2> why-weak-p$p.txt
}

# Scalings: each recording's bytes × (the paper's parameters / the recorded ones).
DEFT_SCALE=$(python3 -c "print(28949319 / 1447173)")  # DEFT's LSTM / gradtrace's ×0.05 one
ONEBIT_SCALE=$(python3 -c "print(340e6 / 1048576)")    # BERT-Large ≈ 340M / 4 MiB of f32
EMB_SCALE=$(python3 -c "print(252.5 / 1.0)")            # GNMT-8's 252.5 MiB / 4096 × 64 f32
WEAK_SCALE=$(python3 -c "print(133547324 / 262144)")   # Ok-Topk's BERT / 1 MiB of f32
T0=$(date +%s)
for part in $PARTS; do
  case $part in
    deft | onebit | embrace | weak) part_$part ;;
    *) echo "error: PARTS: unknown part '$part' (deft, onebit, embrace, weak)" >&2; exit 2 ;;
  esac
  {
    echo -n "Made by \`make repro-scale$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/scale-papers.sh, part $part) on $(date -u +%F)"
    if [ "$REUSE" != 0 ]; then echo " (REUSE=1: rewritten from the runs' files)."
    else echo "; wall time so far $(( $(date +%s) - T0 )) s."; fi
    echo
    case $part in
      deft) python3 "${TABLES[@]}" deft --ps "$DEFT_PS" --scale "$DEFT_SCALE" ;;
      onebit) python3 "${TABLES[@]}" onebit --ps "$ONEBIT_PS" --scale "$ONEBIT_SCALE" ;;
      embrace) python3 "${TABLES[@]}" embrace --ps "$EMB_PS" --scale "$EMB_SCALE" ;;
      weak) python3 "${TABLES[@]}" weak --ps "$WEAK_PS" --scale "$WEAK_SCALE" ;;
    esac
  } > section-$part.md
  section sim-scale-$part section-$part.md
  cat section-$part.md
done
