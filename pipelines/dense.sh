#!/usr/bin/env bash
# make repro-dense [FAST=1]: the dense allreduces on in-process ranks (Local) against the same
# under mpirun, and OpenMPI's own MPI_Allreduce (`native`), issue 3's two goals: the ring within
# 1.25× of MPI_Allreduce's time under mpirun, and Local at least as fast as mpirun. REPS
# interleaved repeats (Local then mpirun in each), every number the median over the repeats with
# their min–max, each ratio taken within its repeat. Section "dense" of docs/RESULTS.md;
# outputs in data/out/dense/ (FAST=1: 1 MiB, one iteration, the section stays there).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/dense
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then
  SIZE=1M; ITERS=2; REPS=${REPS:-2}
else
  SIZE=64M; ITERS=5; REPS=${REPS:-3}
fi
P=4
ALGOS=ring,rabenseifner,tree,native
for rep in $(seq "$REPS"); do
  launch $P $B/gradallreduce bench --algo $ALGOS --sizes $SIZE:$SIZE --iters $ITERS \
    --metrics local-r$rep.parquet > local-r$rep.md
  GRADKIT_MPIRUN=1 launch $P $B/gradallreduce bench --algo $ALGOS --sizes $SIZE:$SIZE --iters $ITERS \
    --metrics mpi-r$rep.parquet > mpi-r$rep.md
done
{
echo "Made by \`make repro-dense\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "$SIZE of f32 per rank, P = $P, \`--iters $ITERS\` (each time the median over iterations of the"
echo "slowest rank), $REPS repeats interleaved Local / mpirun; each cell is the median over the"
echo "repeats (min–max), each ratio taken within its repeat. Commands:"
echo
echo '```sh'
echo "gradallreduce bench --ranks $P --algo $ALGOS --sizes $SIZE:$SIZE --iters $ITERS"
echo "mpirun -np $P --oversubscribe gradallreduce bench --algo $ALGOS --sizes $SIZE:$SIZE --iters $ITERS"
echo '```'
echo
PYTHONPATH="$ROOT/pipelines" "$PY" - "$REPS" "$P" <<'PY'
import statistics as st, sys
import pyarrow.parquet as pq
from spread import spread
reps, p = int(sys.argv[1]), int(sys.argv[2])

def load(path):
    t = pq.read_table(path).to_pydict()
    out = {}
    for algo, m, v in zip(t["algo"], t["metric"], t["value"]):
        out.setdefault(algo, {})[m] = v
    return out

runs = {mode: [load(f"{mode}-r{r}.parquet") for r in range(1, reps + 1)] for mode in ("local", "mpi")}

ms = lambda xs: spread([x * 1e3 for x in xs])
gb = lambda xs: spread(xs, "{:.2f}")
ratio = lambda xs: spread(xs, "{:.2f}", "×")
names = {"ring": "ring", "rabenseifner": "rabenseifner", "tree": "tree (busiest rank's bytes)",
         "native": "native (MPI_Allreduce / shared memory)"}
print("| algo | bytes sent per rank | Local ms | MPI ms | busbw Local GB/s | busbw MPI GB/s | MPI / Local |")
print("|---|---:|---:|---:|---:|---:|---:|")
for algo, name in names.items():
    col = lambda mode, m: [r[algo][m] for r in runs[mode]]
    sent = int(st.median(col("mpi", "bytes_sent")))
    per = [m / l for m, l in zip(col("mpi", "time_s"), col("local", "time_s"))]
    print(f"| {name} | {sent:,} | {ms(col('local', 'time_s'))} | {ms(col('mpi', 'time_s'))} | "
          f"{gb(col('local', 'busbw_GBps'))} | {gb(col('mpi', 'busbw_GBps'))} | {ratio(per)} |")
print()
ring_nat = [r["ring"]["time_s"] / r["native"]["time_s"] for r in runs["mpi"]]
loc_mpi = [l["ring"]["time_s"] / m["ring"]["time_s"] for l, m in zip(runs["local"], runs["mpi"])]
def met(xs, limit):
    if max(xs) <= limit:
        return "met"
    return "met by the median, not in every repeat" if st.median(xs) <= limit else "NOT met"
print(f"- Goal \"ring within 1.25× of OpenMPI's time\" (under mpirun, ring / MPI_Allreduce): "
      f"{ratio(ring_nat)} — {met(ring_nat, 1.25)}.")
print(f"- Goal \"Local at least as fast as MPI\" (ring, Local / mpirun): {ratio(loc_mpi)} — {met(loc_mpi, 1.0)}.")
PY
} > section.md
section dense section.md
expect section.md "^\| ring \| [0-9,]+ \| [0-9]" "^\| native " "^- Goal \"ring within"
cat section.md
