#!/usr/bin/env bash
# make repro-scale SCALE_PARTS=sizes [FAST=1]: does a small recording, scaled to a model's size,
# replay as a recording made at that size (issue 44 point 1)? One bench call of each algorithm
# recorded in-process at P = 64 and 256 (FAST: 16) ranks, each rank's own dense gradient
# (density 1 %), at 20,480 elements per rank and at 2,097,152 (102.4×; at P = 256, 1,048,576,
# 51.2×: TopkA's allgather at 2,097,152 needs more than this machine's 24 GiB); both replayed on a flat
# 100 Gbit/s cluster (1 µs), communication only. The small one is replayed the way
# `gradreport simulate --scale-bytes` scales (commtrace/1's `fixed_bytes` as recorded: control
# messages, 1-bit's scales and padding; the rest ×102.4) and, for comparison, with every byte
# scaled (what the replay did before the column: its fixed bytes set to 0 in a copy).
# Writes the docs/RESULTS.md section "sim-scale-sizes". REUSE=1 keeps the replays already made.
source "$(dirname "$0")/lib.sh"
out_dir scale-sizes
ALGOS=ring,topka,topkdsa,gtopk,gaussiank,oktopk,deft,cltk,topk-union,onebit
if [ "$FAST" != 0 ]; then PS="16"; else PS=${PS:-"64 256"}; fi
SMALL=81920  # bytes of f32 per rank: 20,480 elements
# large_of P ALGO: the size recorded at, in bytes of f32. Gaussiank at P = 256: 524,288
# elements (25.6×): at 1,048,576 it was killed for memory (2026-11-29).
large_of() {
  if [ "$1" -lt 256 ]; then echo 8388608; elif [ "$2" = gaussiank ]; then echo 2097152; else echo 4194304; fi
}
PLATFORM=(--topology flat --link-rate 100Gbps --latency 1us --compute none --no-phases --format csv)
T0=$(date +%s)
# One algorithm per recording: at P = 256 and 2,097,152 elements the ranks' inputs alone are
# 2 GiB, and TopkA's allgather gives every rank every other rank's selection.
for p in $PS; do
  for a in ${ALGOS//,/ }; do
    LARGE=$(large_of "$p" "$a")
    SCALE=$(python3 -c "print($LARGE / $SMALL)")
    echo $(( LARGE / 4 )) > size-p$p-$a.txt
    [ "$REUSE" != 0 ] && { [ -s all-p$p-$a.csv ] || grep -qx "$a" unfit-p$p.txt 2>/dev/null; } && continue
    skip=
    for size in $SMALL $LARGE; do
      # A recording that does not fit (killed for memory) is said in the table, not fatal.
      if ! (run $B/gradallreduce bench --algo "$a" --input dense --sizes $size:$size --warmup 1 --iters 1 \
        --density 0.01 --ranks "$p" -q --comm-trace rec-p$p-$size-$a.parquet > /dev/null); then
        echo "$a" >> unfit-p$p.txt; skip=1; break
      fi
    done
    [ -n "$skip" ] && continue
    "$PY" - rec-p$p-$SMALL-$a.parquet all-p$p-$a.parquet <<'PY'
import sys, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
i = t.schema.get_field_index("fixed_bytes")
t = t.set_column(i, t.schema.field(i), pa.array([0] * t.num_rows, pa.uint64()))
pq.write_table(t, sys.argv[2])
PY
    run $B/gradreport simulate rec-p$p-$LARGE-$a.parquet "${PLATFORM[@]}" > at-size-p$p-$a.csv 2>/dev/null
    run $B/gradreport simulate rec-p$p-$SMALL-$a.parquet "${PLATFORM[@]}" --scale-bytes "$SCALE" > scaled-p$p-$a.csv 2>/dev/null
    run $B/gradreport simulate all-p$p-$a.parquet "${PLATFORM[@]}" --scale-bytes "$SCALE" > all-p$p-$a.csv 2>/dev/null
    rm -f rec-p$p-$LARGE-$a.parquet  # large; its replay is kept
  done
done
python3 - $PS > section.md <<'PY'
import csv, sys
ps = sys.argv[1:]
import glob, os
def large(p, a):
    """The elements per rank ALGO was recorded at (size-pP-ALGO.txt; before it: by P)."""
    f = f"size-p{p}-{a}.txt"
    return int(open(f).read()) if os.path.exists(f) else (1048576 if int(p) >= 256 else 2097152)
def ms(kind, p):
    out = {}
    for path in sorted(glob.glob(f"{kind}-p{p}-*.csv")):
        for r in csv.DictReader(open(path)):
            out[r["label"].split()[0]] = float(r["simulated_ms"])
    return out
def unfit_of(p):
    try:
        return open(f"unfit-p{p}.txt").read().split()
    except FileNotFoundError:
        return []
rows, worst = [], {}
for p in ps:
    at, sc, al = ms("at-size", p), ms("scaled", p), ms("all", p)
    for a in unfit_of(p):
        rows.append(f"| {a} | {p} | {large(p, a):,} | not recorded: more memory than this machine's 24 GiB | | | | |")
    for a in at:
        r, r0 = sc[a] / at[a], al[a] / at[a]
        f = max(r, 1 / r)
        worst[p] = max(worst.get(p, 1.0), f)
        rows.append(f"| {a} | {p} | {large(p, a):,} | {at[a]:.4g} | {sc[a]:.4g} | {r:.2f} | {al[a]:.4g} | {r0:.2f} |")
print(f"One bench call per algorithm recorded in-process (dense input, density 1 %) at the size "
      f"(elements per rank) and at 20,480 scaled to it, replayed on a flat 100 Gbit/s cluster "
      "(1 µs), communication only (pipelines/scale-sizes.sh). `fixed kept`: the replay's scaling "
      "(commtrace/1's `fixed_bytes` as recorded, the rest scaled); `every byte`: the same recording "
      "with every byte scaled, as before the column.\n")
print("| algorithm | P | size | recorded at size (ms) | small, fixed kept (ms) | ÷ at size | small, every byte (ms) | ÷ at size |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
print()
def goal(p, w):
    u = unfit_of(p)
    verdict = "met" if w <= 1.15 else "not met"
    if u:
        verdict += f" for the {len(ms('at-size', p))} recorded; {', '.join(u)} not recorded at size"
    return f"P = {p}: worst {w:.2f}× ({verdict})"
print("The goal (issue 44): every algorithm within ±15 % of the recording at size, at P = 64 and 256 — "
      + "; ".join(goal(p, w) for p, w in worst.items()) + ".")
PY
echo "wall time $(( $(date +%s) - T0 )) s" >&2
section sim-scale-sizes section.md
[ "$FAST" != 0 ] && expect section.md '\| oktopk \|' '\| onebit \|' 'The goal'
cat section.md
