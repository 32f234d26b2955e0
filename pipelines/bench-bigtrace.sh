#!/usr/bin/env bash
# A trace several times larger than the memory the tools may use goes through
# `gradselect | gradallreduce` (issue 19, docs/MEMORY.md "A trace larger than memory"). Run by
# hand (as root), not part of `make test`: it writes GBs and takes minutes.
#
#   pipelines/bench-bigtrace.sh                     # 2 GiB limit, ~8 GB trace (40 steps)
#   LIMIT_MIB=1024 STEPS=24 pipelines/bench-bigtrace.sh
#   BENCH_DIR=/big/disk pipelines/bench-bigtrace.sh # where the trace goes (default $TMPDIR)
#
# The memory limit is a cgroup v1 memory group (/sys/fs/cgroup/memory/<name>,
# memory.limit_in_bytes; the machine has no swap, so exceeding it means the OOM killer). The
# trace (`gradtrace synthetic --shape vgg16 --scale 1 --ranks 4`, ~200 MB per step) is written
# outside the group; then
#   gradselect --method topk --density 0.01 TRACE | gradallreduce --algo topka --ranks 4 -o OUT
# runs inside it. Printed: the trace's size against the limit, the group's peak charge
# (memory.max_usage_in_bytes, which includes the page cache of the file being read: the kernel
# reclaims that cache at the limit, so failcnt counts reclaims, not failures), the OOM kills
# (memory.oom_control), each tool's own peak RSS (GNU time), the exit statuses and the wall
# time. The trace, the output and the group are removed at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${GRADKIT_BIN:-$ROOT/target/release}
LIMIT_MIB=${LIMIT_MIB:-2048}
STEPS=${STEPS:-40}
SCALE=${SCALE:-1}
RANKS=${RANKS:-4}
CGROOT=${CGROOT:-/sys/fs/cgroup/memory}
DIR=${BENCH_DIR:-${TMPDIR:-/tmp}}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time (GNU time) is needed" >&2; exit 1; }
for t in gradtrace gradselect gradallreduce; do
  [ -x "$B/$t" ] || { echo "error: $B/$t is not built (cargo build --release -p $t)" >&2; exit 1; }
done
if [ ! -w "$CGROOT" ] || [ ! -e "$CGROOT/memory.limit_in_bytes" ]; then
  echo "error: no writable cgroup v1 memory hierarchy at $CGROOT (needs root and cgroup v1;" \
    "set CGROOT=... if it is mounted elsewhere): cannot bound the tools' memory" >&2
  exit 1
fi
WORK=$(mktemp -d "$DIR/gradkit-bigtrace.XXXXXX")
CG=$CGROOT/gradkit-bigtrace-$$
cleanup() {
  rm -rf "$WORK"
  if [ -d "$CG" ]; then
    # Move anything left back to the root group, then remove the group.
    while read -r p; do echo "$p" >"$CGROOT/cgroup.procs" 2>/dev/null || true; done <"$CG/cgroup.procs"
    rmdir "$CG" 2>/dev/null || echo "warning: could not remove $CG" >&2
  fi
}
trap cleanup EXIT
if ! mkdir "$CG" 2>/dev/null || ! echo $((LIMIT_MIB << 20)) >"$CG/memory.limit_in_bytes"; then
  echo "error: cannot create the memory group $CG (cgroup v1, as root): not run" >&2
  exit 1
fi
T=$WORK/trace.parquet
echo "+ gradtrace synthetic --shape vgg16 --scale $SCALE --ranks $RANKS --steps $STEPS --seed 1 -o TRACE" >&2
t0=$(date +%s.%N)
"$B/gradtrace" synthetic --shape vgg16 --scale "$SCALE" --ranks "$RANKS" --steps "$STEPS" \
  --seed 1 -q -o "$T"
t1=$(date +%s.%N)
trace_mib=$(( $(stat -c %s "$T") >> 20 ))
# Drop what writing the trace left in the page cache, so the run reads it from disk as a trace
# that never fitted would be (best effort: needs root).
sync; echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true

echo "+ [limit ${LIMIT_MIB} MiB] gradselect --method topk --density 0.01 TRACE | gradallreduce --algo topka --ranks $RANKS -o OUT" >&2
t2=$(date +%s.%N)
set +e
bash -c '
  echo $$ > "$1/cgroup.procs" || exit 99
  set -o pipefail
  /usr/bin/time -v -o "$2/select.time" "$3/gradselect" --method topk --density 0.01 -q "$4" \
    | /usr/bin/time -v -o "$2/reduce.time" "$3/gradallreduce" --algo topka --ranks "$5" -q \
        -o "$2/out.parquet"
  echo "${PIPESTATUS[*]}" > "$2/status"
' _ "$CG" "$WORK" "$B" "$T" "$RANKS"
rc=$?
set -e
t3=$(date +%s.%N)
status=$(cat "$WORK/status" 2>/dev/null || echo "?")
kb() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1" 2>/dev/null || echo 0; }
sel_kb=$(kb "$WORK/select.time")
red_kb=$(kb "$WORK/reduce.time")
max_use=$(cat "$CG/memory.max_usage_in_bytes")
failcnt=$(cat "$CG/memory.failcnt")
ooms=$(awk '/oom_kill / {print $2}' "$CG/memory.oom_control")
out_mib=$( [ -s "$WORK/out.parquet" ] && echo $(( $(stat -c %s "$WORK/out.parquet") >> 20 )) || echo "-")
python3 - "$trace_mib" "$LIMIT_MIB" "$max_use" "$failcnt" "${ooms:-?}" "${sel_kb:-0}" "${red_kb:-0}" \
  "$rc" "$status" "$out_mib" "$t0" "$t1" "$t2" "$t3" "$STEPS" <<'EOF'
import sys
(trace, limit, max_use, failcnt, ooms, sel, red, rc, status, out, t0, t1, t2, t3, steps) = sys.argv[1:]
trace, limit = int(trace), int(limit)
print()
print(f"trace: vgg16, {steps} steps, {trace} MiB = {trace / limit:.1f} x the group's limit of {limit} MiB "
      f"(written in {float(t1) - float(t0):.0f} s)")
print()
print("| quantity | value |")
print("|---|---|")
print(f"| exit status (pipeline; gradselect gradallreduce) | {rc} ({status}) |")
print(f"| OOM kills in the group (memory.oom_control) | {ooms} |")
print(f"| group's peak charge, page cache included (memory.max_usage_in_bytes) | {int(max_use) / 2**20:.0f} MiB |")
print(f"| times the group hit its limit (memory.failcnt: cache reclaimed) | {failcnt} |")
print(f"| gradselect peak RSS | {int(sel) / 1024:.0f} MiB |")
print(f"| gradallreduce peak RSS | {int(red) / 1024:.0f} MiB |")
print(f"| output | {out} MiB |")
print(f"| wall time of the pipeline | {float(t3) - float(t2):.0f} s ({trace / (float(t3) - float(t2)):.0f} MiB/s of trace) |")
EOF
[ "$rc" = 0 ] || { echo "error: the pipeline failed (exit $rc) under the ${LIMIT_MIB} MiB limit" >&2; exit 1; }
