"""Record every worker's own gradient from a DistributedDataParallel run (docs/PYTORCH.md).

    torchrun --standalone --nproc-per-node 2 -m gradkit.ddp_example --out run --steps 8
"""

import argparse
import contextlib
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gradkit import Recorder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="run")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=1, help="record every N-th step")
    a = ap.parse_args()
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    net = nn.Sequential(OrderedDict(fc1=nn.Linear(32, 64), relu=nn.ReLU(), fc2=nn.Linear(64, 10)))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    with Recorder(f"{a.out}/rank{rank}.parquet", rank=rank, world_size=world) as rec:
        for step in range(a.steps):
            x = torch.randn(64, 32, generator=data)
            y = x[:, :10].argmax(1)
            record = step % a.every == 0
            opt.zero_grad()
            # DDP averages the gradients inside backward(); under no_sync() each rank keeps
            # its own, which is what the trace holds.
            with model.no_sync() if record else contextlib.nullcontext():
                F.cross_entropy(model(x), y).backward()
            if record:
                rec.step(model, step=step)  # `module.fc1.weight` is recorded as `fc1.weight`
                for p in model.parameters():  # the all-reduce no_sync() skipped
                    dist.all_reduce(p.grad)
                    p.grad /= world
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
