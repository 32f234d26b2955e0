#!/usr/bin/env python3
"""The mpi4py baseline of `gradallreduce bench` (issue 19, docs/results/dense.md).

In-place sum-Allreduce, `comm.Allreduce(MPI.IN_PLACE, buf)`, of a float32 buffer on Open MPI
(the library gradallreduce's `native` calls), timed like `gradallreduce bench`: a barrier
before each call, per iteration the slowest rank's time, then the median, min and max over
the timed iterations; page faults per call from getrusage (minor, major; median, max over
ranks). Every iteration's result is checked against the exact sum, as bench's `wrong` column.

Run under mpirun:  mpirun -np 4 .venv/bin/python pipelines/bench/bench_allreduce.py --sizes 64M
(--hugepages off: numpy's buffers on 4 KiB pages, as a plain Rust Vec would be.)
"""
import argparse
import resource
import sys
import time

import numpy as np
from mpi4py import MPI


def parse_size(s):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().removesuffix("B")
    num = s.rstrip("KMG")
    return int(num) * units[s[len(num):]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64M", help="comma-separated byte sizes (e.g. 4M,64M)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hugepages", choices=["numpy", "off"], default="numpy",
                    help="numpy's default (madvise huge pages for large arrays) or off, as Rust's Vec")
    a = ap.parse_args()
    if a.hugepages == "off":
        try:
            from numpy._core.multiarray import _set_madvise_hugepage  # numpy >= 2
        except ImportError:
            from numpy.core.multiarray import _set_madvise_hugepage
        _set_madvise_hugepage(False)
    comm = MPI.COMM_WORLD
    p, r = comm.Get_size(), comm.Get_rank()
    rows = []
    for size in (parse_size(s) for s in a.sizes.split(",")):
        n = size // 4
        idx = np.arange(n, dtype=np.int64) % 13
        pristine = (idx * (r + 1)).astype(np.float32)
        want = (idx * (p * (p + 1) // 2)).astype(np.float32)
        buf = pristine.copy()
        times, minflt, majflt, wrong = [], [], [], 0
        for it in range(a.warmup + a.iters):
            buf[:] = pristine
            comm.Barrier()
            f0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            dt = time.perf_counter() - t0
            f1 = resource.getrusage(resource.RUSAGE_SELF)
            if it >= a.warmup:
                times.append(dt)
                minflt.append(f1.ru_minflt - f0.ru_minflt)
                majflt.append(f1.ru_majflt - f0.ru_majflt)
                wrong += int(np.count_nonzero(buf != want))
        per_iter = np.max(np.array(comm.allgather(times)), axis=0)
        flt = np.max(np.array(comm.allgather((np.median(minflt), np.median(majflt)))), axis=0)
        wrong = comm.allreduce(wrong, op=MPI.MAX)
        rows.append((size, n, np.median(per_iter), per_iter.max() / per_iter.min(), flt, wrong))
    if r == 0:
        print("| size_B | count | algo | time_us | max/min | minflt | majflt | wrong |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|")
        for size, n, t, spread, flt, wrong in rows:
            print(f"| {size} | {n} | mpi4py | {t * 1e6:.0f} | {spread:.3f} | {flt[0]:g} | {flt[1]:g} | {wrong} |")
        print(f"mpi4py {MPI.Get_library_version().splitlines()[0]}; {p} ranks", file=sys.stderr)
    if any(row[-1] for row in rows):
        sys.exit("error: mpi4py Allreduce gave wrong elements")


if __name__ == "__main__":
    main()
