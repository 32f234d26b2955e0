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
run $B/gradreport plot loss lamb.parquet onebit-lamb.parquet onebit-adam.parquet -o loss.svg >&2
echo "Figure: data/out/onebit-lamb/loss.svg."
} > section.md
section onebit-lamb section.md
expect section.md "^\| lamb +\| +[0-9]+ \|" "^\| onebit-lamb +\|" "^\| onebit-adam +\|" "measured volume reduction" "formula 1/\(w"
cat section.md
