#!/usr/bin/env bash
# Ok-Topk Figs. 5 and 6 in closed loop: gradtrain trains with --exchange oktopk (each rank's
# own selection with Algorithm 2's residual, the result applied), after a 5 % dense warm-up,
# with each threshold-reuse policy; the count deviation |nnz − k|/k of the local and global
# selections and ξ of Assumption 1 (`--xi`) come from the same run's metrics.
# `make repro-oktopk-closed`; FAST=1 (make test): a few dozen steps.
# Full runs write docs/results/oktopk-closed.md and the `oktopk-closed` section of
# docs/RESULTS.md; FAST runs keep both next to their outputs (data/out/oktopk-closed/).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/oktopk-closed
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
"$PY" -c 'import numpy, pandas, pyarrow' 2>/dev/null || { echo "error: $PY lacks numpy/pandas/pyarrow (make deps-py)" >&2; exit 1; }
TAB="$PY $ROOT/pipelines/closed_loop.py"
P=4; REEVAL=32
if [ "$FAST" != 0 ]; then
  CNN_STEPS=60; LSTM_STEPS=20; LSTM_SIZE="--d-model 32 --hidden 32 --seq-len 16 --batch 8"
else
  # CPU-sized: a CNN step at P = 4 costs ~0.06 s here, an LSTM LM step ~0.3 s
  CNN_STEPS=1600; LSTM_STEPS=200; LSTM_SIZE=""
fi
CNN="--model cnn --data digits --ranks $P --steps $CNN_STEPS --lr 0.02 --momentum 0.9 --weight-decay 5e-4 --eval-every $((CNN_STEPS / 4))"
LSTM="--model lstm-lm --data synthetic-lm $LSTM_SIZE --ranks $P --steps $LSTM_STEPS --lr 1.0 --momentum 0.9 --eval-every $((LSTM_STEPS / 4))"
CNN_OK="--exchange oktopk --density 0.01 --dense-warmup $((CNN_STEPS / 20)) --reeval $REEVAL --xi -q"
LSTM_OK="--exchange oktopk --density 0.02 --dense-warmup $((LSTM_STEPS / 20)) --reeval $REEVAL --xi -q"
{
echo "Made by \`make repro-oktopk-closed\` (\`pipelines/oktopk-closed.sh\`)$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores."
echo
echo "Closed loop: \`gradtrain --exchange oktopk\` trains the model with Ok-Topk's sparse allreduce and"
echo "Algorithm 2's residuals (SGD with the learning rate folded in, w −= u/P), P = $P in-process ranks,"
echo "τ' = $REEVAL (\`--reeval\`; τ = 64), after a dense ring allreduce warm-up of 5 % of the steps"
echo "(\`--dense-warmup\`, steps left out of every average). Per step and rank the metrics give k,"
echo "\`local_nnz\` (this rank's selection by its reused local threshold) and \`nnz\` (the global result,"
echo "selected by the reused global threshold), and \`xi\` (\`--xi\`): Assumption 1's"
echo "‖Top_k((1/P)Σ_i acc_i) − u/P‖ / ‖(1/P)Σ_i αG_i‖ on the run's own accumulators acc_i = ε_i + αG_i"
echo "(one extra allreduce of 2n floats, outside the step's byte counters). The paper: average count"
echo "deviation < 11 % (Fig. 6) and ξ < P (Fig. 5, VGG-16 on 16 GPUs, LSTM on 32, BERT on 32)."
echo
echo "- CNN: \`gradtrain $CNN $CNN_OK --adjust POLICY\`"
echo "- LSTM LM: \`gradtrain $LSTM $LSTM_OK --adjust POLICY\`"
echo
echo "The CNN trains with weight decay 5e-4 (a usual setting for VGG-16 on CIFAR-10). A first run of this script"
echo "without it and at --lr 0.05 (not kept) fitted the digits' training set until the gradient, and"
echo "with it ξ's denominator, all but vanished (ξ far above P on every policy), and its \`ladder\` run"
echo "diverged; the digits are far easier to fit than CIFAR-10, so late-training ξ here is not the paper's."
echo
echo "Policies: \`paper\` (Algorithm 1: the threshold of the last re-evaluation, unchanged), \`reference\`"
echo "(the authors' code: ×1.03 while the count exceeds 4k/3, then the VGG bands; the LSTM LM uses"
echo "\`lstm\`, its bands), \`ladder\` (gradkit's default). Deviation from the paper: P = $P, not 16–32;"
echo "$CNN_STEPS CNN steps and $LSTM_STEPS LSTM LM steps, not whole training runs; small models on CPU."
echo
for pol in paper reference ladder; do
  run $B/gradtrain $CNN $CNN_OK --adjust $pol --run cnn-$pol --metrics cnn-$pol.parquet
done
run $B/gradtrain $CNN -q --run cnn-dense --metrics cnn-dense.parquet
for pol in paper lstm ladder; do
  run $B/gradtrain $LSTM $LSTM_OK --adjust $pol --run lstm-$pol --metrics lstm-$pol.parquet
done
echo "### Count deviation and ξ after the warm-up"
echo
run $TAB oktopk cnn-{paper,reference,ladder}.parquet lstm-{paper,lstm,ladder}.parquet --series series.parquet
echo
echo "Final evaluation (cnn-dense: \`gradtrain $CNN\`, the dense ring allreduce throughout):"
echo
run $B/gradreport table cnn-{paper,reference,ladder,dense}.parquet lstm-{paper,lstm,ladder}.parquet --by run --metric loss,eval_loss,eval_accuracy --stat last
echo
for m in local global; do
  run $B/gradreport plot loss series.parquet --metric dev_${m}_pct \
      --title "Ok-Topk closed loop (P = $P, τ' = $REEVAL): |${m} nnz − k|/k per step, % (mean over ranks)" -o fig6-$m.svg >&2
done
run $B/gradreport plot loss series.parquet --metric xi --title "Ok-Topk closed loop: ξ per step" -o fig5-xi.svg >&2
echo "Figures: data/out/oktopk-closed/fig6-local.svg, fig6-global.svg (|nnz − k|/k per step, the"
echo "three policies; Fig. 6) and fig5-xi.svg (ξ per step; Fig. 5)."
} > closed.md 2> >(tee cmds.log >&2)
wait $! 2>/dev/null || true
expect closed.md "^\| cnn-paper \| $P \|" "^\| cnn-ladder \|" "^\| lstm-lstm \|" "verdict \(paper" "^\| cnn-dense +\|"
python3 "$ROOT/pipelines/docs_check.py" --section oktopk-closed closed.md   # the verdicts say what the numbers say
if [ "$FAST" != 0 ]; then
  cp closed.md RESULTS-section.md
else
  cp closed.md "$ROOT/docs/results/oktopk-closed.md"
  {
    echo "Ok-Topk Figs. 5–6 in closed loop ([results/oktopk-closed.md](results/oktopk-closed.md): commands,"
    echo "policies, final losses; figures in data/out/oktopk-closed/). Verdict:"
    echo "<!-- gen:oktopk-closed-verdict --><!-- /gen -->"
    echo
    awk '/^### Count deviation/ { on = 1; next } on && /^\|/ { print; t = 1; next } t { exit }' closed.md
  } > summary.md
  section oktopk-closed summary.md
fi
cat closed.md
