#!/usr/bin/env bash
# EmbRace reproduction (make repro-embrace); FAST=1 is the quick version that `make test` runs.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/embrace
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  V=3000; NTOK=30000; PS="2 4"; STEPS=2; MODEL="--d-model 16 --layers 1 --heads 2 --seq-len 16"; BATCH=4
  SWEEP_V=500; SWEEP_B="1 8"; EQ_STEPS=4
  RSS_V=20000; RSS_D=64; RSS_PS="1 2"
else
  V=50000; NTOK=30000; PS="2 4 8"; STEPS=4; MODEL="--d-model 64 --layers 2 --heads 4 --seq-len 32"; BATCH=4
  SWEEP_V=2000; SWEEP_B="1 4 16 64 256"; EQ_STEPS=10
  RSS_V=100000; RSS_D=256; RSS_PS="1 2 4 8"
fi
BYTE_REPS=$([ "$FAST" != 0 ] && echo 2 || echo 3)  # repeats of the byte table's runs (their times)
# A Zipf(1.1) token stream over V ids (pipelines/zipf_tokens.py).
for zv in $V $RSS_V; do
  "$PY" "$ROOT/pipelines/zipf_tokens.py" "$zv" "$NTOK" "zipf-$zv.parquet"
done
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
echo "(\`lm_head\` is an untied dense V × d layer here: \`bytes_lm_head\` is its own ring allreduce,"
echo "\`bytes_dense_other\` the other dense layers). \`dense\` ring-allreduces the whole gradient"
echo "(embedding included: its \`bytes_sent\` is the total). Medians over steps and ranks; each run $BYTE_REPS times,"
echo "interleaved: the times are the median over those repeats (min–max), the bytes the same in each."
echo
# BYTE_REPS interleaved repeats (the times vary, the bytes do not): the first repeat's files are
# m-EX-PP.parquet (the tables below read them), the others mrep-EX-PP-rR.parquet.
for rep in $(seq $BYTE_REPS); do
  for P in $PS; do
    for ex in dense allgather allgather-raw embrace; do
      sch=(); [ $ex = embrace ] && sch=(--schedule fifo)   # the others have no schedule
      f=m-$ex-P$P.parquet; [ $rep = 1 ] || f=mrep-$ex-P$P-r$rep.parquet
      run $TR --data zipf-$V.parquet --ranks $P --steps $STEPS --exchange "$(exchange_of "$ex")" "${sch[@]}" --lr 0.05 \
          --run $ex-P$P --metrics $f
    done
  done
done
run $B/gradreport table m-*.parquet mrep-*.parquet --per-file --by run --metric bytes_emb,bytes_dense,bytes_lm_head,bytes_dense_other,bytes_sent,time_step_s,time_compute_s
echo
echo "The output head's share of embrace's bytes per rank and step (median):"
echo
echo "| P | bytes_lm_head | bytes_sent (all) | lm_head share |"
echo "|---:|---:|---:|---:|"
for P in $PS; do
  $B/gradreport table m-embrace-P$P.parquet --by run --metric bytes_lm_head,bytes_sent --format csv \
    | awk -F, -v P=$P 'NR==2 { printf "| %d | %.0f | %.0f | %.1f %% |\n", P, $2, $5, 100*$2/$5 }'
done
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
# No `-p`: selecting one package resolves its dependencies' features anew and compiled
# parquet and everything above it a second time (minutes on a fresh clone).
run cargo run --release --locked -q --example embrace_cost -- $V $DM $D
echo

echo "### Density sweep: where AlltoAll beats AllGather and dense (P = 4, V = $SWEEP_V)"
echo
echo "synthetic-lm (Zipf/Markov), tokens per rank = batch × seq-len; embedding bytes per rank"
echo "(median over steps and ranks); dense's embedding share is 2(P−1)/P·4·V·d."
echo
echo "\`embrace-unique\` is \`--lookup unique\`: the forward AlltoAll sends one row slice per distinct"
echo "token of the receiving rank instead of one per token (issue 17; not the paper's). ρ = coalesced"
echo "rows per token; per-token embrace beats coalesced allgather iff ρ > 1/(P−1) = 1/3, unique"
echo "embrace for every ρ at P ≥ 3 (docs/ALGORITHMS.md)."
echo
echo "| batch | tokens/V | ρ (rows/token) | dense | allgather | allgather-raw | embrace | embrace-unique |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for b in $SWEEP_B; do
  for ex in allgather allgather-raw embrace embrace-unique; do
    case $ex in
      embrace) fl="--exchange embrace --schedule fifo";;
      embrace-unique) fl="--exchange embrace --schedule fifo --lookup unique";;
      *) fl="--exchange $(exchange_of "$ex")";;   # the AllGather baselines have no schedule
    esac
    run $B/gradtrain --model transformer-lm $MODEL --data synthetic-lm --vocab $SWEEP_V --tokens 200000 \
        --batch $b --ranks 4 --steps 2 --lr 0.05 -q $fl --run s-$ex-b$b --metrics s-$ex-b$b.parquet
  done
  ag=$($B/gradreport table s-allgather-b$b.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  agr=$($B/gradreport table s-allgather-raw-b$b.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  emu=$($B/gradreport table s-embrace-unique-b$b.parquet --by run --metric bytes_emb --format csv | awk -F, 'NR==2{print $2}')
  emr=$($B/gradreport table s-embrace-b$b.parquet --by run --metric bytes_emb,rows_coalesced,tokens --format csv | awk -F, 'NR==2{print $2" "$5" "$8}')
  echo "$b $ag $agr $emr $SWEEP_V $DM $emu" | awk '{v=$7; d=$8; printf "| %d | %.3f | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", $1, $6/v, $5/$6, 2*3/4*4*v*d, $2, $3, $4, $9}'
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
# The schedules at P = PM, SCHED_REPS interleaved repeats: the first repeat's files are
# sched-S.parquet (the memory, Table 3 and loss tables read them), the others schedrep-S-rR.
SCHED_REPS=$([ "$FAST" != 0 ] && echo 2 || echo 3)
for rep in $(seq $SCHED_REPS); do
  for s in fifo embrace 2d; do
    f=sched-$s.parquet; [ $rep = 1 ] || f=schedrep-$s-r$rep.parquet
    run $TR --data zipf-$V.parquet --ranks $PM --steps $STEPS --exchange embrace --optimizer adam --lr 0.01 \
        --schedule $s --run sched-$s --metrics $f
  done
done
run $TR --data zipf-$V.parquet --ranks $PM --steps 1 --exchange allgather --optimizer adam --lr 0.01 --run mem-allgather --metrics mem-allgather.parquet
run $B/gradreport table sched-fifo.parquet mem-allgather.parquet --by run,rank --metric mem_emb_table_bytes,mem_emb_state_bytes,mem_emb_dense_equiv_bytes --no-range
echo
echo "These are the tables of record; the model itself holds no V × d embedding, lookup buffer"
echo "or gradient under embrace/allgather (measured below)."
echo

echo "### Peak RSS per rank (measured, mpirun)"
echo
echo "lstm-lm (--d-model $RSS_D --hidden 8 --seq-len 8, batch 2, so the V × d token embedding dominates: the"
echo "untied head is only V × 8) on a Zipf file over V = $RSS_V ids, SGD, 3 steps,"
echo "\`mpirun -np P gradtrain ... --rss\`: one process per rank. \`peak_rss_bytes\` is each process's"
echo "VmHWM (= getrusage ru_maxrss) after every step; the table gives, per P, the largest rank's"
echo "peak over the steps in MB. After the last step rank 0 evaluates (its V-wide logits of"
echo "the evaluation windows) and gathers the table for the report: not in these numbers."
echo "V × d·4 = $(awk -v v=$RSS_V -v d=$RSS_D 'BEGIN{printf "%.1f", v*d*4/1e6}') MB."
echo
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "| P | dense | allgather | embrace | embrace: smallest rank |"
  echo "|---:|---:|---:|---:|---:|"
  for P in $RSS_PS; do
    for ex in dense allgather embrace; do
      sch=(); [ $ex = embrace ] && sch=(--schedule fifo)
      run mpirun --oversubscribe -np $P $B/gradtrain --model lstm-lm --d-model $RSS_D --hidden 8 --seq-len 8 \
          --batch 2 --data zipf-$RSS_V.parquet --steps 3 --lr 0.05 -q --exchange "$(exchange_of "$ex")" "${sch[@]}" \
          --rss --run rss-$ex-P$P --metrics rss-$ex-P$P.parquet
    done
    row="$P"
    for ex in dense allgather embrace; do
      row="$row $($B/gradreport table rss-$ex-P$P.parquet --by rank --metric peak_rss_bytes --stat max --format csv \
        | awk -F, 'NR>1 { if ($2>m) m=$2; if (n==0 || $2<s) s=$2; n++ } END { printf "%.1f %.1f", m/1e6, s/1e6 }')"
    done
    echo "$row" | awk '{ printf "| %d | %s | %s | %s | %s |\n", $1, $2, $4, $6, $7 }'
  done
else
  echo "(mpirun not found: skipped.)"
fi
echo

echo "### FIFO vs EmbRace scheduling (P = $PM, Adam)"
echo
echo "stall_s = step wall time − compute − update (time the step waits on communication); under"
echo "\`embrace\` (vertical only) the delayed rows travel while the next step computes"
echo "(time_overlapped_s); under \`2d\` (vertical + horizontal, embrace.md §2.1) each dense block's"
echo "allreduce and update also overlap the next forward, which waits per block (time_fwd_wait_s)."
echo "Each cell: the mean over steps and ranks within one run, then the median over $SCHED_REPS interleaved"
echo "repeats with their min–max (\`gradreport table --per-file\`)."
echo
run $B/gradreport table sched-*.parquet schedrep-*.parquet --per-file --by run --metric stall_s,time_step_s,time_compute_s,time_overlapped_s,rows_prior,rows_delayed,rows_coalesced,bytes_emb --stat mean
echo
# The paper's Table 3 beside ours: coalescing (rows per token) and the delayed share of the
# coalesced rows. FIFO never splits rows (rows_prior = rows_coalesced), so the split is taken
# from the scheduled run; pipelines/docs_check.py checks the row against the table above.
{ $B/gradreport table sched-fifo.parquet --by run --metric tokens,rows_coalesced --stat mean --format csv | sed -n 2p
  $B/gradreport table sched-embrace.parquet --by run --metric rows_coalesced,rows_prior --stat mean --format csv | sed -n 2p
} | awk -F, 'NR==1 { tok = $2; coal = $5 } NR==2 { printf "Coalescing (fifo run) and the vertical split (embrace run), measured (means over steps and ranks) beside the paper'"'"'s Table 3:\n\n| | here (Zipf(1.1), V = %s) | paper: LM | GNMT-8 | Transformer | BERT-base |\n|---|---:|---:|---:|---:|---:|\n| rows removed by coalescing (1 − rows/tokens) | %.1f %% | 20.4 %% | 53.1 %% | 52.9 %% | 84.7 %% |\n| of those, rows delayed (1 − prior/coalesced) | %.1f %% | 61.8 %% | 52.5 %% | 46.3 %% | 41.9 %% |\n", v, 100 * (1 - coal / tok), 100 * (1 - $5 / $2) }' v=$V
echo
echo "The paper (RTX3090s): 2D scheduling adds 3.0–26.0 % throughput on top of the hybrid"
echo "communication at 16 GPUs and 0.7–7.5 % at 4 (Fig. 9); EmbRace's stall is 1.45–2.56× below the"
echo "baselines' at 16 GPUs (Fig. 8). The stall tables below are this machine's (P = 4)."
echo
echo "Identical parameters: final loss per schedule (must be equal; \`2d\` to float rounding at P ≥ 3):"
echo
run $B/gradreport table sched-*.parquet --by run --metric loss,eval_loss --stat last --no-range
echo

# The stall each schedule removes: fifo, embrace, 2d interleaved, REPS repeats, medians over
# steps ≥ 2 of the rank mean (step: the slowest rank). In-process in the full mode; across
# the hosts of a cluster when GRADKIT_CLUSTER names one (docs/CLUSTER.md), e.g.
#   pipelines/cluster.sh up --hosts 4 --rate 100mbit
#   GRADKIT_CLUSTER=data/cluster/cluster.env bash pipelines/embrace.sh
stall_table() {
  PYTHONPATH="$ROOT/pipelines" "$PY" - "$@" <<'PY'
import csv, statistics as st, subprocess, sys
from spread import spread
b, files = sys.argv[1], sys.argv[2:]
cols = ["stall_s", "time_step_s", "time_compute_s", "time_overlapped_s", "time_comm_s", "time_fwd_wait_s"]
def med(f):
    out = subprocess.run([b + "/gradreport", "table", f, "--by", "step,rank", "--no-range", "--format", "csv",
                          "--metric", ",".join(cols if "-2d-" in f else cols[:-1])],
                         capture_output=True, text=True, check=True).stdout
    rows = [r for r in csv.DictReader(out.splitlines()) if int(r["step"]) >= 2]
    steps = sorted({r["step"] for r in rows})
    res = {}
    for c in cols:
        agg = max if c == "time_step_s" else (lambda xs: sum(xs) / len(xs))
        v = [agg([float(r[c]) for r in rows if r["step"] == s]) for s in steps if c in rows[0]]
        res[c] = st.median(v) if v else float("nan")
    return res
runs = {}
for f in files:
    sched, rep = f.split("-")[1], f.split("-")[2].split(".")[0]
    runs.setdefault(sched, {})[rep] = med(f)
def cell(xs, fmt="{:.1f}"):
    xs = [x for x in xs if x == x]  # a metric the schedule has not (NaN): an empty cell
    return spread(xs, fmt) if xs else ""
print("Each cell: the median over repeats (min–max); *stall removed* is computed within each repeat "
      "(fifo's stall − this schedule's, the same repeat), then its median (min–max).")
print()
print("| schedule | runs | stall ms | step ms | compute ms | overlapped ms | comm ms | fwd wait ms | stall removed vs fifo, ms | stall removed, % of fifo's |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for sched in ["fifo", "embrace", "2d"]:
    if sched not in runs:
        continue
    rs = runs[sched]
    col = lambda c: cell([1000 * r[c] for r in rs.values()])
    both = [k for k in rs if k in runs.get("fifo", {})]
    rem = [1000 * (runs["fifo"][k]["stall_s"] - rs[k]["stall_s"]) for k in both]
    pct = [100 * (runs["fifo"][k]["stall_s"] - rs[k]["stall_s"]) / runs["fifo"][k]["stall_s"] for k in both]
    rm = "" if sched == "fifo" else cell(rem)
    pc = "" if sched == "fifo" else cell(pct, "{:.0f}")
    print(f"| {sched} | {len(rs)} | {col('stall_s')} | {col('time_step_s')} | {col('time_compute_s')} | "
          f"{col('time_overlapped_s')} | {col('time_comm_s')} | {col('time_fwd_wait_s')} | {rm} | {pc} |")
PY
}
if [ "$FAST" = 0 ] || [ -n "${GRADKIT_CLUSTER:-}" ]; then
  REPS=${REPS:-3}
  WHERE=$([ -n "${GRADKIT_CLUSTER:-}" ] && echo "across the cluster's hosts (\`$(basename "$GRADKIT_CLUSTER")\`)" || echo "in-process ranks")
  echo "### The stall each schedule removes (P = 4, $WHERE)"
  echo
  echo "transformer-lm (--d-model 64, 2 blocks, seq 32) on synthetic-lm with V = 4096, batch 8 per"
  echo "rank, SGD, 20 steps; fifo, embrace and 2d interleaved, $REPS repeats; each number is the"
  echo "median over repeats of the median over steps ≥ 2 of the rank mean (step: slowest rank)."
  echo "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  for rep in $(seq $REPS); do
    for s in fifo embrace 2d; do
      launch 4 $B/gradtrain --model transformer-lm --data synthetic-lm --vocab 4096 --tokens 100000 \
          --d-model 64 --batch 8 --steps 20 --optimizer sgd --lr 0.1 --exchange embrace --schedule $s -q \
          --run stall-$s-$rep --metrics $PWD/stall-$s-$rep.parquet
    done
  done
  stall_table $B stall-*.parquet
  echo
fi

echo "### Training equality with dense ($EQ_STEPS steps, P = 4, SGD)"
echo
for ex in dense allgather allgather-raw embrace; do
  run $TR --data zipf-$V.parquet --ranks 4 --steps $EQ_STEPS --lr 0.05 --exchange "$(exchange_of "$ex")" --run eq-$ex --metrics eq-$ex.parquet
done
run $B/gradreport table eq-*.parquet --by run --metric loss,eval_loss --stat last --no-range
run $B/gradreport plot loss eq-*.parquet -o loss.svg >&2
echo
echo "Figure: data/out/embrace/loss.svg."
} > section.md
python3 "$ROOT/pipelines/docs_check.py" --section embrace section.md
section embrace section.md
expect section.md "^\| embrace-P[0-9]+ +\|" "^\| allgather-raw-P[0-9]+ +\|" "lm_head share" \
  "rows removed by coalescing \(1 − rows/tokens\) \| [0-9.]+ % \| 20.4 %" "^\| sched-2d +\|" \
  "^\| batch \| tokens/V \| ρ" "^\| P \| dense \| allgather \| embrace \|"
cat section.md
