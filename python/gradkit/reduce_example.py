"""gradkit.Reducer on numpy arrays under mpirun, without torch (docs/PYTORCH.md § Train with
it; a test keeps the copy there equal to this file).

    mpirun -np 2 python -m gradkit.reduce_example
"""

import numpy as np

import gradkit

comm = gradkit.mpi_comm()
red = gradkit.Reducer("topka", comm, [("w", (100,)), ("b", (10,))], density=0.1)
g = np.random.default_rng(comm.rank).standard_normal(110).astype(np.float32)
out = red.reduce(g)  # the sum of both ranks' top-11 selections, dense
print(comm.rank, red.last_metrics["bytes_sent"], np.count_nonzero(out))
