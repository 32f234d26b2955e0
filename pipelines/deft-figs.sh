#!/usr/bin/env bash
# DEFT figures of issue 16: the density sweep (DEFT
# Fig. 8: build-up, measured and predicted selection speedup, and training loss per density)
# and the error-norm curves (DEFT Figs. 5/6). Called at the end of pipelines/deft.sh
# (`make repro-deft`); alone: `make repro-deft-figs`. Full runs write docs/results/deft-figs.md
# and the `deft-figs` section of docs/RESULTS.md; FAST runs keep both next to their outputs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/deft-figs
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
"$PY" -c 'import numpy, pandas, pyarrow' 2>/dev/null || { echo "error: $PY lacks numpy/pandas/pyarrow (make deps-py)" >&2; exit 1; }
FIGS="$PY $ROOT/pipelines/sparse_figs.py"
# run CMD…: as lib.sh's, but the echoed command is shell-quoted, so that the "Commands" list at
# the end of the page can be pasted into a shell as it is
run() {
  local a=() x
  for x in "$@"; do
    if [[ $x =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then a+=("$x"); else a+=("'${x//\'/\'\\\'\'}'"); fi
  done
  printf '+ %s\n' "${a[*]}" | sed "s#$B/##g" >&2
  "$@"
}
if [ "$FAST" != 0 ]; then
  SW_SHAPE="--shape lstm --scale 0.02"; SW_P=4; SW_STEPS=3; DENS="0.001 0.01 0.1"; TRAIN_STEPS=100
  E_STEPS=64; E_P=4
else
  SW_SHAPE="--shape lstm --scale 0.05"; SW_P=8; SW_STEPS=4; DENS="0.0001 0.001 0.01 0.05 0.1"; TRAIN_STEPS=600
  E_STEPS=256; E_P=4
fi
D=0.01
REPS=${REPS:-3}  # interleaved repeats of the density sweep's timed plans
{
echo "Made by \`make repro-deft\` (\`pipelines/deft-figs.sh\`)$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores."
echo "Every number below is measured by the commands printed beside it (stderr of the run); the"
echo "Python arithmetic is \`pipelines/sparse_figs.py\`."
echo

# ------------------------------------------------------------------ density sweep
echo "### Density sweep (DEFT Fig. 8): build-up and selection time, DEFT vs Top-k"
echo
echo "Trace \`gradtrace synthetic $SW_SHAPE --ranks $SW_P --steps $SW_STEPS --seed 3 --overlap 0.2\` (LSTM-shaped, as"
echo "the paper's Fig. 8 sweeps the LSTM; P = $SW_P, the paper 16). For each density d,"
echo "\`RAYON_NUM_THREADS=1 gradpartition --method deft --density d\`: build-up = |∪ of the ranks'"
echo "selections| / k for plain Top-k (every rank its own top-k of the whole model) and for DEFT (every"
echo "rank its norm-derived k_x in its own pieces), counted from the indices; *measured* speedup = one"
echo "exact top-k of a rank's whole accumulator / the slowest worker's DEFT selection, each timed alone on"
echo "one core; *predicted* = the cost model n_g·log2 k / max_i C_i (Eq. 6), a prediction. Each cell is the"
echo "median over $REPS interleaved repeats (every density once per repeat) of the median over steps, with the"
echo "repeats' min–max (\`gradreport table --per-file\`). The paper reports Top-k build-up 5.31–14.18× at 16"
echo "GPUs and DEFT's density at the"
echo "set value (Fig. 4), and that d = 0.001 converges slightly slower, with no significant difference"
echo "after epoch 45 (Fig. 8, no numbers)."
echo
run $B/gradtrace synthetic $SW_SHAPE --ranks $SW_P --steps $SW_STEPS --seed 3 --overlap 0.2 -q -o sweep.parquet
for rep in $(seq "$REPS"); do
  for d in $DENS; do
    run env RAYON_NUM_THREADS=1 $B/gradpartition --method deft --density $d -q --run "d=$d" sweep.parquet \
        -o /dev/null --metrics sweep-$d-r$rep.m.parquet
  done
done
run $B/gradreport table sweep-*.m.parquet --per-file --by run --metric k_total,buildup_topk,buildup_deft,selection_speedup_measured,selection_speedup_predicted
echo
echo "Selection times behind the measured speedup (seconds; median over repeats of the median over steps):"
echo
run $B/gradreport table sweep-*.m.parquet --per-file --by run --metric time_select_topk_s,time_select_deft_max_s
echo
echo "#### Training across densities: MLP on the UCI digits, 4 ranks, $TRAIN_STEPS steps"
echo
echo "\`gradtrain --model mlp --data digits --ranks 4 --steps $TRAIN_STEPS --lr 0.1 --exchange topka|deft --density d"
echo "--dense-warmup $((TRAIN_STEPS / 20))\` and the dense baseline; last step's loss and accuracy, the"
echo "last step's nnz of the exchanged gradient (Top-k: the union, its build-up shows) and bytes per rank."
echo
run $B/gradtrain --model mlp --data digits --ranks 4 --steps $TRAIN_STEPS --lr 0.1 --exchange ring -q --run dense \
    --metrics train-dense.parquet
for d in $DENS; do
  [ "$d" = 0.0001 ] && continue   # k = 2 of the MLP's 26,122 parameters: nothing to compare
  for ex in topk deft; do
    run $B/gradtrain --model mlp --data digits --ranks 4 --steps $TRAIN_STEPS --lr 0.1 --exchange "$(exchange_of "$ex")" --density $d \
        --dense-warmup $((TRAIN_STEPS / 20)) -q --run "$ex d=$d" --metrics train-$ex-$d.parquet
  done
done
run $B/gradreport table train-*.parquet --by run --metric loss,eval_accuracy,nnz,bytes_sent --stat last
run $B/gradreport plot loss train-*.parquet --title "DEFT vs Top-k across densities (MLP, digits, P = 4)" -o sweep-loss.svg >&2
echo
echo "Figure: data/out/deft-figs/sweep-loss.svg."
echo

# ------------------------------------------------------------------ error norm
echo "### Error norm (DEFT Figs. 5/6): ‖e_t‖ = (1/P) Σ_i ‖e_i,t‖ per step"
echo
run $B/gradtrace model --model cnn --data digits --ranks $E_P --steps $E_STEPS --seed 0 -q -o cnn.parquet
N=$($B/gradtrace inspect cnn.parquet | sed -n 's/.* \([0-9]*\) elements per step and rank.*/\1/p')
echo "Trace: \`gradtrace model --model cnn --data digits --ranks $E_P --steps $E_STEPS\` (real per-rank gradients"
echo "of gradtrain's CNN, dense SGD between the recorded steps), k = ⌊d·n⌋ of n = $N. The residual"
echo "e_i,t = acc_i,t with the exchanged entries zeroed (DEFT Alg. 1: every rank zeroes the gathered index"
echo "set, since it sent its values at all of them). Rows:"
echo
echo "- **deft** / **deft 10×d**: \`gradallreduce --algo deft --ranks $E_P --density d\` (its own selection, error"
echo "  feedback on); \`sparse_figs.py errnorm --red\` rebuilds the residuals from the trace and the result"
echo "  u_t and checks u_t = Σ_i acc_i on u_t's support (worst relative difference in the table)."
echo "- **topka**: \`gradallreduce --algo topka\` (Top-k with the allgather exchange; each rank's residual"
echo "  keeps everything but its own top-k, since it sends only those)."
echo "- **Top-k (union)** and **CLT-k**: \`gradallreduce --algo topk-union\` (the paper's Top-k baseline:"
echo "  every rank's exact top-k indices allgathered, every rank's values on their union allreduced, the"
echo "  union zeroed in every residual) and \`gradallreduce --algo cltk\` (the exact top-k of the cyclic"
echo "  leader, rank t mod P, applied by every rank); the error norm is the mean over ranks of the tools'"
echo "  \`residual_norm\` metric, the build-up their result's \`nnz\` / k. \`sparse_figs.py errnorm --simulate"
echo "  topk-union|cltk --tool-metrics\` recomputes both from the trace with Alg. 1's loop in NumPy and"
echo "  reports the worst relative difference per step between the tool's error norm and its own."
echo
echo "Mean ‖e_t‖ per quarter of the steps, the last step's, and the mean build-up (|gathered set| / k)."
echo "The paper: Top-k has clearly the lowest error (build-up), DEFT and CLT-k end higher, and DEFT at"
echo "10× the density is about Top-k's (Figs. 5, 6; curves only)."
echo
echo "| run | P | k | steps | checked: worst rel. diff | ‖e‖ Q1 | Q2 | Q3 | Q4 | last step | build-up |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
D10=$(awk -v d=$D 'BEGIN { print 10 * d }')
run $B/gradallreduce --algo deft --ranks $E_P --density $D -q --run deft cnn.parquet -o red-deft.parquet --metrics ar-deft.m.parquet
run $B/gradallreduce --algo deft --ranks $E_P --density $D10 -q --run deft10 cnn.parquet -o red-deft10.parquet --metrics ar-deft10.m.parquet
run $B/gradallreduce --algo topka --ranks $E_P --density $D -q --run topka cnn.parquet -o red-topka.parquet --metrics ar-topka.m.parquet
run $B/gradallreduce --algo topk-union --ranks $E_P --density $D -q --run topk-union cnn.parquet -o /dev/null --metrics ar-topk-union.m.parquet
run $B/gradallreduce --algo cltk --ranks $E_P --density $D -q --run cltk cnn.parquet -o /dev/null --metrics ar-cltk.m.parquet
fmt() { awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 }'; }
run $FIGS errnorm cnn.parquet --density $D --red red-deft.parquet --rule result --label "deft d=$D" --metrics-out en-deft.m.parquet | fmt
run $FIGS errnorm cnn.parquet --density $D10 --red red-deft10.parquet --rule result --label "deft 10×d=$D10" --metrics-out en-deft10.m.parquet | fmt
run $FIGS errnorm cnn.parquet --density $D --red red-topka.parquet --rule sent --label "topka d=$D" --metrics-out en-topka.m.parquet | fmt
run $FIGS errnorm cnn.parquet --density $D --simulate topk-union --tool-metrics ar-topk-union.m.parquet --label "Top-k (union) d=$D" --metrics-out en-topk-union.m.parquet | fmt
run $FIGS errnorm cnn.parquet --density $D --simulate cltk --tool-metrics ar-cltk.m.parquet --label "CLT-k d=$D" --metrics-out en-cltk.m.parquet | fmt
echo
run $B/gradreport plot loss en-*.m.parquet --metric error_norm --title "DEFT Figs. 5/6 (CNN, P = $E_P): error norm per step" -o error-norm.svg >&2
echo "Figure: data/out/deft-figs/error-norm.svg."
} > figs.md 2> >(tee cmds.log >&2)
wait $! 2>/dev/null || true   # the tee has written cmds.log
{
echo
echo "### Commands"
echo
echo "Every command this page's numbers come from, in the order run (from the output directory"
echo "data/out/deft-figs/; \`sparse_figs.py\` is \`pipelines/sparse_figs.py\` run with the repo's .venv):"
echo
echo '```text'
grep '^+ ' cmds.log | sed -e 's#^+ ##' -e "s#$PY $ROOT/pipelines/sparse_figs.py#sparse_figs.py#" -e "s#$ROOT/pipelines/#pipelines/#g" -e "s#$ROOT/#./#g"
echo '```'
} >> figs.md

table_after() { awk -v p="$1" 'index($0, p) == 1 { on = 1; next } on && /^\|.*\|$/ { t = 1; print; next } t { exit }' figs.md; }
{
echo "Issue-16 figures, made by \`pipelines/deft-figs.sh\` (run at the end of \`make repro-deft\`; alone:"
echo "\`make repro-deft-figs\`). Every table, its caption and the commands:"
echo "[results/deft-figs.md](results/deft-figs.md); figures: data/out/deft-figs/*.svg."
echo
echo "**Density sweep** (LSTM-shaped trace, P = $SW_P; build-up from the indices, speedup measured vs predicted):"
echo
table_after "### Density sweep"
echo
echo "**Error norm** (CNN, real gradients, P = $E_P, $E_STEPS steps; mean ‖e_t‖ per quarter):"
echo
table_after "Mean ‖e_t‖ per quarter"
} > summary.md
expect figs.md "^\| d=0\.001 +\|" "^\| d=0\.1 +\|" "^\| deft d=0\.01 \|" "^\| Top-k \(union\) d=" "^\| CLT-k d=" "^\| dense +\|" "^\| deft d=0\.01 +\|"
if [ "$FAST" != 0 ]; then
  cp figs.md RESULTS-section.md
else
  cp figs.md "$ROOT/docs/results/deft-figs.md"
  section deft-figs summary.md
fi
cat figs.md
