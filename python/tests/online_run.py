"""One rank of the online side of test_native's online/offline identity, under mpirun.

Every rank draws its own gradients for STEPS steps (a fixed pattern of its rank and the
step), records them with `gradkit.Recorder` (OUT/rank<R>.parquet) and reduces them with
`gradkit.Reducer` for every algorithm given, each with its own `gradkit.Metrics`
(OUT/<algo>.metrics.parquet). Rank 0 saves the results (OUT/<algo>.online.npy: steps × n).
Then the checkpoint check: a reducer stopped after CUT steps and restored from its
`state_dict()` into a new one gives the same results as the uninterrupted run
(OUT/<algo>.resumed.npy).

    mpirun -np 3 python online_run.py OUT STEPS ALGO:OPTIONS_JSON ...
"""

import json
import os
import sys

import numpy as np

import gradkit

LAYERS = [("enc.weight", (40, 25)), ("enc.bias", (40,)), ("head.weight", (7, 13))]
CUT = 3


def grads(rank, steps):
    """This rank's gradients: a heavy-tailed pattern that differs per rank and step, so the
    sparse algorithms' selections differ across ranks and overlap in part."""
    n = sum(int(np.prod(s)) for _, s in LAYERS)
    out = []
    for step in range(steps):
        rng = np.random.default_rng(1000 * step + rank)
        g = rng.standard_normal(n).astype(np.float32) * rng.exponential(1.0, n).astype(np.float32)
        g[(step * 37) % n] += 5.0  # an entry every rank has large
        out.append(g)
    return out


def split(flat):
    parts, off = {}, 0
    for name, shape in LAYERS:
        size = int(np.prod(shape))
        parts[name] = flat[off : off + size].reshape(shape)
        off += size
    return parts


def main():
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    comm = gradkit.mpi_comm()
    mine = grads(comm.rank, steps)
    with gradkit.Recorder(
        os.path.join(out_dir, f"rank{comm.rank}.parquet"), rank=comm.rank, world_size=comm.size
    ) as rec:
        for g in mine:
            rec.step(split(g))
    for spec in sys.argv[3:]:
        algo, opts = spec.split(":", 1)
        opts = json.loads(opts)
        metrics = gradkit.Metrics(os.path.join(out_dir, f"{algo}.metrics.parquet"), comm, run=algo)
        red = gradkit.Reducer(algo, comm, LAYERS, metrics=metrics, **opts)
        results = [red.reduce(g).copy() for g in mine]
        red.finish()
        metrics.write()
        # The checkpoint: CUT steps, state_dict, a new reducer, load_state_dict, the rest.
        first = gradkit.Reducer(algo, comm, LAYERS, **opts)
        resumed = [first.reduce(g).copy() for g in mine[:CUT]]
        state = first.state_dict()
        second = gradkit.Reducer(algo, comm, LAYERS, **opts)
        second.load_state_dict(state)
        resumed += [second.reduce(g).copy() for g in mine[CUT:]]
        second.finish()
        if comm.rank == 0:
            np.save(os.path.join(out_dir, f"{algo}.online.npy"), np.stack(results))
            np.save(os.path.join(out_dir, f"{algo}.resumed.npy"), np.stack(resumed))
    comm.barrier()


if __name__ == "__main__":
    main()
