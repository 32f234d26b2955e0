"""One rank of `make repro-torch`'s overhead measurement (issue 43's second goal): a 25 M
parameter model (one 5000×5000 linear layer and its bias, one DDP bucket) under DDP with
DDP's own allreduce (`default`) or gradkit's `ring` as the communication hook, on the ranks of
this machine. Per step, rank 0 measures the step, and for the hook its wall time and the time
inside the reduction (`time_comm_s`, which includes the transport's own Python): what the hook
spends outside the reduction (the bucket's layout, one copy in, Python, the GIL) is their
difference. One JSON line per run to --out.

    mpirun -np 4 python pipelines/torch_overhead.py --exchange ring --out o.jsonl
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradkit.torch as gt  # noqa: E402

WIDTH = 5000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exchange", choices=["default", "ring"], default="ring")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gt.init_process_group_from_mpirun("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(WIDTH, WIDTH)
    net = DDP(model, bucket_cap_mb=200)  # the whole model in one bucket
    hook_s, comm_s = [0.0], [0.0]
    if args.exchange == "ring":
        state, hook = gt.hook("ring", model=model)

        def timed(st, bucket):
            t0 = time.perf_counter()
            fut = hook(st, bucket)
            hook_s[-1] += time.perf_counter() - t0
            key, _, _ = st.layout_of(bucket)
            comm_s[-1] += st.reducers[key].last_metrics["time_comm_s"]
            return fut

        net.register_comm_hook(state, timed)
    x = torch.randn(8, WIDTH)
    steps = []
    for _ in range(args.steps):
        hook_s.append(0.0)
        comm_s.append(0.0)
        t0 = time.perf_counter()
        net.zero_grad()
        net(x).square().mean().backward()
        steps.append(time.perf_counter() - t0)
    if rank == 0:
        row = {"exchange": args.exchange, "ranks": dist.get_world_size(), "repeat": args.repeat,
               "n": sum(p.numel() for p in model.parameters()), "step_s": steps,
               "hook_s": hook_s[1:], "comm_s": comm_s[1:]}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
