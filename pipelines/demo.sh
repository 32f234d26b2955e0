#!/usr/bin/env bash
# make demo: the short version of the whole story on 4 in-process ranks (no mpirun needed):
# synthetic trace → selections → plans → every allreduce → a short training comparison →
# a Markdown table on the terminal and SVG figures in data/out/demo/.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/demo
P=4
rm -rf "$OUT" && mkdir -p "$OUT"
cd "$OUT"

echo "== 1. a synthetic VGG-16-shaped gradient trace (4 ranks, 6 steps)" >&2
run $B/gradtrace synthetic --shape vgg16 --scale 0.1 --ranks $P --steps 6 --seed 1 --overlap 0.3 -q -o trace.parquet
run $B/gradtrace inspect trace.parquet | head -4

echo "== 2. local selections (top-k, Ok-Topk's threshold reuse), 1 % density" >&2
run $B/gradselect --method topk --density 0.01 trace.parquet -q -o sel-topk.parquet --metrics select-topk.parquet
run $B/gradselect --method oktopk --density 0.01 --reeval 4 trace.parquet -q -o sel-oktopk.parquet --metrics select-oktopk.parquet

echo "== 3. plans: DEFT's allocation + bin-packing, Ok-Topk's balanced regions" >&2
run $B/gradpartition --method deft --density 0.01 trace.parquet -o plan-deft.parquet --metrics part-deft.parquet
run $B/gradpartition --method oktopk --period 4 sel-topk.parquet -o plan-oktopk.parquet --metrics part-oktopk.parquet

echo "== 4. every allreduce on the same trace, with exact traffic per rank" >&2
# dense and 1-bit algorithms, Gaussiank and DEFT (which select for themselves) on the trace;
# the top-k-based sparse allreduces on gradselect's top-k selections
for a in ring rabenseifner tree native gaussiank deft onebit; do
  run $B/gradallreduce --algo $a --ranks $P --density 0.01 -q trace.parquet -o reduced-$a.parquet --metrics ar-$a.parquet
done
for a in topka topkdsa gtopk oktopk; do
  period=(); [ $a = oktopk ] && period=(--period 4)   # τ applies to Ok-Topk only
  run $B/gradallreduce --algo $a --ranks $P --density 0.01 "${period[@]}" -q sel-topk.parquet -o reduced-$a.parquet --metrics ar-$a.parquet
done

echo "== 5. a short training comparison: MLP on the UCI digits, 4 ranks" >&2
STEPS=300
run $B/gradtrain --model mlp --data digits --ranks $P --steps $STEPS --lr 0.1 --exchange ring -q --run dense --metrics train-dense.parquet
run $B/gradtrain --model mlp --data digits --ranks $P --steps $STEPS --lr 0.1 --exchange oktopk --density 0.02 -q --run oktopk --metrics train-oktopk.parquet
run $B/gradtrain --model mlp --data digits --ranks $P --steps $STEPS --lr 0.1 --exchange deft --density 0.02 -q --run deft --metrics train-deft.parquet

echo "== 6. report" >&2
run $B/gradreport volume ar-*.parquet > volume.md
run $B/gradreport table train-*.parquet --by run --metric eval_accuracy,loss,bytes_sent --stat last > train.md
run $B/gradreport plot volume ar-*.parquet -o volume.svg
run $B/gradreport plot breakdown ar-*.parquet -o breakdown.svg
run $B/gradreport plot loss train-*.parquet -o loss.svg

echo
echo "Bytes per rank and step, measured vs the papers' formulas (P = $P, density 1 %):"
cat volume.md
echo
echo "Training, MLP on digits, $STEPS steps, last-step values:"
cat train.md
echo
echo "Figures and tables are in data/out/demo/ (volume.svg, breakdown.svg, loss.svg, *.md)."
