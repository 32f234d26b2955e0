#!/usr/bin/env bash
# DEFT Figs. 7 and 9 as a breakdown (make repro-deft-breakdown; run at the end of make
# repro-deft): per step, the slowest rank's selection (the top-k itself), norms and bin
# packing, broadcast and communication, for topk-union, cltk and deft on an LSTM-shaped
# gradient at density 0.001, P = 2…8; then an n·log k heap top-k beside gradkit's two-pass one
# (lib/sparsify/examples/bench_topk_heap.rs), to test Eq. 6's cost model on this CPU.
# In-process ranks by default; HOSTS=N [RATE=1gbit]: one rank per host on a cluster of N
# shaped hosts it brings up and down (root; docs/CLUSTER.md), outputs in
# data/out/deft-breakdown-hosts/ and the RESULTS.md section deft-breakdown-hosts.
# FAST=1: a small trace, one repeat; the section stays in data/out/deft-breakdown/.
source "$(dirname "$0")/lib.sh"
if [ -n "${HOSTS:-}" ] && [ -z "${GRADKIT_CLUSTER:-}" ]; then
  mkdir -p "$ROOT/data/out" && cd "$ROOT/data/out"
  with_cluster "$HOSTS" "${RATE:-1gbit}" bash "$ROOT/pipelines/deft-breakdown.sh"
  exit
fi
NAME=deft-breakdown${GRADKIT_CLUSTER:+-hosts}
OUT=$ROOT/data/out/$NAME
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
D=0.001
if [ "$FAST" != 0 ]; then
  SCALE=0.02; PS="2 4"; STEPS=3; REPS=1; HEAP_N=200000
else
  # scale 1.0 is DEFT's LSTM (28.9 M parameters): SCALE=1 for it (P = 8 writes a 2.8 GB trace).
  SCALE=${SCALE:-0.25}; PS="2 4 8"; STEPS=4; REPS=${REPS:-3}; HEAP_N=
fi
ALGOS="topk-union cltk deft"
{
echo "Made by \`make repro-deft-breakdown\`$( [ "$FAST" != 0 ] && echo ' (FAST=1)') on $(date -u +%F), $(nproc) cores; load at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "### DEFT Figs. 7 and 9 as a breakdown$( [ -n "${GRADKIT_CLUSTER:-}" ] && echo ' across shaped hosts'): where a step's selection time goes"
echo
echo "Trace \`gradtrace synthetic --shape lstm --scale $SCALE --ranks P --steps $STEPS --seed 3 --overlap 0.2\`"
echo "(DEFT's LSTM at scale $SCALE), \`RAYON_NUM_THREADS=1 gradallreduce --algo A --density $D\` with"
echo "$( [ -n "${GRADKIT_CLUSTER:-}" ] && echo "mpirun across the cluster's hosts ($(sed -n 's/^rate=//p' "$GRADKIT_CLUSTER" 2>/dev/null || true), ranks fill hosts in order)" || echo "in-process ranks sharing the machine's cores") (the paper: 2–16 GPUs"
echo "on 8 nodes of 4 V100s; it does not state its interconnect). Per step the slowest rank's time in each part, then the median"
echo "over steps ≥ 1; each cell is the median over $REPS interleaved repeats (min–max). Parts:"
echo "*top-k* = \`time_topk_s\` (topk-union: every rank over its whole accumulator; cltk: the"
echo "leader alone; deft: each rank over its own pieces), *norms + bin packing* ="
echo "\`time_norms_s\` + \`time_binpack_s\` (deft: every rank's piece norms and k allocation, the"
echo "leader's bin packing), *broadcast* = \`time_s:plan\` (deft: the leader's bins) or"
echo "\`time_s:broadcast_indices\` (cltk: the leader's k indices), *communication* = the"
echo "allgather and allreduce phases; *select total* = \`time_select_s\` (also the error-feedback"
echo "accumulation, and deft's broadcast). All ranks share this machine's $(nproc) cores: beyond one rank per"
echo "core every part's wall time includes waiting for a core, so compare the algorithms at equal P,"
echo "not one P with another, and a broadcast phase includes waiting for its leader's own work."
echo
for rep in $(seq "$REPS"); do
  for P in $PS; do
    [ -e trace-P$P.parquet ] || run $B/gradtrace synthetic --shape lstm --scale $SCALE --ranks $P --steps $STEPS \
      --seed 3 --overlap 0.2 -q -o trace-P$P.parquet
    for a in $ALGOS; do
      RAYON_NUM_THREADS=1 launch $P $B/gradallreduce --algo $a --density $D -q --run $a-P$P-r$rep \
        -o /dev/null --metrics $PWD/m-$a-P$P-r$rep.parquet $PWD/trace-P$P.parquet
    done
  done
done
python3 - "$B" m-*.parquet <<'PY'
import csv, statistics as st, subprocess, sys
from collections import defaultdict
b, files = sys.argv[1], sys.argv[2:]
PARTS = {
    "topk-union": {"topk": ["time_topk_s"], "comm": ["time_s:allgather_indices", "time_s:allreduce_values"]},
    "cltk": {"topk": ["time_topk_s"], "bcast": ["time_s:broadcast_indices"], "comm": ["time_s:allreduce_values"]},
    "deft": {"topk": ["time_topk_s"], "norms": ["time_norms_s", "time_binpack_s"], "bcast": ["time_s:plan"],
             "comm": ["time_s:allgather_counts", "time_s:allgather_indices", "time_s:allreduce_values"]},
}
def parts(f, algo):
    mets = sorted({m for ms in PARTS[algo].values() for m in ms} | {"time_select_s", "time_comm_s"})
    out = subprocess.run([b + "/gradreport", "table", f, "--by", "step,rank", "--no-range", "--format", "csv",
                          "--metric", ",".join(mets)], capture_output=True, text=True, check=True).stdout
    rows = [r for r in csv.DictReader(out.splitlines()) if int(r["step"]) >= 1]
    steps = sorted({int(r["step"]) for r in rows})
    res = {}
    for part, ms in list(PARTS[algo].items()) + [("select", ["time_select_s"]), ("step_comm", ["time_comm_s"])]:
        per_step = [max(sum(float(r[m] or 0) for m in ms) for r in rows if int(r["step"]) == s) for s in steps]
        res[part] = st.median(per_step)
    return res
runs = defaultdict(list)
for f in files:
    algo, p, _ = f[2:-len(".parquet")].rsplit("-", 2)
    runs[(algo, int(p[1:]))].append(parts(f, algo))
def g3(v):
    # 3 significant digits, never an exponent: 0.0118, 75.2, 1180
    return f"{v:.3g}" if abs(v) < 1000 else str(int(float(f"{v:.3g}")))
def cell(xs):
    if not xs:
        return "–"
    m = st.median(xs) * 1e3
    return g3(m) if len(xs) == 1 else f"{g3(m)} ({g3(min(xs) * 1e3)}–{g3(max(xs) * 1e3)})"
print("| algo | P | top-k ms | norms + bin packing ms | broadcast ms | communication ms | select total ms | time_comm_s ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for algo in ["topk-union", "cltk", "deft"]:
    for p in sorted(p for a, p in runs if a == algo):
        rs = runs[(algo, p)]
        col = lambda k: cell([r[k] for r in rs if k in r])
        print(f"| {algo} | {p} | {col('topk')} | {col('norms')} | {col('bcast')} | {col('comm')} | {col('select')} | {col('step_comm')} |")
PY
echo
echo "### Eq. 6's cost model on this CPU: heap top-k (n·log k) vs gradkit's two-pass top-k$( [ -n "${GRADKIT_CLUSTER:-}" ] && echo ' (run again beside the hosts run)')"
echo
N=${HEAP_N:-$($B/gradtrace inspect trace-P2.parquet | sed -n 's/.* \([0-9]*\) elements per step and rank.*/\1/p')}
echo "\`RAYON_NUM_THREADS=1 target/release/examples/bench_topk_heap $N $REPS\` (n = the trace's elements per"
echo "rank; lib/sparsify/examples/bench_topk_heap.rs): the whole model's top-k (P = 1) against one"
echo "worker's ideal DEFT share (n/P elements, k/P), heavy-tailed values in random order and the same"
echo "values in ascending magnitude (the heap's worst case); Eq. 6 predicts the speedup n·log2 k /"
echo "((n/P)·log2(k/P))."
echo
cargo build --release --locked -q --example bench_topk_heap   # no -p: it would rebuild the dependencies
RAYON_NUM_THREADS=1 run "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/bench_topk_heap" "$N" "$REPS"
} > section.md
section $NAME section.md
expect section.md "^\| deft \| 2 \| [0-9]" "^\| cltk \| 4 \| [0-9]" "^\| topk-union \| 2 \| [0-9]" \
  "^\| random \| 0\.001 \| 2 \|" "^\| ascending \| 0\.01 \| 8 \|"
cat section.md
