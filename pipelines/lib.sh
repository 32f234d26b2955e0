# Shared helpers of the pipelines: tool paths, run-and-echo, and docs/RESULTS.md sections.
# Sourced by the pipeline scripts; every tool is called exactly as a user would call it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${GRADKIT_BIN:-$ROOT/target/release}
FAST=${FAST:-0}
# The Python the pipelines' table scripts run with (pyarrow, numpy): the project's venv
# (make deps-py), or GRADKIT_PYTHON / PYTHON; python3 where the venv is absent.
PY=${GRADKIT_PYTHON:-${PYTHON:-$ROOT/.venv/bin/python}}
[ -x "$PY" ] || command -v "$PY" > /dev/null || PY=python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for t in gradtrace gradselect gradpartition gradallreduce gradtrain gradreport; do
  [ -x "$B/$t" ] || { echo "error: $B/$t is not built (run 'make build')" >&2; exit 1; }
done

# out_dir NAME: OUT = data/out/NAME (NAME-fast under FAST=1), emptied first unless REUSE=1
# (which keeps the files of the last run), and made the working directory.
out_dir() {
  OUT=$ROOT/data/out/$1
  if [ "$FAST" != 0 ]; then OUT=$OUT-fast; fi
  REUSE=${REUSE:-0}
  if [ "$REUSE" = 0 ]; then rm -rf "$OUT"; fi
  mkdir -p "$OUT" && cd "$OUT"
}

# run CMD…: print the command (as a user would type it) to stderr, then run it.
run() {
  printf '+ %s\n' "$*" | sed "s#$B/##g" >&2
  "$@"
}

# exchange_of RUN: the `gradtrain --exchange` name of a run the tables call `dense` or `topk`
# (the run names stay as the tables and figures know them; the old spellings of the flag
# would print a note).
exchange_of() {
  case $1 in dense) echo ring ;; topk) echo topka ;; *) echo "$1" ;; esac
}

# section NAME FILE: put FILE between the NAME markers of docs/RESULTS.md (full runs only;
# FAST runs keep the section next to their outputs so `make test` leaves the tree clean).
section() {
  local name=$1 file=$2 doc=$ROOT/docs/RESULTS.md
  if [ "$FAST" != 0 ]; then
    cp "$file" "$(dirname "$file")/RESULTS-section.md"
    return
  fi
  python3 - "$doc" "$name" "$file" <<'PY'
import sys, re
doc, name, new = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
text = open(doc).read()
begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
block = f"{begin}\n{new.rstrip()}\n{end}"
if begin in text and end in text:
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(doc, "w").write(text)
PY
  echo "updated docs/RESULTS.md section '$name'" >&2
  # The prose that quotes these tables follows them (make docs); what no longer agrees is named.
  python3 "$ROOT/pipelines/docs_check.py" --write \
    || echo "warning: docs/ quote numbers the new '$name' section contradicts (make check-docs)" >&2
}

# expect FILE PATTERN…: fail unless every pattern occurs in FILE (the FAST runs in `make test`
# check that each reproduction's tables have the rows they should).
expect() {
  local file=$1; shift
  local p
  for p in "$@"; do
    grep -qE -- "$p" "$file" || { echo "error: $(basename "$PWD")/$(basename "$file") lacks the row /$p/" >&2; exit 1; }
  done
}

# launch P CMD…: CMD on P ranks — in-process (`CMD --ranks P`, the default), under mpirun on
# this machine (GRADKIT_MPIRUN=1), or across the hosts of a cluster (GRADKIT_CLUSTER=STATE, or
# =1 for the one `make cluster-up` made; docs/CLUSTER.md). Under mpirun, write with `-o FILE`.
# The outputs' `gradkit.cluster` metadata says which (backend, hosts, ranks, link rate).
launch() {
  local p=$1
  shift
  if [ -n "${GRADKIT_CLUSTER:-}" ]; then
    run "$ROOT/pipelines/cluster.sh" run -np "$p" -- "$@"
  elif [ "${GRADKIT_MPIRUN:-0}" != 0 ]; then
    GRADKIT_CLUSTER_INFO="backend=mpi-shm hosts=1 ranks=$p" run mpirun -np "$p" "$@"
  else
    run "$@" --ranks "$p"
  fi
}

# with_cluster HOSTS RATE CMD…: bring up a cluster of HOSTS hosts at RATE (tbf burst
# CLUSTER_BURST where set, `cluster.sh up --burst`) for CMD alone (state
# in ./cluster-RATE.env, a fresh run id), run CMD with GRADKIT_CLUSTER set (so `launch` runs
# across it), tear it down also when CMD fails or the run is interrupted. Ask
# `pipelines/cluster.sh check` first where the machine may not permit it.
with_cluster() {
  local hosts=$1 rate=$2
  shift 2
  local state=$PWD/cluster-$rate.env
  GRADKIT_CLUSTER=$state "$ROOT/pipelines/cluster.sh" up --hosts "$hosts" --rate "$rate" \
    ${CLUSTER_BURST:+--burst "$CLUSTER_BURST"}
  # A failing CMD ends the script (set -e): the EXIT trap tears the cluster down then.
  trap "GRADKIT_CLUSTER='$state' '$ROOT/pipelines/cluster.sh' down" EXIT
  trap 'exit 130' INT TERM
  GRADKIT_CLUSTER=$state "$@"
  trap - EXIT INT TERM
  GRADKIT_CLUSTER=$state "$ROOT/pipelines/cluster.sh" down
}
