#!/usr/bin/env bash
# make bench: every benchmark of the project, side by side in one run, on this machine.
# Speed is measured here, never asserted in tests. Results go to data/out/bench/ and are
# copied into docs/RESULTS.md by hand (with the machine and the date).
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/bench
mkdir -p "$OUT"
cd "$ROOT"
ex() { run cargo run --release --locked -q -p "$1" --example "$2" -- "${@:3}"; }

echo "== Parquet I/O: 1 GiB of f32 written and read, vs pyarrow (docs/results/io.md)" >&2
ex gradtrace bench_io | tee "$OUT/io.md"

echo "== selection: top-k, Ok-Topk reuse, Gaussiank, DGC on 2^24 values vs numpy and one pass" >&2
ex gradkit-sparsify bench_select | tee "$OUT/select.md"
echo "== selection: time per element of the exact top-k, 2^20..2^26 (docs/results/select.md)" >&2
ex gradkit-sparsify bench_select sweep 20 26 | tee "$OUT/select-sweep.md"

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

echo "== ring, 2^20..2^26 elements, P = 4 under mpirun: time per element (docs/results/dense.md)" >&2
run mpirun -np 4 $B/gradallreduce bench --algo ring --sizes 4M:256M --factor 2 --iters 10 -q \
    | tee "$OUT/dense-scaling.md"

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
run "$ROOT/.venv/bin/python" pipelines/bench/goals.py "$OUT" "$ROOT/data/out/cluster" | tee "$OUT/goals.md"
echo "bench results are in data/out/bench/ (the goals in data/out/bench/goals.md)" >&2
