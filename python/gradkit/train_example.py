"""Train a small CNN under DDP with one of gradkit's exchanges (docs/PYTORCH.md § Train with
it; a test keeps the copy there equal to this file).

    torchrun --standalone --nproc-per-node 2 -m gradkit.train_example --algo oktopk --density 0.05
    mpirun -np 2 python -m gradkit.train_example --algo onebit
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradkit.torch as gt


def data(rank, steps, batch=32, seed=0):
    """Generated 1×12×12 images of 4 classes (a bright bar whose position is the class, in
    noise); each rank draws its own batches."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    for _ in range(steps):
        y = torch.randint(0, 4, (batch,), generator=g)
        x = torch.randn(batch, 1, 12, 12, generator=g)
        for i, c in enumerate(y.tolist()):
            x[i, 0, 3 * c : 3 * c + 3, :] += 0.5
        yield x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="oktopk", help="a gradkit --algo name, or `default` (DDP's own allreduce)")
    ap.add_argument("--density", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--metrics", default=None, help="metrics/1 file (rank 0 writes it)")
    ap.add_argument("--checkpoint", default=None,
                    help="at the end, each rank saves its model, optimizer and hook state to CHECKPOINT.rank<R>")
    ap.add_argument("--resume", default=None, help="a --checkpoint to start from (each rank reads its own)")
    args = ap.parse_args()

    if "OMPI_COMM_WORLD_RANK" in os.environ:
        gt.init_process_group_from_mpirun("gloo")  # started by mpirun
    else:
        dist.init_process_group("gloo")  # started by torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 3 * 3, 4),
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = None
    if args.algo != "default":
        options = {"density": args.density} if gt.reads(args.algo, "density") else {}
        state, hook = gt.hook(args.algo, model=model, metrics=args.metrics, **options)
        ddp.register_comm_hook(state, hook)
    start = 0
    if args.resume:
        saved = torch.load(f"{args.resume}.rank{rank}", weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        if state is not None:
            state.load_state_dict(saved["hook"])
        start = saved["step"]

    for step, (x, y) in enumerate(data(rank, args.steps, seed=start), start=start):
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if state is not None and state.metrics is not None:
            state.metrics.add("loss", loss.item(), step)
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    if state is not None:
        state.close()  # writes the metrics (collective)
    if args.checkpoint:  # the hook's state (residuals, thresholds) is each rank's own
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "hook": state.state_dict() if state else None,
                    "step": start + args.steps}, f"{args.checkpoint}.rank{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
