"""One rank of `make repro-torch` (pipelines/repro-torch.sh): a model trained under
torch.distributed (gloo) with one exchange, the time of every step measured.

Exchanges: `default` (DDP's own bucketed allreduce, overlapped with the backward pass: the
papers' DenseOvlp), a gradkit algorithm as DDP's communication hook (`ring`, `topka`,
`gtopk`, `oktopk`, `deft`, …; sparse ones at --density), or `onebit-adam` (gradkit's 1-bit Adam
optimiser, no DDP). Models, defined here on generated data (no download): `cnn` (4 conv
layers and a linear head on 1×16×16 images of 8 classes, ≈ 0.5 M parameters) and `lstm` (a
2-layer LSTM language model on Zipf-distributed token sequences with a learnable bigram
rule, ≈ 0.6 M parameters).

Rank 0 writes one JSON line per run to --out: the per-step wall times, the loss of every step
averaged over the ranks, gradkit's bytes sent per step and rank (DDP's own allreduce is not
counted by gradkit: `null`), and the held-out accuracy at the end.

    mpirun -np 4 python pipelines/torch_bench.py --model cnn --exchange oktopk --out r.jsonl
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradkit.torch as gt  # noqa: E402
import gradkit  # noqa: E402

CLASSES, SIDE, VOCAB, CONTEXT = 8, 16, 1000, 24
# Learning rates per model: SGD with momentum 0.9 for the DDP runs, Adam's for 1-bit Adam
# (tried on this machine: the CNN at SGD 0.05 diverged, the LSTM at SGD 0.5 barely learned).
LR = {("cnn", "sgd"): 0.01, ("cnn", "adam"): 1e-3, ("lstm", "sgd"): 2.0, ("lstm", "adam"): 1e-2}


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 384), nn.ReLU(), nn.Linear(384, CLASSES),
    )


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 96)
        self.rnn = nn.LSTM(96, 160, num_layers=2, batch_first=True)
        self.head = nn.Linear(160, VOCAB)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


def images(gen, batch):
    """Class c: a bright 4×4 square at one of 8 positions, in noise."""
    y = torch.randint(0, CLASSES, (batch,), generator=gen)
    x = torch.randn(batch, 1, SIDE, SIDE, generator=gen)
    for i, c in enumerate(y.tolist()):
        r, col = 4 * (c // 4) + 2, 4 * (c % 4)
        x[i, 0, r : r + 4, col : col + 4] += 1.5
    return x, y


def tokens(gen, batch):
    """Zipf-distributed first tokens; each next token is (3·t + 7) mod V with probability
    0.7, else a fresh Zipf draw: a bigram rule the model can learn."""
    ranks = torch.arange(1, VOCAB + 1, dtype=torch.float64)
    p = (1 / ranks) / (1 / ranks).sum()
    seq = torch.multinomial(p, batch * (CONTEXT + 1), replacement=True, generator=gen).view(batch, CONTEXT + 1)
    keep = torch.rand(batch, CONTEXT + 1, generator=gen) < 0.7
    for t in range(1, CONTEXT + 1):
        seq[:, t] = torch.where(keep[:, t], (3 * seq[:, t - 1] + 7) % VOCAB, seq[:, t])
    return seq[:, :-1], seq[:, 1:]


def loss_of(model, kind, x, y):
    out = model(x)
    if kind == "lstm":
        return F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1)), out
    return F.cross_entropy(out, y), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["cnn", "lstm"], default="cnn")
    ap.add_argument("--exchange", default="default")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None,
                    help="SGD's (DDP runs) or Adam's (onebit-adam) [default: per model, in LR]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transport", choices=["torch", "mpi"], default="torch",
                    help="what carries gradkit's messages: torch.distributed's process group "
                         "(gloo) or gradkit's MPI backend (under mpirun) [default: torch]")
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gradkit_algo = args.exchange not in ("default", "onebit-adam")
    takes_density = gradkit_algo and gt.reads(args.exchange, "density")

    gt.init_process_group_from_mpirun("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = cnn() if args.model == "cnn" else Lstm()
    n = sum(p.numel() for p in model.parameters())
    draw = images if args.model == "cnn" else tokens
    gen = torch.Generator().manual_seed(1000 * args.seed + rank)
    batches = [draw(gen, args.batch) for _ in range(args.steps)]

    comm, net = None, model
    carrier = None  # gradkit.torch's default: the process group
    if args.transport == "mpi" and args.exchange != "default":
        carrier = gradkit.mpi_comm()
    if args.exchange == "onebit-adam":
        lr = args.lr or LR[args.model, "adam"]
        opt = gt.OnebitAdam(model.parameters(), lr=lr, freeze_step=max(2, args.steps // 5), comm=carrier)
        comm = opt.comm
    else:
        net = DDP(model)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr or LR[args.model, "sgd"], momentum=0.9)
        if args.exchange != "default":
            options = {"density": args.density} if takes_density else {}
            state, hook = gt.hook(args.exchange, model=model, comm=carrier, **options)
            net.register_comm_hook(state, hook)
            comm = state.comm

    def sent():
        return sum(v[0] for k, v in comm.traffic().items() if k != "io") if comm is not None else 0

    times, losses, sent_bytes = [], [], []
    for x, y in batches:
        b0 = sent()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss, _ = loss_of(net, args.model, x, y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        sent_bytes.append(sent() - b0)
        mean = torch.tensor([loss.item()])
        dist.all_reduce(mean)  # the loss averaged over the ranks, outside the timed step
        losses.append(mean.item() / size)

    eval_gen = torch.Generator().manual_seed(99991)
    with torch.no_grad():
        x, y = draw(eval_gen, 512)
        _, out = loss_of(model, args.model, x, y)
        acc = (out.argmax(-1) == y).float().mean().item()
    if rank == 0:
        row = {"model": args.model, "exchange": args.exchange, "ranks": size, "n": n,
               "density": args.density if takes_density else None,
               "repeat": args.repeat, "transport": args.transport if args.exchange != "default" else "gloo",
               "rate": os.environ.get("GRADKIT_CLUSTER_INFO", ""),
               "step_s": times, "loss": losses, "eval_accuracy": acc,
               "bytes_sent": sent_bytes if comm is not None else None}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
