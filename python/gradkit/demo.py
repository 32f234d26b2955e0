"""A data-parallel training run in numpy alone, recorded as a DDP run would be.

    python -m gradkit.demo -o run/ --ranks 2 --steps 8

The model, the names and the files are those of `gradkit.ddp_example` (the same MLP, 32 → 64
→ 10, trained with SGD on its own synthetic batches per rank): each rank's own gradient is
recorded (`run/rank<R>.parquet`), then the ranks' gradients are averaged, as DDP's all-reduce
does, and every rank takes the same step. For machines without PyTorch; the backward pass is
written out by hand.
"""

import argparse
import os

import numpy as np

from .recorder import Recorder

IN, HIDDEN, CLASSES = 32, 64, 10


def init(seed):
    rng = np.random.default_rng(seed)
    # PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    def lin(o, i):
        b = 1 / np.sqrt(i)
        return rng.uniform(-b, b, (o, i)).astype(np.float32), rng.uniform(-b, b, o).astype(np.float32)

    w1, b1 = lin(HIDDEN, IN)
    w2, b2 = lin(CLASSES, HIDDEN)
    # `module.` as DistributedDataParallel names them; the Recorder strips it.
    return {"module.fc1.weight": w1, "module.fc1.bias": b1,
            "module.fc2.weight": w2, "module.fc2.bias": b2}


def batch(rng, n):
    x = rng.standard_normal((n, IN)).astype(np.float32)
    y = x[:, :CLASSES].argmax(1)
    return x, y


def loss_and_grads(p, x, y):
    """Cross-entropy of the MLP and its gradients (the backward pass by hand)."""
    h_pre = x @ p["module.fc1.weight"].T + p["module.fc1.bias"]
    h = np.maximum(h_pre, 0)
    z = h @ p["module.fc2.weight"].T + p["module.fc2.bias"]
    z = z - z.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    n = len(y)
    loss = float(-np.log(prob[np.arange(n), y]).mean())
    dz = prob
    dz[np.arange(n), y] -= 1
    dz /= n
    dh = (dz @ p["module.fc2.weight"]) * (h_pre > 0)
    g = {"module.fc1.weight": dh.T @ x, "module.fc1.bias": dh.sum(0),
         "module.fc2.weight": dz.T @ h, "module.fc2.bias": dz.sum(0)}
    return loss, {k: v.astype(np.float32) for k, v in g.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gradkit.demo", description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="run", help="directory for rank<R>.parquet (created)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.ranks < 1 or a.steps < 1:
        ap.error("--ranks and --steps must be at least 1")
    params = init(a.seed)
    rngs = [np.random.default_rng(1000 + a.seed * 7919 + r) for r in range(a.ranks)]
    recs = [Recorder(os.path.join(a.out, f"rank{r}.parquet"), rank=r, world_size=a.ranks,
                     metadata={"model": "mlp-32-64-10", "lr": a.lr, "seed": a.seed})
            for r in range(a.ranks)]
    try:
        for step in range(a.steps):
            losses, grads = [], []
            for r in range(a.ranks):
                loss, g = loss_and_grads(params, *batch(rngs[r], a.batch))
                recs[r].step(g, step=step)
                losses.append(loss)
                grads.append(g)
            for k in params:
                params[k] -= a.lr * sum(g[k] for g in grads) / a.ranks
            print(f"step {step}: loss {np.mean(losses):.4f}")
    except BaseException:
        for rec in recs:
            rec.abort()
        raise
    for rec in recs:
        rec.close()
    print(f"wrote {', '.join(rec.path for rec in recs)}")


if __name__ == "__main__":
    main()
