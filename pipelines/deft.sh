#!/usr/bin/env bash
# DEFT reproduction; FAST=1 is the short version that `make test` runs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/deft
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  PS="2 4 8"; SHAPE="--shape vgg16 --scale 0.02"; STEPS=3; TRAIN_STEPS=100
else
  PS="2 4 8 16"; SHAPE="--shape lstm --scale 0.1"; STEPS=6; TRAIN_STEPS=600
fi
D=0.01
{
echo "Made by \`make repro-deft\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores; density $D."
echo
echo "### Selection time and gradient build-up as P grows"
echo
echo "Trace: \`gradtrace synthetic $SHAPE --steps $STEPS --overlap 0.2\` with P ranks. Top-k: every"
echo "rank selects k of the whole model (\`gradselect --method topk\`); DEFT: every rank selects only"
echo "in the pieces the rotating leader's bin-packing gives it (\`gradselect --method deft\`)."
echo "Build-up = |union of the ranks' selections| / k (\`gradpartition --method deft\` metrics);"
echo "the paper reports 5–14× for Top-k and none for DEFT."
echo
for P in $PS; do
  run $B/gradtrace synthetic $SHAPE --ranks $P --steps $STEPS --seed 3 --overlap 0.2 -q -o trace-P$P.parquet
  run $B/gradselect --method topk --density $D -q --run topk trace-P$P.parquet -o sel-topk-P$P.parquet --metrics sel-topk-P$P.parquet.m
  run $B/gradselect --method deft --density $D -q --run deft trace-P$P.parquet -o sel-deft-P$P.parquet --metrics sel-deft-P$P.parquet.m
  run $B/gradpartition --method deft --density $D -q --run plan trace-P$P.parquet -o plan-P$P.parquet --metrics part-P$P.parquet
done
echo "Selection time per rank and step (median, seconds) and selected entries per rank:"
echo
run $B/gradreport table sel-*.m --by run,world_size --metric time_select_s,nnz,k_target
echo
echo "Gradient build-up (union of all ranks' selections / k) and DEFT's load balance:"
echo
run $B/gradreport table part-*.parquet --by world_size --metric buildup_topk,buildup_deft,cost_imbalance,selection_speedup --stat median
echo
echo "### Loss curves: MLP on the UCI digits, 4 ranks, $TRAIN_STEPS steps, density 2 %"
echo
echo "Sparse exchanges after a dense warm-up of 5 % of the steps; bytes_sent and nnz are the last step's."
echo
for ex in dense topk deft; do
  warm=$([ $ex = dense ] && echo 0 || echo $((TRAIN_STEPS / 20)))
  run $B/gradtrain --model mlp --data digits --ranks 4 --steps $TRAIN_STEPS --lr 0.1 --exchange $ex --density 0.02 \
      --dense-warmup $warm -q --run $ex --metrics train-$ex.parquet
done
run $B/gradreport table train-*.parquet --by run --metric eval_accuracy,loss,bytes_sent,nnz --stat last
run $B/gradreport plot loss train-*.parquet -o loss.svg >&2
echo
echo "Figure: data/out/deft/loss.svg."
} > section.md
section deft section.md
expect section.md "^\| deft +\| +2 \|" "^\| topk +\| +8 \|" "buildup_topk" "^\| +8 \| [0-9.]+ \(" "^\| dense +\| +0\.[0-9]+ \|" "^\| deft +\| +0\.[0-9]+ \|"
cat section.md
