#!/usr/bin/env bash
# make bench: every benchmark of the project, side by side in one run, on this machine.
# Speed is measured here, never asserted in tests. Results go to data/out/bench/; the goal
# verdicts (goals.md) replace docs/RESULTS.md's section "bench-goals", with the machine, the
# commit and the date. Every ratio there is a median of 3 interleaved repetitions with its
# min–max: the sweeps run 3 times here, the other benches repeat inside.
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/bench
rm -rf "$OUT" && mkdir -p "$OUT"
T0=$(date +%s)
cd "$ROOT"
# The package ($1) only names where the example lives: `-p` would resolve its dependencies'
# features anew and compile them a second time.
ex() { run cargo run --release --locked -q --example "$2" -- "${@:3}"; }

echo "== Parquet I/O: 1 GiB of f32 written and read, vs pyarrow (docs/results/io.md)" >&2
ex gradtrace bench_io | tee "$OUT/io.md"

echo "== selection: top-k, Ok-Topk reuse, Gaussiank, DGC on 2^24 values vs numpy and one pass" >&2
ex gradkit-sparsify bench_select | tee "$OUT/select.md"
echo "== selection: time per element of the exact top-k, 2^20..2^26, 3 runs (docs/results/select.md)" >&2
for rep in 1 2 3; do
  ex gradkit-sparsify bench_select sweep 20 26 | tee -a "$OUT/select-sweep.md"
done

echo "== planning: DEFT and Ok-Topk plans for BERT-base at P = 8, 64, 256" >&2
ex gradkit-partition bench_plan | tee "$OUT/partition.md"

echo "== dense allreduce, 64 MiB, P = 4: Local ranks, then mpirun (ring, Rabenseifner vs native)" >&2
run $B/gradallreduce bench --ranks 4 --algo ring,rabenseifner,tree,native --sizes 4K:64M --factor 4 \
    --iters 10 --fit | tee "$OUT/dense-local.md"
run mpirun -np 4 $B/gradallreduce bench --algo ring,rabenseifner,tree,native --sizes 4K:64M \
    --factor 4 --iters 10 --fit | tee "$OUT/dense-mpi.md"

# vs_mpi4py NP FILE: ring, native and 1-bit against mpi4py's in-place Allreduce, 64 MiB,
# interleaved 3x.
vs_mpi4py() {
  : > "$OUT/$2"
  for rep in 1 2 3; do
    echo "load average: $(cat /proc/loadavg)" >> "$OUT/$2"
    run mpirun -np "$1" $B/gradallreduce bench --algo ring,native,onebit --sizes 64M:64M --iters 10 -q \
        | tee -a "$OUT/$2"
    run mpirun -np "$1" "$ROOT/.venv/bin/python" pipelines/bench/bench_allreduce.py --sizes 64M --iters 10 \
        | tee -a "$OUT/$2"
  done
}
echo "== dense allreduce vs mpi4py's in-place Allreduce, 64 MiB, P = 4 under mpirun, interleaved 3x (docs/results/dense.md)" >&2
vs_mpi4py 4 dense-vs-mpi4py.md
echo "== the same at P = 2, one rank per core: the max/min spread without ranks sharing cores (docs/results/dense.md)" >&2
vs_mpi4py 2 dense-vs-mpi4py-p2.md

echo "== ring, 2^20..2^26 elements, P = 4 under mpirun: time per element, 3 runs (docs/results/dense.md)" >&2
for rep in 1 2 3; do
  run mpirun -np 4 $B/gradallreduce bench --algo ring --sizes 4M:256M --factor 2 --iters 10 -q \
      | tee -a "$OUT/dense-scaling.md"
done

echo "== Ok-Topk and gTop-k on dense vs pre-selected input, 64 MiB, P = 4 under mpirun, each rank's own gradient, 3 runs (docs/results/sparse.md)" >&2
: > "$OUT/oktopk-input.md"
for rep in 1 2 3; do
  echo "load average: $(cat /proc/loadavg)" >> "$OUT/oktopk-input.md"
  run mpirun -np 4 $B/gradallreduce bench --algo oktopk,gtopk --sizes 64M:64M --iters 10 -q \
      | tee -a "$OUT/oktopk-input.md"
done

echo "== sparse allreduces: words per rank vs Table 1 and time, P = 4 and 8" >&2
ex gradkit-collectives bench_sparse | tee "$OUT/sparse.md"

echo "== 1-bit vs ring vs native (64 MiB, P = 4), pack/unpack GB/s; EmbRace volumes" >&2
ex gradkit-collectives bench_onebit | tee "$OUT/onebit.md"

echo "== issue 19's goals, from the tables above" >&2
CL=$ROOT/data/out/cluster
{
  echo "Made by \`make bench\` (pipelines/bench.sh) on $(date -u '+%F %H:%M') UTC at commit" \
    "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib tools pipelines || echo ' (with uncommitted changes)')," \
    "$(nproc) shared cores; wall time $(( $(date +%s) - T0 )) s."
  echo "\`pipelines/bench/goals.py data/out/bench data/out/cluster\`: each ratio taken within one"
  echo "interleaved repetition, then the median over them with their min–max; the verdict is the"
  echo "median's. The 1-minute load at the start of each repetition is in the files."
  if ls "$CL"/r*/okinput-*.md > /dev/null 2>&1; then
    echo "The rows across 4 hosts (for comparison) come from \`make repro-cluster\`'s step 5 of"
    echo "$(date -u -r "$(ls "$CL"/r*/okinput-*.md | head -1)" +%F) (data/out/cluster/r*/okinput-RATE.md)."
  fi
  echo
  run "$ROOT/.venv/bin/python" pipelines/bench/goals.py data/out/bench data/out/cluster
} > "$OUT/goals.md"
cat "$OUT/goals.md"
section bench-goals "$OUT/goals.md"
echo "bench results are in data/out/bench/ (the goals in data/out/bench/goals.md and docs/RESULTS.md)" >&2
