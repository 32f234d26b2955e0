"""One rank of test_torch_bridge, under torchrun (or mpirun): gradkit's reducers as a DDP
communication hook over torch.distributed (gloo).

1. gradkit_comm's conformance suite on the torch.distributed transport (OUT/conformance.json).
2. For every algorithm given: a small model under DDP (one bucket) with the gradkit hook,
   trained STEPS steps on this rank's data, the hook recording each bucket's gradients
   (OUT/<algo>/bucket0/rank<R>.parquet) and its metrics (OUT/<algo>.metrics.parquet); rank 0
   saves the reduced buckets (OUT/<algo>.online.npy) and the losses.
3. gradkit.torch.OnebitAdam and OnebitLamb train the model without DDP: every rank's
   parameters afterwards (OUT/<method>.params.rank<R>.npy).
4. The checkpoint (oktopk): CUT steps, the model's, optimizer's and hook's state saved, a new
   model, optimizer, DDP and hook restored from them, the remaining steps; rank 0 saves the
   reduced buckets (OUT/oktopk.resumed.npy).

    python -m torch.distributed.run --nproc_per_node 2 torch_run.py OUT STEPS ALGO:OPTIONS_JSON ...
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradkit
import gradkit.torch as gt

CUT = 3


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))


def data(rank, steps):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(steps)]


def train(algo, opts, batches, out_dir, *, start=None, stop=None, resume=None):
    """Steps [start, stop) of a run with the gradkit hook; the reduced buckets of those steps.
    `resume`: the states saved at `start`."""
    net = model()
    ddp = DDP(net, bucket_cap_mb=100)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    record = os.path.join(out_dir, algo) if resume is None and start is None else None
    metrics = os.path.join(out_dir, f"{algo}.metrics.parquet") if record else None
    state, fn = gt.hook(algo, model=net, record=record, metrics=metrics, **opts)
    if resume is not None:
        net.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        state.load_state_dict(resume["hook"])
    reduced = []

    def capture(st, bucket):
        fut = fn(st, bucket)
        # In the reducer's order, as the recording and the reducer see the bucket.
        _, _, moved = st.layout_of(bucket)
        flat = bucket.buffer().numpy()
        reduced.append(flat.copy() if moved is None else np.concatenate([flat[o : o + n] for o, n in moved]))
        return fut

    ddp.register_comm_hook(state, capture)
    losses = []
    for x, y in batches[start:stop]:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if state.metrics is not None:
            state.metrics.add("loss", loss.item(), state.steps - 1, algo)
    state.close()
    saved = {"model": net.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    return reduced, losses, saved


def main():
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        gt.init_process_group_from_mpirun("gloo")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    checks = gt.comm().conformance(1 << 14)
    if rank == 0:
        with open(os.path.join(out_dir, "conformance.json"), "w") as f:
            json.dump(checks, f)
    batches = data(rank, steps)
    for spec in sys.argv[3:]:
        algo, opts = spec.split(":", 1)
        opts = json.loads(opts)
        reduced, losses, _ = train(algo, opts, batches, out_dir)
        if algo == "oktopk":
            _, _, saved = train(algo, opts, batches, out_dir, start=0, stop=CUT)
            resumed, _, _ = train(algo, opts, batches, out_dir, start=CUT, stop=steps, resume=saved)
            if rank == 0:
                np.save(os.path.join(out_dir, "oktopk.resumed.npy"), np.stack(resumed))
        if rank == 0:
            np.save(os.path.join(out_dir, f"{algo}.online.npy"), np.stack(reduced))
            np.save(os.path.join(out_dir, f"{algo}.losses.npy"), np.array(losses))
    for cls in (gt.OnebitAdam, gt.OnebitLamb):
        # No DDP: the optimiser exchanges (ring during the warm-up, 1-bit after it).
        net = model()
        opt = cls(net.parameters(), lr=0.01, freeze_step=2)
        losses = []
        for x, y in batches:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
        np.save(os.path.join(out_dir, f"{cls.METHOD}.params.rank{rank}.npy"), flat)
        sd = opt.state_dict()
        again = cls(model().parameters(), lr=0.01, freeze_step=2)
        again.load_state_dict(sd)
        assert set(again.state_dict()["gradkit"]["tensors"]) == set(sd["gradkit"]["tensors"])
        if rank == 0:
            np.save(os.path.join(out_dir, f"{cls.METHOD}.losses.npy"), np.array(losses))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
