#!/usr/bin/env bash
# 1-bit LAMB reproduction; FAST=1 is the short version that `make test` runs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/onebit-lamb
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  STEPS=60; FREEZE=15; MODEL="--d-model 32 --layers 1 --seq-len 16 --batch 8"
else
  STEPS=600; FREEZE=100; MODEL="--d-model 64 --layers 2 --seq-len 32 --batch 16"
fi
P=4
COMMON="--model transformer-lm --data synthetic-lm --ranks $P --steps $STEPS --lr 0.01 --seed 1 --eval-every $((STEPS/4)) $MODEL -q"
{
echo "Made by \`make repro-onebit-lamb\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores."
echo
echo "\`gradtrain $COMMON\` with \`--optimizer lamb\` (dense ring allreduce of the"
echo "gradient), \`--optimizer onebit-lamb --exchange onebit --freeze-step $FREEZE\` and"
echo "\`--optimizer onebit-adam --exchange onebit --freeze-step $FREEZE\` (1-bit compressed"
echo "allreduce of the momentum after the warm-up)."
echo
run $B/gradtrain $COMMON --optimizer lamb --run lamb --metrics lamb.parquet
run $B/gradtrain $COMMON --optimizer onebit-lamb --exchange onebit --freeze-step $FREEZE --run onebit-lamb --metrics onebit-lamb.parquet
run $B/gradtrain $COMMON --optimizer onebit-adam --exchange onebit --freeze-step $FREEZE --run onebit-adam --metrics onebit-adam.parquet
echo "Bytes sent per rank over the whole run, final training loss and evaluation:"
echo
run $B/gradreport table lamb.parquet onebit-lamb.parquet onebit-adam.parquet --by run --metric bytes_sent --stat sum
echo
run $B/gradreport table lamb.parquet onebit-lamb.parquet onebit-adam.parquet --by run --metric loss,eval_loss,eval_accuracy --stat last
echo
# Volume reduction: measured (LAMB's bytes / 1-bit LAMB's bytes) vs the paper's formula with
# the warm-up fraction w = FREEZE/STEPS (16 for fp16 buffers; ours are fp32, so 32).
sum() { $B/gradreport table "$1" --by run --metric bytes_sent --stat sum --format csv | awk -F, 'NR==2 {print $2}'; }
L=$(sum lamb.parquet); O=$(sum onebit-lamb.parquet)
awk -v l="$L" -v o="$O" -v f=$FREEZE -v s=$STEPS 'BEGIN {
  w = f / s;
  printf "| quantity | value |\n|---|---:|\n";
  printf "| warm-up fraction w | %.3f |\n", w;
  printf "| measured volume reduction (LAMB / 1-bit LAMB) | %.2f× |\n", l / o;
  printf "| formula 1/(w + (1−w)/32), fp32 | %.2f× |\n", 1 / (w + (1 - w) / 32);
  printf "| paper formula 1/(w + (1−w)/16), fp16 | %.2f× |\n", 1 / (w + (1 - w) / 16);
}'
echo
# With an fp16 wire (mixed-precision training's allreduce) and the paper's warm-up fraction
# w = 1/6 (16.7 %, BERT seq128: 1000 of 5993 steps): measured vs 1/(w + (1−w)/16) = 4.57×.
F16=$((STEPS / 6))
run $B/gradtrain $COMMON --optimizer lamb --wire fp16 --run lamb-fp16 --metrics lamb-fp16.parquet
run $B/gradtrain $COMMON --optimizer onebit-lamb --exchange onebit --freeze-step $F16 --wire fp16 --run onebit-lamb-fp16 --metrics onebit-lamb-fp16.parquet
L16=$(sum lamb-fp16.parquet); O16=$(sum onebit-lamb-fp16.parquet)
echo "fp16 wire (\`--wire fp16\`), 1-bit LAMB with \`--freeze-step $F16\` of $STEPS:"
echo
awk -v l="$L16" -v o="$O16" -v f=$F16 -v s=$STEPS 'BEGIN {
  w = f / s;
  printf "| quantity | value |\n|---|---:|\n";
  printf "| warm-up fraction w | %.3f |\n", w;
  printf "| LAMB bytes (fp16 ring), all ranks and steps | %d |\n", l;
  printf "| 1-bit LAMB bytes (fp16 warm-up, 1-bit after) | %d |\n", o;
  printf "| measured volume reduction, fp16 | %.2f× |\n", l / o;
  printf "| paper formula 1/(w + (1−w)/16) | %.2f× |\n", 1 / (w + (1 - w) / 16);
}'
echo
run $B/gradreport plot loss lamb.parquet onebit-lamb.parquet onebit-adam.parquet -o loss.svg >&2
echo "Figure: data/out/onebit-lamb/loss.svg."
echo
# 1-bit Adam at its own learning rate (issue 17): the runs above share LAMB's lr, which is not
# a fair comparison for the Adam family. Sweep Adam (dense) and 1-bit Adam over the same grid
# and compare each at its best lr by the final evaluation loss.
if [ "$FAST" != 0 ]; then LRS="0.003 0.01"; else LRS="0.0003 0.001 0.003 0.01"; fi
SWEEP=()
for lr in $LRS; do
  run $B/gradtrain ${COMMON/--lr 0.01/--lr $lr} --optimizer adam --run adam-lr=$lr --metrics adam-$lr.parquet
  run $B/gradtrain ${COMMON/--lr 0.01/--lr $lr} --optimizer onebit-adam --exchange onebit --freeze-step $FREEZE --run onebit-adam-lr=$lr --metrics onebit-adam-$lr.parquet
  SWEEP+=(adam-$lr.parquet onebit-adam-$lr.parquet)
done
echo "Adam and 1-bit Adam (\`--freeze-step $FREEZE\`) over \`--lr\` in {${LRS// /, }}, otherwise as above:"
echo
run $B/gradreport table "${SWEEP[@]}" --by run --metric loss,eval_loss --stat last
echo
best() { $B/gradreport table "${SWEEP[@]}" --by run --metric eval_loss --stat last --format csv \
  | awk -F, -v o="$1" 'NR > 1 && index($1, o "-lr=") == 1 && (b == "" || $2 < b) { b = $2; r = $1 } END { print r " (eval loss " b ")" }'; }
echo "Best of each by final evaluation loss: $(best adam); $(best onebit-adam)."
echo
# The MLP parity question (issue 17) and the paper's "LAMB + basic 1-bit" ablation (§3.4):
# LAMB's per-tensor scaling coefficients (Figs. 1-3) against 1-bit LAMB's r·c_avg and the
# basic variant's frozen c_avg.
if [ "$FAST" != 0 ]; then MSTEPS=60; MFREEZE=15; else MSTEPS=150; MFREEZE=30; fi
MLP="--model mlp --ranks $P --steps $MSTEPS --seed 1 --lr 0.01 -q"
run $B/gradtrain $MLP --optimizer lamb --run lamb --metrics mlp-lamb.parquet
run $B/gradtrain $MLP --optimizer onebit-lamb --exchange onebit --freeze-step $MFREEZE --run onebit-lamb --metrics mlp-onebit-lamb.parquet
run $B/gradtrain $MLP --optimizer onebit-lamb --exchange onebit --freeze-step $MFREEZE --onebit-basic --run onebit-lamb-basic --metrics mlp-onebit-basic.parquet
echo "MLP (\`gradtrain $MLP\`, 1-bit runs with \`--freeze-step $MFREEZE\`): LAMB's scaling"
echo "coefficient c = clip(‖x‖/‖u‖) per tensor (\`lamb_coeff:<tensor>\`) at the last step,"
echo "against 1-bit LAMB's r·c_avg and the ablation's frozen c_avg, and the final loss:"
echo
COEFFS=lamb_coeff:fc1.weight,lamb_coeff:fc2.weight,lamb_coeff:fc3.weight
run $B/gradreport table mlp-lamb.parquet mlp-onebit-lamb.parquet mlp-onebit-basic.parquet --by run --metric loss,$COEFFS --stat last
echo
echo "The same coefficients at the last warm-up step (step $((MFREEZE-1))), where all three runs are LAMB"
echo "(the median over ranks; every rank holds the same value):"
echo
echo "| run | fc1.weight | fc2.weight | fc3.weight |"
echo "|---|---:|---:|---:|"
for f in mlp-lamb mlp-onebit-lamb mlp-onebit-basic; do
  $B/gradreport table $f.parquet --by run,step --metric $COEFFS --format csv \
    | awk -F, -v s=$((MFREEZE-1)) '$2 == s { printf "| %s | %s | %s | %s |\n", $1, $3, $6, $9 }'
done
echo
for t in fc1 fc2 fc3; do
  run $B/gradreport plot loss mlp-lamb.parquet mlp-onebit-lamb.parquet mlp-onebit-basic.parquet --metric lamb_coeff:$t.weight --title "$t.weight scaling coefficient (Figs. 1-3)" -o coeff-$t.svg >&2
done
echo
echo "Figures (the paper's Figs. 1–3: each layer's scaling coefficient per step, LAMB against 1-bit"
echo "LAMB's reconstruction and the basic ablation): data/out/onebit-lamb/coeff-{fc1,fc2,fc3}.svg."
} > section.md
section onebit-lamb section.md
expect section.md "^\| lamb +\| +[0-9]+ \|" "^\| onebit-lamb +\|" "^\| onebit-adam +\|" "measured volume reduction" "formula 1/\(w" "measured volume reduction, fp16" "lamb_coeff:fc1.weight" "coeff-\{fc1,fc2,fc3\}.svg" "^\| onebit-adam-lr=" "Best of each by final evaluation loss: adam-lr=[0-9.]+ \(eval loss [0-9.]+\); onebit-adam-lr="
cat section.md
