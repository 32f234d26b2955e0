#!/usr/bin/env bash
# Peak resident memory (RSS) of the tools that read a tensor/1 trace, against the size of the
# trace and of one step (all ranks) of it: the memory model of docs/MEMORY.md, measured.
#
#   pipelines/bench-memory.sh                       # vgg16 --scale 0.25, 4 ranks, 16 steps (~0.8 GB)
#   SCALE=1 pipelines/bench-memory.sh               # the 3.2 GB trace of issue 19
#   GRADKIT_BIN=/some/other/build pipelines/bench-memory.sh   # compare two builds
#
# Prints a Markdown table (MiB): "× step" is peak RSS over one step's decoded values × ranks;
# "× (step + state)" adds what the tool keeps across steps by design (gradselect's and DEFT's
# residuals: one flat model per rank, i.e. one more step), the quantity issue 19's goal bounds.
# Needs GNU time (/usr/bin/time -v). Peak RSS is measured, never asserted: it depends on the
# allocator and the machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${GRADKIT_BIN:-$ROOT/target/release}
SCALE=${SCALE:-0.25}
RANKS=${RANKS:-4}
STEPS=${STEPS:-16}
SHAPE=${SHAPE:-vgg16}
DIR=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gradkit-memory.XXXXXX")}
KEEP=${KEEP:-0}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time (GNU time) is needed" >&2; exit 1; }
for t in gradtrace gradselect gradpartition gradallreduce; do
  [ -x "$B/$t" ] || { echo "error: $B/$t is not built (cargo build --release -p $t)" >&2; exit 1; }
done
cleanup() { [ "$KEEP" != 0 ] || rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR"
T=$DIR/trace.parquet

if [ ! -s "$T" ]; then
  echo "+ gradtrace synthetic --shape $SHAPE --scale $SCALE --ranks $RANKS --steps $STEPS --seed 1 -o $T" >&2
  "$B/gradtrace" synthetic --shape "$SHAPE" --scale "$SCALE" --ranks "$RANKS" --steps "$STEPS" \
    --seed 1 -q -o "$T"
fi
# One step of all ranks, decoded: numel per rank × 4 bytes × ranks.
numel=$("$B/gradtrace" inspect "$T" --format csv | python3 -c '
import csv, sys
print(sum(int(r["numel"]) for r in csv.DictReader(sys.stdin)))')
step_mib=$(python3 -c "print(f'{$numel * 4 * $RANKS / 2**20:.1f}')")
file_mib=$(python3 -c "import os; print(f'{os.path.getsize(\"$T\") / 2**20:.1f}')")

# rss NAME STATE CMD: run CMD (a shell line) under GNU time; print a table row. STATE is the
# state kept across steps, in steps (1: a residual per rank; 0: none).
rss() {
  local name=$1 state=$2 cmd=$3 log=$DIR/time.log
  echo "+ $cmd" | sed "s#$B/##g; s#$DIR/##g" >&2
  if ! /usr/bin/time -v -o "$log" bash -c "$cmd" >/dev/null 2>"$DIR/stderr"; then
    echo "error: $name failed:" >&2
    cat "$DIR/stderr" >&2
    exit 1
  fi
  local kb s
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  s=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  python3 -c "print(f'| {\"$name\"} | {$kb/1024:.0f} | {$kb/1024/$step_mib:.2f} | {$kb/1024/($step_mib*(1+$state)):.2f} | {$kb/1024/$file_mib:.2f} | $s |')"
}

echo
echo "trace: --shape $SHAPE --scale $SCALE --ranks $RANKS --steps $STEPS: file $file_mib MiB;"
echo "one step × $RANKS ranks decoded: $step_mib MiB ($numel values per rank)"
echo
echo "| command | peak RSS MiB | × step | × (step + state) | × file | wall |"
echo "|---|---:|---:|---:|---:|---|"
rss "gradtrace inspect" 0 "$B/gradtrace inspect $T"
rss "gradtrace cat" 0 "$B/gradtrace cat $T -o $DIR/cat.parquet"
rss "gradselect topk" 1 "$B/gradselect --method topk --density 0.01 -q $T -o $DIR/sel.parquet --metrics $DIR/sel-m.parquet"
rss "gradselect topk --no-residual" 0 "$B/gradselect --method topk --density 0.01 --no-residual -q $T -o $DIR/sel3.parquet"
rss "gradselect topk (stdin)" 1 "$B/gradselect --method topk --density 0.01 -q - -o $DIR/sel2.parquet < $T"
rss "gradselect deft" 1 "$B/gradselect --method deft --density 0.01 -q $T -o $DIR/deft.parquet --residual-out $DIR/res.parquet"
rss "gradpartition deft" 1 "$B/gradpartition --method deft --density 0.01 --no-buildup -q $T -o $DIR/plan.parquet"
rss "gradpartition oktopk (sparse input)" 0 "$B/gradpartition --method oktopk -q $DIR/sel.parquet -o $DIR/regions.parquet"
# gradallreduce: rank 0 streams the trace one step at a time to the ranks and writes each
# step's result as it completes. "state": what the reducers keep across steps (Ok-Topk's
# residual of dense input, the 1-bit error buffers: about one model per rank, i.e. one step).
rss "gradallreduce ring --ranks $RANKS" 0 "$B/gradallreduce --algo ring --ranks $RANKS -q $T -o $DIR/ar-ring.parquet --metrics $DIR/ar-ring-m.parquet"
rss "gradallreduce oktopk --ranks $RANKS" 1 "$B/gradallreduce --algo oktopk --ranks $RANKS -q $T -o $DIR/ar-ok.parquet"
rss "gradallreduce onebit --ranks $RANKS --state" 1 "$B/gradallreduce --algo onebit --ranks $RANKS -q $T -o $DIR/ar-1b.parquet --state $DIR/ar-1b.state"
rss "gradallreduce oktopk --ranks $RANKS (sparse input, 1 %)" 0 "$B/gradallreduce --algo oktopk --ranks $RANKS -q $DIR/sel.parquet -o $DIR/ar-oks.parquet"
# Under mpirun GNU time reports the largest peak of any one process (rank 0, which reads and
# writes): ranks are separate processes.
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  rss "mpirun -np $RANKS gradallreduce ring (largest rank)" 0 "mpirun --oversubscribe -np $RANKS $B/gradallreduce --algo ring -q $T -o $DIR/ar-ring-mpi.parquet"
  rss "mpirun -np $RANKS gradallreduce oktopk (largest rank)" 1 "mpirun --oversubscribe -np $RANKS $B/gradallreduce --algo oktopk -q $T -o $DIR/ar-ok-mpi.parquet"
fi
