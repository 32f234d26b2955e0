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
# residuals: one flat model per rank, i.e. one more step), the quantity issue 19's goal bounds:
# "≤ 1.5" says whether it is met. Under mpirun every rank's peak is measured (each rank is
# wrapped in GNU time) and the row shows the largest, with the goal checked for every rank
# (a rank's state is its own model: one step / ranks). The last line counts the rows that
# miss the goal. Needs GNU time (/usr/bin/time -v). Peak RSS is measured, never asserted in
# tests: it depends on the allocator and the machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${GRADKIT_BIN:-$ROOT/target/release}
SCALE=${SCALE:-0.25}
RANKS=${RANKS:-4}
STEPS=${STEPS:-16}
SHAPE=${SHAPE:-vgg16}
DIR=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gradkit-memory.XXXXXX")}
KEEP=${KEEP:-0}
# gradallreduce's algorithms measured (in-process and under mpirun): every one that takes a
# dense trace (alltoall needs embedding rows; auto picks one of these).
DENSE_ALGOS="ring ring-fp16 rabenseifner tree native"
SPARSE_ALGOS="topka topkdsa gtopk gaussiank oktopk deft cltk topk-union onebit onebit-naive"
ALGOS=${ALGOS:-$DENSE_ALGOS $SPARSE_ALGOS}
MPI_ALGOS=${MPI_ALGOS:-$ALGOS}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time (GNU time) is needed" >&2; exit 1; }
for t in gradtrace gradselect gradpartition gradallreduce; do
  [ -x "$B/$t" ] || { echo "error: $B/$t is not built (cargo build --release -p $t)" >&2; exit 1; }
done
cleanup() { [ "$KEEP" != 0 ] || rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR"
T=$DIR/trace.parquet

made="an existing $T"
if [ ! -s "$T" ]; then
  made="--shape $SHAPE --scale $SCALE --ranks $RANKS --steps $STEPS"
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

MISSED=0
# row NAME KB STATE WALL [NOTE]: one table row; STATE is the state kept across steps, in steps
# (1: a residual per rank; 0: none).
row() {
  local met
  met=$(python3 -c "print('yes' if $2/1024 <= 1.5*$step_mib*(1+$3) else 'no')")
  [ "$met" = yes ] || MISSED=$((MISSED + 1))
  python3 -c "print(f'| {\"$1\"} | {$2/1024:.0f} | {$2/1024/$step_mib:.2f} | {$2/1024/($step_mib*(1+$3)):.2f} | $met | {$2/1024/$file_mib:.2f} | $4 |')"
}

# rss NAME STATE CMD: run CMD (a shell line) under GNU time; print a table row.
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
  row "$name" "$kb" "$state" "$s"
}

# rss_mpi NAME STATE ARGS...: mpirun -np RANKS, each rank under GNU time (its own peak RSS);
# one row for the largest rank and the goal checked for every rank: STATE is the state of the
# whole job in steps, a rank holding 1/RANKS of it.
rss_mpi() {
  local name=$1 state=$2
  shift 2
  echo "+ mpirun -np $RANKS $*" | sed "s#$B/##g; s#$DIR/##g" >&2
  rm -f "$DIR"/rank-rss.*
  local t0 t1
  t0=$(date +%s.%N)
  if ! mpirun --oversubscribe -np "$RANKS" bash -c \
    '/usr/bin/time -f %M -o "$0/rank-rss.$OMPI_COMM_WORLD_RANK" "$@"' "$DIR" "$@" \
    >/dev/null 2>"$DIR/stderr"; then
    echo "error: $name failed:" >&2
    cat "$DIR/stderr" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  local kbs max r missed=0
  kbs=$(for r in $(seq 0 $((RANKS - 1))); do tail -n1 "$DIR/rank-rss.$r"; done | tr '\n' ' ')
  max=$(echo "$kbs" | tr ' ' '\n' | sort -n | tail -n1)
  for r in $kbs; do
    python3 -c "import sys; sys.exit(0 if $r/1024 <= 1.5*$step_mib*(1+$state/$RANKS) else 1)" ||
      missed=$((missed + 1))
  done
  local wall
  wall=$(python3 -c "print(f'{$t1 - $t0:.2f} s')")
  row "$name (largest rank)" "$max" "$state/$RANKS" "$wall; ranks: $(python3 -c "print(' '.join(str(int(k)//1024) for k in '$kbs'.split()))") MiB, $missed over 1.5"
}

echo
echo "trace: $made: file $file_mib MiB;"
echo "one step × $RANKS ranks decoded: $step_mib MiB ($numel values per rank)"
echo
echo "| command | peak RSS MiB | × step | × (step + state) | ≤ 1.5 | × file | wall |"
echo "|---|---:|---:|---:|---|---:|---|"
rss "gradtrace inspect" 0 "$B/gradtrace inspect $T"
rss "gradtrace cat" 0 "$B/gradtrace cat $T -o $DIR/cat.parquet"
# Outputs are deleted once measured (at SCALE=1 a dense output is as big as a quarter of the
# trace); the selection and the --state files are kept: later rows read them.
rm -f "$DIR/cat.parquet"
rss "gradselect topk" 1 "$B/gradselect --method topk --density 0.01 -q $T -o $DIR/sel.parquet --metrics $DIR/sel-m.parquet"
rss "gradselect topk --no-residual" 0 "$B/gradselect --method topk --density 0.01 --no-residual -q $T -o $DIR/sel3.parquet"
rss "gradselect topk (stdin)" 1 "$B/gradselect --method topk --density 0.01 -q - -o $DIR/sel2.parquet < $T"
rss "gradselect deft" 1 "$B/gradselect --method deft --density 0.01 -q $T -o $DIR/deft.parquet --residual-out $DIR/res.parquet"
rss "gradpartition deft" 1 "$B/gradpartition --method deft --density 0.01 --no-buildup -q $T -o $DIR/plan.parquet"
rss "gradpartition oktopk (sparse input)" 0 "$B/gradpartition --method oktopk -q $DIR/sel.parquet -o $DIR/regions.parquet"
# gradallreduce: rank 0 streams the trace one step at a time to the ranks and writes each
# step's result as it completes. "state": what the reducers keep across steps (the sparse
# algorithms' residuals of dense input: one model per rank, i.e. one step; onebit's error
# buffers: a worker error of one model and a server error of 1/P of it per rank, 1 + 1/P steps).
for algo in $ALGOS; do
  st=0
  case " $SPARSE_ALGOS " in *" $algo "*) st=1 ;; esac
  [ "$algo" = onebit ] && st="(1+1/$RANKS)"
  extra=""
  [ "$algo" = onebit ] && extra="--state $DIR/ar-1b.state"
  [ "$algo" = ring ] && extra="--metrics $DIR/ar-ring-m.parquet"
  rss "gradallreduce $algo --ranks $RANKS" "$st" "$B/gradallreduce --algo $algo --ranks $RANKS -q $T -o $DIR/ar-$algo.parquet $extra"
  rm -f "$DIR/ar-$algo.parquet"
done
rss "gradallreduce oktopk --ranks $RANKS (sparse input, 1 %)" 0 "$B/gradallreduce --algo oktopk --ranks $RANKS -q $DIR/sel.parquet -o $DIR/ar-oks.parquet"
# Under mpirun every rank is a process of its own, measured each (rank 0 reads and writes).
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for algo in $MPI_ALGOS; do
    st=0
    case " $SPARSE_ALGOS " in *" $algo "*) st=1 ;; esac
    [ "$algo" = onebit ] && st="(1+1/$RANKS)"
    extra=""
    [ "$algo" = onebit ] && extra="--state $DIR/ar-1b-mpi.state"
    # shellcheck disable=SC2086
    rss_mpi "mpirun -np $RANKS gradallreduce $algo" "$st" "$B/gradallreduce" --algo "$algo" -q "$T" \
      -o "$DIR/ar-$algo-mpi.parquet" $extra
    rm -f "$DIR/ar-$algo-mpi.parquet"
  done
else
  echo "(mpirun not found: the per-rank rows are skipped)"
fi
echo
echo "rows over 1.5 × (step + state): $MISSED"
