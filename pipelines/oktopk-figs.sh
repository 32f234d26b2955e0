#!/usr/bin/env bash
# Ok-Topk figures of issue 16 that the tools can make without new code: Fig. 6 on real-model
# gradients (selected count vs k for each --adjust policy and Gaussiank; thresholds vs the true
# k-th largest |acc|), Fig. 5 (ξ of Assumption 1 along a run), Fig. 7b (data balancing that
# fires), Table 1 end to end (dense trace in, each algorithm's own selection and residual).
# Called at the end of pipelines/oktopk.sh (`make repro-oktopk`); alone: `make repro-oktopk-figs`.
# FAST=1: about half a minute. Full runs write docs/results/oktopk-figs.md and the
# `oktopk-figs` section of docs/RESULTS.md; FAST runs keep both next to their outputs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/oktopk-figs
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
D=0.01
D5=$(awk -v d=$D 'BEGIN { print 5 * d }')   # the second density of the ξ table
if [ "$FAST" != 0 ]; then
  M_STEPS=64; M_P=4; M_REEVAL=16; LSTM_STEPS=0
  T1_SHAPE="--shape vgg16 --scale 0.02"; T1_PS="4"; T1_STEPS=8
  B_STEPS=8; B_LAYER=8192
else
  M_STEPS=256; M_P=4; M_REEVAL=32; LSTM_STEPS=64
  T1_SHAPE="--shape vgg16 --scale 0.05"; T1_PS="4 8"; T1_STEPS=16
  B_STEPS=16; B_LAYER=32768
fi
# verdict MEAN_PCT: the paper's Fig. 6 claim is "< 11 % average deviation"
verdict() { awk -v m="$1" 'BEGIN { print (m < 11 ? "yes (< 11 %)" : "no (≥ 11 %)") }'; }

{
echo "Made by \`make repro-oktopk\` (\`pipelines/oktopk-figs.sh\`)$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores; density $D."
echo "Every number below is measured by the commands printed beside it (stderr of the run);"
echo "the Python arithmetic is \`pipelines/sparse_figs.py\`, which only reads the tools' files."
echo

# ------------------------------------------------------------------ Fig. 6 on real gradients
run $B/gradtrace model --model cnn --data digits --ranks $M_P --steps $M_STEPS --seed 0 -q -o cnn.parquet
N=$($B/gradtrace inspect cnn.parquet | sed -n 's/.* \([0-9]*\) elements per step and rank.*/\1/p')
echo "### Fig. 6 on real-model gradients: selected count vs k"
echo
echo "Trace: \`gradtrace model --model cnn --data digits --ranks $M_P --steps $M_STEPS\` (the real"
echo "per-rank gradients of gradtrain's CNN, n = $N parameters, trained by dense SGD between the"
echo "recorded steps); k = ⌊$D·n⌋. Each row is \`gradselect --density $D\` with error feedback:"
echo "Ok-Topk's local threshold reuse (\`--method oktopk --reeval $M_REEVAL --adjust POLICY\`: exact"
echo "k-th largest |acc| every $M_REEVAL steps, reused between) and Gaussiank (\`--method gaussiank\`,"
echo "the Gaussian-fit threshold halved until ≥ 3k/4 pass). Deviation = mean over steps and ranks"
echo "of |nnz − k|/k, also per quarter of the steps. The paper reports an average deviation < 11 %"
echo "(Fig. 6, VGG-16/LSTM/BERT over whole training runs); the verdict compares with it."
echo
models=cnn
if [ "$LSTM_STEPS" != 0 ]; then
  run $B/gradtrace model --model lstm-lm --data synthetic-lm --ranks 2 --steps $LSTM_STEPS --seed 0 -q -o lstm.parquet
  models="cnn lstm"
fi
echo "| model | method | k | mean \|nnz−k\|/k | Q1 | Q2 | Q3 | Q4 | mean nnz/k | paper: < 11 % reached? |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
for m in $models; do
  for pol in paper reference ladder; do
    run $B/gradselect --method oktopk --density $D --reeval $M_REEVAL --adjust $pol -q --run $m-oktopk-$pol \
        $m.parquet -o sel-$m-$pol.parquet --metrics sel-$m-$pol.m.parquet
  done
  run $B/gradselect --method gaussiank --density $D -q --run $m-gaussiank $m.parquet -o sel-$m-gaussiank.parquet --metrics sel-$m-gaussiank.m.parquet
  run $B/gradselect --method topk --density $D -q --run $m-topk $m.parquet -o sel-$m-topk.parquet --metrics sel-$m-topk.m.parquet
  run $FIGS deviation sel-$m-{paper,reference,ladder,gaussiank}.m.parquet > dev-$m.csv
  while IFS=, read -r rn k steps mean ratio q1 q2 q3 q4; do
    [ "$rn" = run ] && continue
    printf '| %s | %s | %s | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %.2f | %s |\n' \
      "$m" "${rn#$m-}" "$k" "$mean" "$q1" "$q2" "$q3" "$q4" "$ratio" "$(verdict "$mean")"
  done < dev-$m.csv
done
echo
run $B/gradreport plot loss sel-cnn-{paper,reference,ladder,gaussiank,topk}.m.parquet --metric nnz \
    --title "Fig. 6 (CNN, real gradients): selected entries per step (median over ranks); topk = k" -o fig6-count.svg >&2
echo "Figure: data/out/oktopk-figs/fig6-count.svg (nnz per step, median over ranks; the \`topk\` line is k)."
echo
echo "#### Thresholds vs the true k-th largest |acc| (Fig. 4 / Fig. 6's Gaussiank estimate)"
echo
echo "For each (step, rank) the accumulator acc_t = residual + g_t of *that* run is rebuilt from the"
echo "trace and the selection (\`sparse_figs.py threshold\`, which also checks that the selection is"
echo "exactly {|acc| > threshold}; mismatches column), and the threshold the method recorded is"
echo "divided by the true k-th largest |acc_t| (what \`--method topk\` records as its threshold on"
echo "the same accumulator). Ratios are medians (min–max) over the non-exact steps; > 1 selects"
echo "fewer than k, < 1 more. For Gaussiank, *fit/true* is the raw Gaussian estimate of the"
echo "threshold, |mean| + z(1−d/2)·std, before the halving rule; the paper reports that the Gaussian fit"
echo "overestimates the threshold (Fig. 4) and so underestimates k, by about 10× late in training (Fig. 6)."
echo
echo "| model | method | k | (step, rank) samples | mismatches | threshold / true k-th: median | min | max | median nnz/k | Gaussian fit / true k-th (median) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for m in $models; do
  for v in paper reference ladder gaussiank; do
    run $FIGS threshold $m.parquet sel-$m-$v.parquet sel-$m-$v.m.parquet --density $D --label $v --csv th-$m-$v.csv \
      | awk -F'\t' -v m=$m -v v=$v '{ fit = (v == "gaussiank") ? $9 : "–"; printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m, ($1=="gaussiank"?"gaussiank":"oktopk --adjust " $1), $2, $3, $4, $5, $6, $7, $8, fit }'
  done
done
echo
run $B/gradreport plot loss sel-cnn-{paper,ladder,gaussiank,topk}.m.parquet --metric threshold \
    --title "CNN: threshold used per step (median over ranks); topk = the true k-th largest |acc| of its own run" -o fig6-threshold.svg >&2
echo "Figure: data/out/oktopk-figs/fig6-threshold.svg (recorded threshold per step; each run has its own accumulators)."
echo

# ------------------------------------------------------------------ Fig. 5: xi
echo "### Fig. 5: ξ of Assumption 1 along a run"
echo
echo "Definition used (Ok-Topk Assumption 1, docs/papers/oktopk.md §3): with acc_t^i = ε_{t−1}^i + G_t^i"
echo "the accumulators of the run and u_t its global result,"
echo "ξ_t = ‖Top_k((1/P)Σ_i acc_t^i) − u_t/P‖ / ‖(1/P)Σ_i G_t^i‖ (the learning rate cancels; it is the"
echo "authors' measurement: Top-k of the dense mean of the accumulators minus Ok-Topk's result / P,"
echo "over the norm of the mean gradient). u_t and the per-rank local thresholds come from"
echo "\`gradallreduce --algo oktopk --ranks $M_P --density $D --reeval R --adjust POLICY\` on the CNN trace"
echo "above (dense input: its own local selection and Algorithm 2's residual, ε = acc with the entries"
echo "that were selected locally *and* are in u_t zeroed); \`sparse_figs.py xi\` rebuilds the accumulators"
echo "from the trace, checks that u_t[j] equals the sum of the rebuilt acc_i[j] over the ranks that"
echo "selected j (worst relative difference in the table), and computes ξ_t. *ξ exact 2nd op.* replaces"
echo "u_t/P by Top_k((1/P)Σ_i Top_k(acc_i)) on the same accumulators (the assumption's second operator"
echo "without threshold reuse). Deviation from the paper's setting: the gradients come from a dense SGD"
echo "run (gradtrace model), not from an Ok-Topk-trained model, and P = $M_P, not 16–32. Rows at density $D"
echo "and $D5 (k = ⌊d·n⌋). The paper: ξ rises quickly, then stabilises (VGG, BERT) or slowly grows as the"
echo "gradient norm falls (LSTM), is smaller at the higher density, and stays < P (Fig. 5, §5.1)."
echo
echo "| run | P | k | steps | u_t rebuilt: worst rel. diff | ξ median Q1 | Q2 | Q3 | Q4 | ξ max | ξ exact 2nd op. (median) | max ξ < P? |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for v in "exact 1 paper $D" "paper $M_REEVAL paper $D" "reference $M_REEVAL reference $D" "ladder $M_REEVAL ladder $D" \
         "exact 1 paper $D5" "ladder $M_REEVAL ladder $D5"; do
  set -- $v
  run $B/gradallreduce --algo oktopk --ranks $M_P --density $4 --reeval $2 --adjust $3 -q --run xi-$1-$4 cnn.parquet \
      -o red-xi-$1-$4.parquet --metrics ar-xi-$1-$4.m.parquet
  run $FIGS xi cnn.parquet red-xi-$1-$4.parquet ar-xi-$1-$4.m.parquet --density $4 --label "$1 d=$4 (--reeval $2 --adjust $3)" \
      --csv xi-$1-$4.csv --metrics-out xi-$1-$4.m.parquet \
    | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, ($10 < $2 ? "yes" : "no") }'
done
echo
run $B/gradreport plot loss xi-*.m.parquet --metric xi --title "Fig. 5 (CNN, P = $M_P): ξ per step" -o fig5-xi.svg >&2
echo "Figure: data/out/oktopk-figs/fig5-xi.svg."
echo

# ------------------------------------------------------------------ Fig. 7b: balancing that fires
BL=$(for i in 0 1 2 3 4 5 6 7; do printf "l$i=$B_LAYER,"; done); BL=${BL%,}
echo "### Fig. 7b: data balancing before the allgatherv, where it fires"
echo
echo "The rule (§5.3): balance when the largest Step-D buffer exceeds 4× the average. With P = 4 the"
echo "ratio can never exceed 4 (all entries on one rank is exactly 4×), and with the balanced regions of"
echo "Step B the global top-k spreads evenly (below: it never fires), so the input is skewed on purpose:"
echo "P = 8 ranks, \`gradtrace synthetic --layers 'l0=$B_LAYER,…,l7=$B_LAYER' --ranks 8 --steps $B_STEPS --seed 4\`"
echo "(per-layer L2 norms below), reduced over equal-size regions (one layer"
echo "per rank: \`gradpartition --method oktopk --naive\` → \`gradallreduce --plan\`), so most of the global"
echo "top-k lies in one rank's region. \`gradallreduce --algo oktopk --ranks 8 --density $D --balance"
echo "auto|always|never\` (dense input, own selection, --reeval 32: step 0 is the exact step, which skips"
echo "Step D). Columns: medians over the steps where \`auto\` balanced, of the busiest rank's bytes (max over"
echo "ranks) in phase \`balance_and_allgatherv\` (sent, received), its bytes over all phases, the sum over"
echo "ranks of that phase, and the slowest rank's time in that phase and in all communication (in-process"
echo "ranks on this 2-core machine: a loose indication only; the shaped-link run below times it across hosts)."
echo "The paper reports 1.12×–1.43× faster balance + allgatherv on the iterations where balancing was"
echo "triggered (Fig. 7b, BERT, 32–256 GPUs, recursive-doubling allgatherv). gradkit's allgatherv is a ring:"
echo "every rank forwards every block but its successor's, so without balancing no rank sends much more"
echo "than the others and balancing adds the moves of the big block; what it can save is time, since each"
echo "ring step waits for the largest block (not measured by bytes)."
echo
run $B/gradtrace synthetic --layers "$BL" --ranks 8 --steps $B_STEPS --seed 4 -q -o skew.parquet
echo "L2 norm of each layer over all steps and ranks (\`gradtrace inspect skew.parquet\`):"
run $B/gradtrace inspect skew.parquet | awk -F'|' '/^\| +[0-9]+ \|/ { gsub(/ /, "", $3); gsub(/ /, "", $11); printf "%s%s %s", sep, $3, $11; sep = ", " } END { print "." }'
echo
run $B/gradselect --method topk --density $D -q skew.parquet -o skew-sel.parquet
run $B/gradpartition --method oktopk --naive --period 100000 -q skew-sel.parquet -o skew-naive.parquet
run $B/gradpartition --method oktopk --period 100000 -q skew-sel.parquet -o skew-balanced.parquet
for bal in auto always never; do
  run $B/gradallreduce --algo oktopk --ranks 8 --density $D --plan skew-naive.parquet --balance $bal -q \
      --run naive-$bal skew.parquet -o /dev/null --metrics bal-naive-$bal.m.parquet
done
run $B/gradallreduce --algo oktopk --ranks 8 --density $D --plan skew-balanced.parquet --balance auto -q \
    --run balanced-regions-auto skew.parquet -o /dev/null --metrics bal-regions-auto.m.parquet
run $FIGS balance bal-naive-{auto,always,never}.m.parquet > bal.tsv
read -r _ fired total < <(head -1 bal.tsv)
echo "\`auto\` balanced on $fired of $total steps (equal-size regions)."
echo
echo "| run (equal-size regions) | busiest rank: balance_and_allgatherv bytes sent | … received | busiest rank: all phases, bytes sent | sum over ranks, balance_and_allgatherv | slowest rank: balance_and_allgatherv time_s | slowest rank: time_comm_s |"
echo "|---|---:|---:|---:|---:|---:|---:|"
tail -n +2 bal.tsv | awk -F'\t' '{ printf "| %s | %d | %d | %d | %d | %.3g | %.3g |\n", $1, $2, $3, $4, $5, $6, $7 }'
echo
CL_REPS=3
fig7b_cluster() {
  for rep in $(seq $CL_REPS); do
    for bal in always never; do   # alternated, so that both see the same load on the machine
      launch 8 $B/gradallreduce --algo oktopk --density $D --plan skew-naive.parquet --balance $bal -q \
          --run hosts-$bal-$rep skew.parquet -o cl-red-$bal-$rep.parquet --metrics cl-bal-$bal-$rep.m.parquet
    done
  done
}
if [ "$FAST" = 0 ] && why=$("$ROOT/pipelines/cluster.sh" check 2>&1); then
  with_cluster 8 100mbit fig7b_cluster >&2
  run $FIGS balance cl-bal-*.m.parquet --fired-from bal-naive-auto.m.parquet > cl-bal.tsv
  echo "The same two runs as MPI ranks on 8 shaped hosts, one rank per host, links of 100 Mbit/s both ways"
  echo "(\`pipelines/cluster.sh\`, docs/CLUSTER.md; same fired steps), $CL_REPS times each, always/never"
  echo "alternated; times measured across the hosts, medians over all (repetition, fired step) samples,"
  echo "and the median of each repetition to show the spread between runs on this shared machine:"
  echo
  echo "| run (8 hosts, 100 Mbit/s) | busiest rank: balance_and_allgatherv bytes sent | … received | busiest rank: all phases, bytes sent | sum over ranks, balance_and_allgatherv | slowest rank: balance_and_allgatherv time_s | slowest rank: time_comm_s | samples | per repetition: balance_and_allgatherv time_s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  tail -n +2 cl-bal.tsv | awk -F'\t' '{ printf "| %s | %d | %d | %d | %d | %.3g | %.3g | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
  echo
elif [ "$FAST" = 0 ]; then
  echo "(across hosts: skipped: ${why#error: })"
  echo
fi
echo "With the balanced regions (\`gradpartition --method oktopk\` on the same selections, --balance auto),"
echo "the number of (step, rank) samples with balanced = 1 (8 ranks per step):"
echo
run $B/gradreport table bal-regions-auto.m.parquet bal-naive-auto.m.parquet --by run --metric balanced --stat sum
echo
echo "Per rank, median over steps: reduced_nnz = non-zeros of the rank's reduced region after Step C, from"
echo "which Step D keeps those above the global threshold (the Step-D buffer itself has no metric):"
echo
run $B/gradreport table bal-naive-never.m.parquet bal-regions-auto.m.parquet --by run,rank --metric nnz,reduced_nnz,'bytes_sent:balance_and_allgatherv' --stat median --no-range
echo

# ------------------------------------------------------------------ Table 1 end to end
echo "### Table 1 end to end: selections in vs dense in (own selection + residual)"
echo
echo "Trace \`gradtrace synthetic $T1_SHAPE --ranks P --steps $T1_STEPS --seed 1 --overlap 0.3\` (Table 1's"
echo "generator with more steps, so that most are Ok-Topk reuse steps). *sel in*: as Table 1, the sparse"
echo "allreduces reduce \`gradselect --method topk --density $D\` selections (exactly k per rank, gradselect's"
echo "residual). *e2e*: \`gradallreduce --algo A --density $D\` gets the dense trace and runs the algorithm's"
echo "own local selection with error feedback on (the default; \`--no-residual\` turns it off): exact top-k"
echo "for TopkA/TopkDSA/gTopk, Ok-Topk's threshold reuse (default \`--adjust ladder\`, τ' = 32) and the"
echo "Algorithm 2 residual. Bytes sent per rank and step, median (min–max) over steps and ranks; formula ="
echo "Table 1 (TopkA 2k(P−1), TopkDSA best case 4k(P−1)/P, gTopk 4k log P, Ok-Topk worst case 6k(P−1)/P,"
echo "Gaussiank 2k(P−1), in 4-byte words), from \`model_bytes_sent\`; ratio = measured / formula."
echo
for P in $T1_PS; do
  run $B/gradtrace synthetic $T1_SHAPE --ranks $P --steps $T1_STEPS --seed 1 --overlap 0.3 -q -o t1-P$P.parquet
  run $B/gradselect --method topk --density $D -q t1-P$P.parquet -o t1-sel-P$P.parquet
  for a in topka topkdsa gtopk oktopk; do
    period=(); [ $a = oktopk ] && period=(--period 2)
    run $B/gradallreduce --algo $a --ranks $P "${period[@]}" -q --run "$a sel-in" t1-sel-P$P.parquet \
        -o /dev/null --metrics t1-$a-sel-P$P.m.parquet
    run $B/gradallreduce --algo $a --ranks $P "${period[@]}" --density $D -q --run "$a e2e" t1-P$P.parquet \
        -o /dev/null --metrics t1-$a-e2e-P$P.m.parquet
  done
  run $B/gradallreduce --algo gaussiank --ranks $P --density $D -q --run "gaussiank e2e" t1-P$P.parquet \
      -o /dev/null --metrics t1-gaussiank-e2e-P$P.m.parquet
done
run $B/gradreport volume t1-*.m.parquet --by run,world_size
echo
echo "Selected and reduced entries (nnz = entries in the result; local_nnz = one rank's selection):"
echo
run $B/gradreport table t1-*.m.parquet --by run,world_size --metric nnz,local_nnz
echo
echo "Ok-Topk's bytes per phase, sel in vs e2e:"
echo
run $B/gradreport table t1-oktopk-*.m.parquet --by run,world_size --metric 'bytes_sent:*'
} > figs.md 2> >(tee cmds.log >&2)
wait $! 2>/dev/null || true   # the tee has written cmds.log
{
echo
echo "### Commands"
echo
echo "Every command this page's numbers come from, in the order run (from the output directory"
echo "data/out/oktopk-figs/; \`sparse_figs.py\` is \`pipelines/sparse_figs.py\` run with the repo's .venv):"
echo
echo '```text'
grep '^+ ' cmds.log | sed -e 's#^+ ##' -e "s#$PY $ROOT/pipelines/sparse_figs.py#sparse_figs.py#" -e "s#$ROOT/pipelines/#pipelines/#g" -e "s#$ROOT/#./#g"
echo '```'
} >> figs.md

# the summary that goes into docs/RESULTS.md (full runs) beside the link to the full tables
# table_after PATTERN: the first Markdown table after the first line matching PATTERN
table_after() { awk -v p="$1" 'index($0, p) == 1 { on = 1; next } on && /^\|.*\|$/ { t = 1; print; next } t { exit }' figs.md; }
{
echo "Issue-16 figures, made by \`pipelines/oktopk-figs.sh\` (run at the end of \`make repro-oktopk\`;"
echo "alone: \`make repro-oktopk-figs\`). Every table, its caption and the commands:"
echo "[results/oktopk-figs.md](results/oktopk-figs.md); figures: data/out/oktopk-figs/*.svg."
echo
echo "**Fig. 6 on real gradients** (\`gradtrace model\`: CNN on digits, P = $M_P, $M_STEPS steps$( [ "$LSTM_STEPS" != 0 ] && echo "; LSTM LM on synthetic-lm, P = 2, $LSTM_STEPS steps"); τ' = $M_REEVAL): mean |nnz − k|/k against the paper's < 11 %:"
echo
table_after "### Fig. 6 on real-model gradients"
echo
echo "**Fig. 5, ξ of Assumption 1** (‖Top_k(mean acc) − u/P‖ / ‖mean g‖ along the same trace):"
echo
table_after "### Fig. 5:"
echo
echo "**Fig. 7b, balancing that fires** (P = 8, skewed trace, equal-size regions; busiest rank per step):"
echo
grep -m1 '^`auto` balanced on' figs.md
echo
table_after "\`auto\` balanced on"
echo
if grep -q "^The same two runs as MPI ranks" figs.md; then
  echo "Across 8 shaped hosts (100 Mbit/s):"
  echo
  table_after "The same two runs as MPI ranks"
  echo
fi
echo "**Table 1 end to end** (selections in vs dense in with each algorithm's own selection and residual):"
echo
table_after "### Table 1 end to end"
} > summary.md
expect figs.md "^\| cnn \| oktopk-paper \|" "^\| cnn \| oktopk-ladder \|" "^\| cnn \| gaussiank \|" "^\| cnn \| oktopk --adjust paper \|" \
  "^\| exact d=0\.01 \(--reeval 1" "^\| ladder d=0\.01 \(--reeval" "^\| naive-always \|" "^\| naive-never \|" "^\| oktopk e2e +\|" "^\| topka sel-in +\|"
if [ "$FAST" != 0 ]; then
  cp figs.md RESULTS-section.md
else
  cp figs.md "$ROOT/docs/results/oktopk-figs.md"
  section oktopk-figs summary.md
fi
cat figs.md
