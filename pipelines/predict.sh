#!/usr/bin/env bash
# make predict TRACE=rec.parquet [P="64 256"] [ALGOS="ring oktopk topka onebit"] [DENSITY=0.01]
#   [PLATFORM="--topology fat-tree --link-rate 100Gbps --latency 1us"] [SCALE=1]
#   [PROFILE=step.csv] [OUT=data/out/predict]
# From a recording of a few ranks to a table at P ranks (docs/SIMULATE.md § Predict): the
# recording expanded to each P (gradtrace expand), each algorithm run on it in-process with its
# messages recorded (gradallreduce --comm-trace), the recording replayed on the platform
# (gradreport simulate, communication only, sizes × SCALE with the fixed parts kept), and with
# PROFILE (a step's compute: docs/SIMULATE.md § Whole steps) the whole step and its speedup
# over Dense and DenseOvlp; each row with the validated error bar nearest it. Prints a
# Markdown table (and OUT/predict.md).
source "$(dirname "$0")/lib.sh"
: "${TRACE:?give TRACE=a recording (tensor/1, dense rows of a few ranks)}"
[ -r "$TRACE" ] || { echo "error: TRACE=$TRACE: no such file" >&2; exit 1; }
P=${P:-"64 256"}
ALGOS=${ALGOS:-"ring oktopk topka gtopk deft onebit"}
DENSITY=${DENSITY:-0.01}
PLATFORM=${PLATFORM:-"--topology flat --link-rate 100Gbps --latency 1us"}
SCALE=${SCALE:-1}
OUT=${OUT:-$ROOT/data/out/predict}
mkdir -p "$OUT"
rows=()
for p in $P; do
  exp="$OUT/trace-p$p.parquet"
  "$B/gradtrace" expand "$TRACE" --ranks "$p" --seed 1 -q -o "$exp"
  for a in $ALGOS; do
    rec="$OUT/rec-p$p-$a.parquet"
    dens=(--density "$DENSITY")
    [ "$a" = ring ] || [ "$a" = onebit ] && dens=()
    "$B/gradallreduce" --algo "$a" "${dens[@]}" --comm-trace "$rec" "$exp" -o /dev/null 2> "$OUT/run-p$p-$a.log"
    prof=()
    [ -n "${PROFILE:-}" ] && prof=(--step-profile "$PROFILE")
    # shellcheck disable=SC2086
    "$B/gradreport" simulate "$rec" $PLATFORM --scale-bytes "$SCALE" --compute none --no-phases \
      --format csv "${prof[@]}" > "$OUT/sim-p$p-$a.csv" 2> "$OUT/sim-p$p-$a.notes"
    rows+=("$p $a")
  done
done
python3 - "$OUT" "${rows[@]}" <<'PY' | tee "$OUT/predict.md"
import csv, re, statistics, sys
out, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
print("| P | algorithm | exchange ms (replayed, median step) | whole step ms | × DenseOvlp | × Dense | error bar (validated, nearest) |")
print("|---:|---|---:|---:|---:|---:|---|")
for p, a in rows:
    sim = [float(r["simulated_ms"]) for r in csv.DictReader(open(f"{out}/sim-p{p}-{a}.csv"))]
    notes = open(f"{out}/sim-p{p}-{a}.notes").read()
    w = re.search(r"^whole step .*?\): ([0-9.]+) ms.*?speedup over DenseOvlp ([0-9.]+)×, over Dense ([0-9.]+)×", notes, re.M)
    e = re.search(r"within a factor ([0-9.]+) of the measured time \(median; worst ([0-9.]+)", notes)
    bar = f"×{e.group(1)} median, ×{e.group(2)} worst" if e else "-"
    if re.search(r"^warning: this replay lies outside", notes, re.M):
        bar += " (not validated here)"
    whole = (w.group(1), w.group(2) + "×", w.group(3) + "×") if w else ("-", "-", "-")
    print(f"| {p} | {a} | {statistics.median(sim):.4g} | {whole[0]} | {whole[1]} | {whole[2]} | {bar} |")
PY
