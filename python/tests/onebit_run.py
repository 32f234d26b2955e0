"""One rank of test_native's 1-bit optimiser check, under mpirun: gradkit-train's 1-bit Adam
and 1-bit LAMB (the native `OnebitOptimizer` that `gradkit.torch.OnebitAdam`/`OnebitLamb`
wrap) stepping a flat vector from this rank's own gradients. Every rank saves, per step, the
parameters before and after, its gradient and the optimiser's state
(OUT/<method>.rank<R>.npz).

    mpirun -np 2 python onebit_run.py OUT STEPS FREEZE
"""

import os
import sys

import numpy as np

from gradkit import native

SIZES = (30, 7, 20)
LR = 0.01


def main():
    out_dir, steps, freeze = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    comm = native.mpi_comm()
    n = sum(SIZES)
    for method in ("onebit-adam", "onebit-lamb"):
        opt = native._lib().OnebitOptimizer(method, comm, list(SIZES),
                                            {"freeze_step": freeze, "onebit_clip": False, "onebit_mask": False})
        w = np.linspace(-1, 1, n, dtype=np.float32)
        rec = {"before": [], "after": [], "grad": [], "m": [], "v": [], "compressed": []}
        for step in range(steps):
            rng = np.random.default_rng(100 * step + comm.rank)
            g = (rng.standard_normal(n) * 0.1 + 0.05 * w).astype(np.float32)
            rec["before"].append(w.copy())
            metrics = dict(opt.step(w, g, LR, step))
            state = {k: np.frombuffer(v, dtype=np.float32) for k, v in opt.state()}
            rec["after"].append(w.copy())
            rec["grad"].append(g)
            rec["m"].append(state["exp_avg"].copy())
            rec["v"].append(state["exp_avg_sq"].copy())
            rec["compressed"].append(metrics["compressed"])
        np.savez(os.path.join(out_dir, f"{method}.rank{comm.rank}.npz"), **{k: np.array(v) for k, v in rec.items()})
    comm.barrier()


if __name__ == "__main__":
    main()
