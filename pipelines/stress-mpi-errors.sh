#!/usr/bin/env bash
# The mpirun error paths under load, RUNS times each (default 200): a rank-count mismatch
# found by rank 0, a table sent to stdout, a usage error, a rank failing inside the
# collectives, a config error in gradtrain, gradtrain resuming a checkpoint of another
# world size or exchange — each must end with exactly one copy of its
# message and a non-zero status, and never hang. A CPU hog keeps both cores busy meanwhile.
#
#   bash pipelines/stress-mpi-errors.sh [RUNS]      (make stress-mpi RUNS=200)
#
# Prints one line per case and "N passed, M failed"; exits 1 if any run failed.
set -uo pipefail
RUNS=${1:-200}
B=${BIN:-target/release}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
command -v mpirun >/dev/null || { echo "error: mpirun not found (make deps)" >&2; exit 1; }
for t in gradtrace gradallreduce gradtrain; do
  [ -x "$B/$t" ] || { echo "error: $B/$t not built (make build)" >&2; exit 1; }
done
D=$(mktemp -d)
HOG=""
cleanup() { [ -n "$HOG" ] && kill "$HOG" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT INT TERM
"$B/gradtrace" synthetic --shape mlp --scale 0.05 --ranks 2 --steps 2 --seed 1 -o "$D/t2.parquet" -q
"$B/gradtrace" synthetic --shape mlp --scale 0.05 --ranks 4 --steps 2 --seed 1 -o "$D/t4.parquet" -q
"$B/gradtrain" --model mlp --ranks 2 --steps 10 --checkpoint "$D/ck" -q
# The load: a busy loop per core, for at most an hour.
timeout 3600 bash -c 'for i in 1 2; do (while :; do :; done) & done; wait' &
HOG=$!

passed=0; failed=0
# case NAME EXPECTED_TEXT EXPECTED_STATUS -- COMMAND...
case_() {
  local name=$1 text=$2 want=$3; shift 4
  local ok=0 bad=0 i out code n
  for ((i = 1; i <= RUNS; i++)); do
    out=$(timeout 300 "$@" 2>&1 >/dev/null); code=$?
    n=$(grep -c -- "$text" <<<"$out")
    if [ "$code" = 124 ]; then
      bad=$((bad + 1)); echo "  $name run $i: HUNG (killed after 300 s)"
    elif [ "$n" != 1 ] || { [ "$want" != any ] && [ "$code" != "$want" ]; } || [ "$code" = 0 ]; then
      bad=$((bad + 1)); echo "  $name run $i: status $code, $n copies of the message"
    else
      ok=$((ok + 1))
    fi
  done
  printf '%-34s %4d/%d runs: one message, non-zero status\n' "$name" "$ok" "$RUNS"
  passed=$((passed + ok)); failed=$((failed + bad))
}

case_ "rank mismatch (np 4, 2-rank trace)" "holds 2 ranks" 1 -- \
  mpirun -np 4 "$B/gradallreduce" "$D/t2.parquet" -o "$D/o.parquet"
case_ "table to stdout (np 2)" "cannot go to stdout" 1 -- \
  mpirun -np 2 "$B/gradallreduce" --algo ring "$D/t2.parquet"
case_ "usage error (np 4, --k 0)" "error:" 2 -- \
  mpirun -np 4 "$B/gradallreduce" --k 0 "$D/t4.parquet" -o "$D/o.parquet"
case_ "rank 2 fails in the collectives" "rank 2: injected fault" any -- \
  env GRADKIT_FAULT_RANK=2 mpirun -np 4 "$B/gradallreduce" --algo ring "$D/t4.parquet" -o "$D/o.parquet"
case_ "gradtrain bad --data (np 4)" "error:" 1 -- \
  mpirun -np 4 "$B/gradtrain" --data "$D/missing.parquet" --steps 1
case_ "gradtrain --resume, np 3 (ck of 2)" "error:" 1 -- \
  mpirun -np 3 "$B/gradtrain" --model mlp --steps 30 --checkpoint "$D/ck" --resume -q
case_ "gradtrain --resume, other exchange" "error:" 1 -- \
  mpirun -np 2 "$B/gradtrain" --model mlp --steps 30 --exchange topka --checkpoint "$D/ck" --resume -q

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
