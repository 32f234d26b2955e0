"""One rank of test_native's stalled-peer check, under mpirun: rank 1 stops answering (a
stuck node) while rank 0 reduces; rank 0's reduction must raise `GradkitError` once
GRADKIT_COMM_TIMEOUT has passed, never hang. Rank 0 prints what it raised and exits 3.

    GRADKIT_COMM_TIMEOUT=3 mpirun -np 2 python stall_run.py
"""

import sys
import time

import numpy as np

import gradkit
from gradkit import native


def main():
    comm = gradkit.mpi_comm()
    red = gradkit.Reducer("ring", comm, [("w", (1000,))])
    if comm.rank == 1:
        time.sleep(600)  # ended by mpirun once rank 0 exits
        return
    t0 = time.monotonic()
    try:
        red.reduce(np.ones(1000, dtype=np.float32))
    except native._native.GradkitError as e:
        print(f"raised after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        sys.exit(3)
    print("no error", flush=True)


if __name__ == "__main__":
    main()
