#!/usr/bin/env bash
# EmbRace reproduction (make repro-embrace); FAST=1 is the quick version that `make test` runs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/embrace
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ "$FAST" != 0 ]; then
  V=3000; NTOK=30000; PS="2 4"; STEPS=2; MODEL="--d-model 16 --layers 1 --heads 2 --seq-len 16"; BATCH=4
  SWEEP_V=500; SWEEP_B="1 8"; EQ_STEPS=4
else
  V=50000; NTOK=30000; PS="2 4 8"; STEPS=4; MODEL="--d-model 64 --layers 2 --heads 4 --seq-len 32"; BATCH=4
  SWEEP_V=2000; SWEEP_B="1 4 16 64"; EQ_STEPS=10
fi
# A Zipf(1.1) token stream over V ids (i.i.d.; gradtrain's synthetic-lm builds a V×V Markov
# matrix, which does not fit in memory at V = 50k). Token V−1 appears once so vocab = V.
"$PY" - "$V" "$NTOK" <<'PY'
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
v, n = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(1)
p = 1.0 / np.arange(1, v + 1) ** 1.1; p /= p.sum()
t = rng.choice(v, size=n, p=p).astype(np.int32); t[0] = v - 1
rows = [t[i:i + 1000].tolist() for i in range(0, n, 1000)]
pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}), f"zipf-{v}.parquet")
PY
TR="$B/gradtrain --model transformer-lm $MODEL --batch $BATCH -q"
{
echo "Made by \`make repro-embrace\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores."
echo "transformer-lm ($MODEL, batch $BATCH sequences per rank) on a Zipf(1.1) token stream"
echo "over V = $V ids (\`zipf-$V.parquet\`), in-process ranks, $STEPS steps, SGD."
echo

echo "### Bytes per rank and step: embedding and dense parts"
echo
echo "\`bytes_emb\` = forward lookup AlltoAll + gradient exchange (embrace), or the AllGather of"
echo "row-sparse gradients: \`allgather\` coalesces duplicate rows first (one row per distinct"
echo "token), \`allgather-raw\` sends one row per token as Horovod/PyTorch DDP do; \`bytes_dense\` = ring allreduce of every other layer"
echo "(\`lm_head\` is a dense V × d layer here). \`dense\` ring-allreduces the whole gradient"
echo "(embedding included: its \`bytes_sent\` is the total). Medians over steps and ranks."
echo
for P in $PS; do
  for ex in dense allgather allgather-raw embrace; do
    run $TR --data zipf-$V.parquet --ranks $P --steps $STEPS --exchange $ex --schedule fifo --lr 0.05 \
        --run $ex-P$P --metrics m-$ex-P$P.parquet
  done
done
run $B/gradreport table m-*.parquet --by run --metric bytes_emb,bytes_dense,bytes_sent,time_step_s,time_compute_s --no-range
echo
echo "Embedding bytes per rank vs P (median; dense = its total minus embrace's dense part):"
echo
echo "| P | dense (ring of V×d) | allgather (coalesced) | allgather-raw (per token) | embrace (AlltoAll) | embrace / allgather | embrace / allgather-raw |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for P in $PS; do
  tot=$($B/gradreport table m-dense-P$P.parquet --by run --metric bytes_sent --format csv | awk -F, 'NR==2{print $2}')
  ag=$($B/gradreport table m-allgather-P$P.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  agr=$($B/gradreport table m-allgather-raw-P$P.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  em=$($B/gradreport table m-embrace-P$P.parquet --by run --metric bytes_emb,bytes_dense --format csv | awk -F, 'NR==2{print $2" "$5}')
  echo "$P $tot $ag $agr $em" | awk '{printf "| %d | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", $1, $2-$6, $3, $4, $5, $5/$3, $5/$4}'
done
echo

echo "### Cost model (embrace.md Table 2) at the measured density"
echo
echo "Density α = tokens per rank / V (the paper's uncoalesced measure); α-β: 5 µs, 10 GB/s."
echo "The model counts neither row ids nor the difference between tokens (forward) and"
echo "coalesced rows (backward); the measured table above has both."
echo
D=$(awk -v t=$((BATCH * $(echo "$MODEL" | sed 's/.*--seq-len \([0-9]*\).*/\1/'))) -v v=$V 'BEGIN{printf "%.6f", t/v}')
DM=$(echo "$MODEL" | sed 's/.*--d-model \([0-9]*\).*/\1/')
run cargo run --release -q -p gradkit-train --example embrace_cost -- $V $DM $D
echo

echo "### Density sweep: where AlltoAll beats AllGather and dense (P = 4, V = $SWEEP_V)"
echo
echo "synthetic-lm (Zipf/Markov), tokens per rank = batch × seq-len; embedding bytes per rank"
echo "(median over steps and ranks); dense's embedding share is 2(P−1)/P·4·V·d."
echo
echo "| batch | tokens/V | coalesced rows/V | dense | allgather | allgather-raw | embrace |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for b in $SWEEP_B; do
  for ex in allgather allgather-raw embrace; do
    run $B/gradtrain --model transformer-lm $MODEL --data synthetic-lm --vocab $SWEEP_V --tokens 200000 \
        --batch $b --ranks 4 --steps 2 --lr 0.05 -q --exchange $ex --schedule fifo --run s-$ex-b$b --metrics s-$ex-b$b.parquet
  done
  ag=$($B/gradreport table s-allgather-b$b.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  agr=$($B/gradreport table s-allgather-raw-b$b.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  emr=$($B/gradreport table s-embrace-b$b.parquet --by run --metric bytes_emb,rows_coalesced,tokens --format csv | awk -F, 'NR==2{print $2" "$5" "$8}')
  echo "$b $ag $agr $emr $SWEEP_V $DM" | awk '{v=$7; d=$8; printf "| %d | %.3f | %.3f | %.0f | %.0f | %.0f | %.0f |\n", $1, $6/v, $5/v, 2*3/4*4*v*d, $2, $3, $4}'
done
echo

echo "### Per-rank load: column split vs row split (Zipf tokens)"
echo
echo "Values each owner serves per step (forward lookups + gradient rows) if the table were cut"
echo "by columns (EmbRace) or by contiguous row ranges (frequent ids are small ids): max/mean over"
echo "ranks at step 0."
echo
echo "| P | column max/mean | row max/mean |"
echo "|---:|---:|---:|"
for P in $PS; do
  $B/gradreport table m-embrace-P$P.parquet --by step,rank --metric load_col,load_row --format csv \
    | awk -F, -v P=$P 'NR>1 && $1==0 { c[$2]=$3; r[$2]=$6; n++ }
        END { mc=0; mr=0; sc=0; sr=0; for (k in c) { sc+=c[k]; sr+=r[k]; if (c[k]>mc) mc=c[k]; if (r[k]>mr) mr=r[k] }
              printf "| %d | %.2f | %.2f |\n", P, mc/(sc/n), mr/(sr/n) }'
done
echo

echo "### Memory per rank for the token embedding (Adam: table + 2 moments)"
echo
PM=$(echo $PS | awk '{print $NF}')
for s in fifo embrace; do
  run $TR --data zipf-$V.parquet --ranks $PM --steps $STEPS --exchange embrace --optimizer adam --lr 0.01 \
      --schedule $s --run sched-$s --metrics sched-$s.parquet
done
run $TR --data zipf-$V.parquet --ranks $PM --steps 1 --exchange allgather --optimizer adam --lr 0.01 --run mem-allgather --metrics mem-allgather.parquet
run $B/gradreport table sched-fifo.parquet mem-allgather.parquet --by run,rank --metric mem_emb_table_bytes,mem_emb_state_bytes,mem_emb_dense_equiv_bytes --no-range
echo
echo "(Our candle model still holds a V × d lookup buffer and its dense gradient per rank; see"
echo "docs/gradtrain.md.)"
echo

echo "### FIFO vs EmbRace scheduling (P = $PM, Adam)"
echo
echo "stall_s = step wall time − compute − update (time the step waits on communication); under"
echo "\`embrace\` the delayed rows travel while the next step computes (time_overlapped_s)."
echo
run $B/gradreport table sched-*.parquet --by run --metric stall_s,time_step_s,time_compute_s,time_overlapped_s,rows_prior,rows_delayed,rows_coalesced,bytes_emb --stat mean --no-range
echo
echo "Identical parameters: final loss per schedule (must be equal):"
echo
run $B/gradreport table sched-*.parquet --by run --metric loss,eval_loss --stat last --no-range
echo

echo "### Training equality with dense ($EQ_STEPS steps, P = 4, SGD)"
echo
for ex in dense allgather allgather-raw embrace; do
  run $TR --data zipf-$V.parquet --ranks 4 --steps $EQ_STEPS --lr 0.05 --exchange $ex --run eq-$ex --metrics eq-$ex.parquet
done
run $B/gradreport table eq-*.parquet --by run --metric loss,eval_loss --stat last --no-range
run $B/gradreport plot loss eq-*.parquet -o loss.svg >&2 || true
echo
echo "Figure: data/out/embrace/loss.svg."
} > section.md
section embrace section.md
cat section.md
