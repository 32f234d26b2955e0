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
REPS=${REPS:-3}  # interleaved repeats of the timed plan (gradpartition), every P in each
D=0.01
{
echo "Made by \`make repro-deft\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores; density $D."
echo
echo "### Selection time and gradient build-up as P grows"
echo
echo "Trace: \`gradtrace synthetic $SHAPE --steps $STEPS --overlap 0.2\` with P ranks. Top-k: every"
echo "rank selects k of the whole model (\`gradselect --method topk\`); DEFT: every rank selects only"
echo "in the pieces the rotating leader's bin-packing gives it (\`gradselect --method deft\`)."
echo "Build-up = |union of the ranks' selections| / k (\`gradpartition --method deft\` metrics), counted"
echo "from the selected indices: each worker selects in its pieces with the k_x of its *own* norms"
echo "(DEFT Alg. 3 runs on every worker), so DEFT's is near 1 but not 1 by construction."
echo "The paper reports 5–14× for Top-k and none for DEFT."
echo
for P in $PS; do
  run $B/gradtrace synthetic $SHAPE --ranks $P --steps $STEPS --seed 3 --overlap 0.2 -q -o trace-P$P.parquet
  run $B/gradselect --method topk --density $D -q --run topk trace-P$P.parquet -o sel-topk-P$P.parquet --metrics sel-topk-P$P.parquet.m
  run $B/gradselect --method deft --density $D -q --run deft trace-P$P.parquet -o sel-deft-P$P.parquet --metrics sel-deft-P$P.parquet.m
done
for rep in $(seq "$REPS"); do
  for P in $PS; do
    # one thread, so that each selection is timed alone on one core (the measured speedup)
    # the plan is the same in every repeat: the first one keeps it
    plan=plan-P$P.parquet; [ $rep = 1 ] || plan=/dev/null
    run env RAYON_NUM_THREADS=1 $B/gradpartition --method deft --density $D -q --run plan trace-P$P.parquet \
      -o $plan --metrics part-P$P-r$rep.parquet
  done
done
echo "Selection time per rank and step (median, seconds) and selected entries per rank:"
echo
run $B/gradreport table sel-*.m --by run,world_size --metric time_select_s,nnz,k_target
echo
echo "Gradient build-up (union of all ranks' selections / k) and DEFT's load balance."
echo "\`selection_speedup_predicted\` is the cost model (Eq. 6: n·log2 k / max_i C_i), not a"
echo "measurement; \`selection_speedup_measured\` is the wall time of one exact top-k over a rank's"
echo "whole accumulator divided by the slowest worker's layer-wise top-k over its own pieces, each"
echo "timed alone on one core (\`RAYON_NUM_THREADS=1\`). They differ because gradkit's exact top-k"
echo "costs about two streaming passes over its input, not n·log k: a worker's time follows the"
echo "elements it searches (at least n/P, more when the bins are unbalanced) plus a fixed cost per"
echo "piece, and the smaller log2 k_x the model credits it with saves nothing, so the measured"
echo "speedup stays below P while the predicted one exceeds P. Each cell is the median over $REPS"
echo "interleaved repeats (every P once per repeat) of the median over steps, with the repeats' min–max"
echo "(\`gradreport table --per-file\`); build-up, imbalance and the prediction are the same in every repeat."
echo
run $B/gradreport table part-*-r*.parquet --per-file --by world_size --metric buildup_topk,buildup_deft,cost_imbalance,selection_speedup_predicted,selection_speedup_measured --stat median
echo
echo "Selection times behind the measured speedup (seconds; median over repeats of the median over steps):"
echo
run $B/gradreport table part-*-r*.parquet --per-file --by world_size --metric time_select_topk_s,time_select_deft_max_s --stat median
echo
echo "### Loss curves: MLP on the UCI digits, 4 ranks, $TRAIN_STEPS steps, density 2 %"
echo
echo "Sparse exchanges after a dense warm-up of 5 % of the steps; bytes_sent and nnz are the last step's."
echo
for ex in dense topk deft; do
  sparse=(--density 0.02 --dense-warmup $((TRAIN_STEPS / 20)))
  [ $ex = dense ] && sparse=()   # gradtrain refuses flags the dense exchange would ignore
  run $B/gradtrain --model mlp --data digits --ranks 4 --steps $TRAIN_STEPS --lr 0.1 --exchange "$(exchange_of "$ex")" "${sparse[@]}" \
      -q --run $ex --metrics train-$ex.parquet
done
run $B/gradreport table train-*.parquet --by run --metric eval_accuracy,loss,bytes_sent,nnz --stat last
run $B/gradreport plot loss train-*.parquet -o loss.svg >&2
echo
echo "Figure: data/out/deft/loss.svg."
} > section.md
section deft section.md
expect section.md "^\| deft +\| +2 \|" "^\| topk +\| +8 \|" "buildup_topk" "selection_speedup_predicted +\| selection_speedup_measured" "time_select_deft_max_s" "^\| +8 \| [0-9.]+ \(" "^\| dense +\| +0\.[0-9]+ \|" "^\| deft +\| +0\.[0-9]+ \|"
cat section.md
# the issue-16 figures (density sweep, DEFT Fig. 8; error-norm curves, DEFT Figs. 5/6)
bash "$ROOT/pipelines/deft-figs.sh"
# DEFT Figs. 7 and 9 as a per-part breakdown, and the heap top-k beside the two-pass one
# (BREAKDOWN=0 leaves it out: its section is kept as it was)
[ "${BREAKDOWN:-1}" = 0 ] || bash "$ROOT/pipelines/deft-breakdown.sh"
