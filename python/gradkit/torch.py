"""gradkit's exchanges in a PyTorch training loop (docs/PYTORCH.md § Train with it).

- `comm(group=None)`: a gradkit `Comm` carried by torch.distributed's process group (gloo on
  CPU; whatever backend DDP uses), so gradkit's reducers run under torchrun and under mpirun
  alike (`init_process_group_from_mpirun()` starts the group from mpirun's environment).
- `hook(algo, **options)`: a DDP communication hook that reduces each bucket with a gradkit
  reducer (state per bucket, restored across a checkpoint):

      state, fn = gradkit.torch.hook("oktopk", density=0.01, model=model, metrics="run/m.parquet")
      ddp.register_comm_hook(state, fn)

- `step_profile(model, forward, optimizer, path)`: one rank's training step measured layer by
  layer, written as the profile `gradreport simulate --step-profile` and `make predict` read.

The reducers are the Rust ones `gradallreduce` runs (`gradkit.Reducer`); nothing here
implements an algorithm."""

import collections
import os
import statistics
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

from . import _tempfiles, native
from .native import reads  # noqa: F401  (gradkit.torch.reads(algo, option))
from .recorder import Recorder, strip_wrappers

_DTYPES = {"f32": torch.float32, "f64": torch.float64}


class ProcessGroupTransport:
    """gradkit's `Comm.exchange_raw` carried by `torch.distributed.batch_isend_irecv` on a
    process group: one round of message lengths (int64), then one of the payloads (uint8),
    so each message arrives whole without a probe. gradkit counts the payload bytes, as on
    every backend; the length round is this transport's own. Payloads cross without a copy
    out (gradkit's read-only message objects, which `torch.frombuffer` reads in place) and with
    one copy in (numpy views of the received tensors, copied once into gradkit)."""

    def __init__(self, group=None):
        self.group = group

    def _peer(self, r):
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def _run(self, ops):
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()

    def exchange(self, tag, sends, srcs):
        tag = int(tag) & 0x7FFFFFFF
        by_dst = collections.OrderedDict()
        for d, payload in sends:
            by_dst.setdefault(d, []).append(payload)
        expect = collections.Counter(srcs)
        ops, lengths = [], {}
        for d, msgs in by_dst.items():
            t = torch.tensor([len(m) for m in msgs], dtype=torch.int64)
            ops.append(dist.P2POp(dist.isend, t, self._peer(d), self.group, tag))
        for s, count in expect.items():
            lengths[s] = torch.empty(count, dtype=torch.int64)
            ops.append(dist.P2POp(dist.irecv, lengths[s], self._peer(s), self.group, tag))
        self._run(ops)
        ops, received = [], []
        for d, msgs in by_dst.items():
            for m in msgs:
                if len(m):  # gradkit's message: its bytes read in place, read-only
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", "The given buffer is not writable")
                        t = torch.frombuffer(m, dtype=torch.uint8)
                    ops.append(dist.P2POp(dist.isend, t, self._peer(d), self.group, tag))
        taken = collections.Counter()
        for s in srcs:
            n = int(lengths[s][taken[s]])
            taken[s] += 1
            t = torch.empty(n, dtype=torch.uint8)
            received.append(t)
            if n:
                ops.append(dist.P2POp(dist.irecv, t, self._peer(s), self.group, tag))
        self._run(ops)
        return [t.numpy() for t in received]  # gradkit copies each out once

    def barrier(self):
        dist.barrier(group=self.group)

    def allreduce(self, data, dtype):
        """Sums `data` (a bytearray of `dtype` values) over the ranks, in place."""
        if len(data):
            dist.all_reduce(torch.frombuffer(data, dtype=_DTYPES[dtype]), group=self.group)


def comm(group=None):
    """This rank's gradkit `Comm` on torch.distributed's process group (default: the world),
    which must be initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gradkit.torch.comm(): torch.distributed is not initialised; call "
            "dist.init_process_group(...) first (or gradkit.torch.init_process_group_from_mpirun())"
        )
    backend = dist.get_backend(group)
    return native._lib().Comm.transport(
        ProcessGroupTransport(group),
        dist.get_rank(group),
        dist.get_world_size(group),
        f"torch.distributed/{backend}",
    )


def init_process_group_from_mpirun(backend="gloo", **kwargs):
    """`dist.init_process_group` in a process that mpirun started: rank and size from Open
    MPI's or PMI's environment, MASTER_ADDR/MASTER_PORT as given (default 127.0.0.1:29500)."""
    env = os.environ
    rank = env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK"))
    size = env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE"))
    if rank is None or size is None:
        raise RuntimeError(
            "init_process_group_from_mpirun(): no OMPI_COMM_WORLD_RANK/PMI_RANK in the environment; "
            "start the script with mpirun (under torchrun call dist.init_process_group())"
        )
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, rank=int(rank), world_size=int(size), **kwargs)


class HookState:
    """What `hook` keeps: one `gradkit.Reducer` per DDP bucket (created at the bucket's first
    call, its layers the bucket's parameters), the metrics and the recording. `state_dict()` /
    `load_state_dict()` carry every bucket's reducer state through a checkpoint; `close()`
    writes the metrics and closes the recording (call it after the last step)."""

    def __init__(self, algo, options, *, comm=None, model=None, metrics=None, run=None,
                 record=None, write_every=50):
        self.algo, self.options = algo, dict(options)
        # An unknown algorithm is refused by the probe below, with the known names.
        if algo in native.algorithms() and native.reads(algo, "op") and "op" not in self.options:
            self.options["op"] = "mean"  # DDP's hook result is the average
        self.comm = comm if comm is not None else globals()["comm"]()
        self.names = {}
        # The order gradients became ready in the first step (DDP rebuilds its buckets in
        # that order after the first step): a reducer made at the first step takes it, so
        # the rebuilt buckets are reduced in place, without reordering copies.
        self.ready, self._ready_hooks = {}, []
        if model is not None:
            for n, p in model.named_parameters():
                self.names[id(p)] = strip_wrappers(n)
                if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                    self._ready_hooks.append(p.register_post_accumulate_grad_hook(self._mark_ready))
        self.reducers = {}  # key (the layers, sorted) → Reducer, in the order of their first step
        self.orders = {}  # key → the reducer's layers, in the order of its flat buffer
        self.by_index = {}  # DDP's bucket index → its layers at the last step
        self.pending = {}
        self.steps = 0
        self.session_steps = 0
        self.write_every = write_every
        # The options checked once, up front (a plan is checked against each bucket's layers).
        checked = {k: v for k, v in self.options.items() if k != "plan"}
        probe = native.Reducer(algo, self.comm, [("probe", (1,))], **checked)
        self.run = run or probe.run
        self.metrics = None
        if metrics is not None:
            self.metrics = metrics if isinstance(metrics, native.Metrics) else native.Metrics(metrics, self.comm, self.run, algo=probe.algo)
        self.record_dir = record
        self.recorders = {}

    def _mark_ready(self, p):
        self.ready.setdefault(id(p), len(self.ready))

    def layout_of(self, bucket):
        """The bucket's key (its layers, sorted: the same set of parameters whatever order DDP
        gives them), the reducer's layers in its order, and where each lies in the bucket's
        buffer: `None` when the reducer's order is the bucket's (reduced in place).

        A reducer's order is that of the bucket at its first step, except at the hook's first
        step, where it is the order the gradients became ready (DDP's order once it has
        rebuilt its buckets after that step); a state restored keeps the order it was saved
        with."""
        spans, off = [], 0
        for i, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients())):
            name = self.names.get(id(p), f"bucket{bucket.index()}.param{i}")
            # At the first step, where the gradient became ready (one not yet marked is the
            # bucket's last: DDP called the hook before the mark); later, the bucket's order.
            ready = self.ready.get(id(p)) if self.session_steps == 0 else None
            spans.append(((name, tuple(g.shape) or (1,)), off, g.numel(), (ready is None, ready or 0, i)))
            off += g.numel()
        here = tuple(layer for layer, _, _, _ in spans)
        key = tuple(sorted(here))
        order = self.orders.get(key)
        if order is None:
            order = self.pending[key][0] if key in self.pending else None
        if order is None:
            order = tuple(layer for layer, _, _, _ in sorted(spans, key=lambda s: s[3]))
        if order == here:
            return key, order, None
        at = {layer: (o, n) for layer, o, n, _ in spans}
        return key, order, [at[layer] for layer in order]

    def reducer_for(self, bucket, key, layers):
        """The reducer of this set of layers: made at its first step (or restored from a
        loaded state). A bucket index whose layers change after DDP's rebuild (the first two
        steps of this hook) is an error."""
        index = bucket.index()
        seen = self.by_index.get(index)
        if seen is not None and seen != key and self.session_steps >= 2:
            raise ValueError(
                f"gradkit hook: DDP bucket {index} changed its parameters after step "
                f"{self.steps - 1}: a bucket's layers must stay the same once DDP has rebuilt "
                "its buckets after the first step"
            )
        self.by_index[index] = key
        have = self.reducers.get(key)
        if have is None:
            number = len(self.reducers)
            run = self.run if number == 0 else f"{self.run}.b{number}"
            have = native.Reducer(self.algo, self.comm, list(layers), run=run, metrics=self.metrics, **self.options)
            if key in self.pending:
                have.load_state_dict(self.pending.pop(key)[1])
            self.reducers[key] = have
            self.orders[key] = layers
        return have

    def record(self, key, arr):
        if self.record_dir is None:
            return
        rec = self.recorders.get(key)
        if rec is None:
            number = list(self.reducers).index(key)
            path = os.path.join(self.record_dir, f"bucket{number}", f"rank{self.comm.rank}.parquet")
            rec = self.recorders[key] = Recorder(path, rank=self.comm.rank, world_size=self.comm.size)
        parts, off = {}, 0
        for name, shape in self.orders[key]:
            n = int(np.prod(shape))
            parts[name] = arr[off : off + n].reshape(shape)
            off += n
        rec.step(parts)

    def state_dict(self):
        """Every reducer's state with its layers ((name, shape) pairs, in its order), and the
        step."""
        return {"algo": self.algo, "steps": self.steps,
                "buckets": [(list(self.orders[k]), red.state_dict()) for k, red in self.reducers.items()]}

    def load_state_dict(self, state):
        """Restores `state_dict()`: each reducer's state goes to the bucket with the same
        layers, at its first step (checked there: algorithm, world size, size), and that
        reducer keeps the saved order of its layers."""
        if state.get("algo") != self.algo:
            raise ValueError(f"hook state: its algo is {state.get('algo')!r}, this hook's {self.algo!r}")
        self.steps = int(state["steps"])
        self.session_steps = 0
        self.pending = {}
        for layers, saved in state["buckets"]:
            order = tuple((n, tuple(s)) for n, s in layers)
            self.pending[tuple(sorted(order))] = (order, saved)
        for key, red in self.reducers.items():
            if key in self.pending:
                order, saved = self.pending.pop(key)
                if order != self.orders[key]:
                    raise ValueError("hook state: a bucket's saved layer order differs from its reducer's; "
                                     "load the state before the first step")
                red.load_state_dict(saved)

    def close(self):
        for rec in self.recorders.values():
            rec.close()
        self.recorders = {}
        if self.metrics is not None:
            self.metrics.write()


def _hook(state, bucket):
    buf = bucket.buffer()
    flat = native._buffer(buf, "the DDP bucket")  # its memory; a GPU, float64… bucket refused
    key, layers, moved = state.layout_of(bucket)
    red = state.reducer_for(bucket, key, layers)
    # In the reducer's order: reduced in place when the bucket's agrees, else through one copy.
    x = flat if moved is None else np.concatenate([flat[o : o + n] for o, n in moved])
    state.record(key, x)
    red.reduce(x, out=x)
    if moved is not None:
        at = 0
        for o, n in moved:
            flat[o : o + n] = x[at : at + n]
            at += n
    if bucket.is_last():
        if state.session_steps == 0:  # the ready order is known: no need to watch it again
            for h in state._ready_hooks:
                h.remove()
            state._ready_hooks = []
        state.steps += 1
        state.session_steps += 1
        if state.metrics is not None and state.steps % state.write_every == 0:
            state.metrics.write()
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def hook(algo, *, comm=None, model=None, metrics=None, run=None, record=None, write_every=50, **options):
    """A DDP communication hook reducing each bucket with gradkit's `algo` (an `--algo` name;
    `gradkit.algorithms()`), with `gradallreduce`'s options as keywords (`density=0.01`,
    `period=`, …; `op` defaults to `mean`, DDP's average). Returns `(state, fn)` for
    `ddp.register_comm_hook(state, fn)`.

    - `model`: names the layers after the model's parameters (else `bucket<i>.param<j>`).
    - `metrics`: a path (or a `gradkit.Metrics`): every step's rows, written by rank 0 every
      `write_every` steps and on `state.close()`; `state.metrics.add("loss", v, step)` adds
      the loop's own.
    - `record`: a directory: each bucket's gradients before the reduction, per rank
      (`<dir>/bucket<i>/rank<r>.parquet`), for `gradallreduce` to replay offline."""
    return HookState(algo, options, comm=comm, model=model, metrics=metrics, run=run,
                     record=record, write_every=write_every), _hook


class _Onebit(torch.optim.Optimizer):
    """A 1-bit optimiser of gradkit-train on the model's parameters as one flat vector (see
    `OnebitAdam`, `OnebitLamb`). Call `step()` after `backward()` on each rank's own gradient,
    without DDP's allreduce: the optimiser exchanges (the gradient's ring allreduce during the
    warm-up, the 1-bit compressed momentum after it)."""

    METHOD = None

    def __init__(self, params, lr=1e-3, freeze_step=100000, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, bias_correction=False, comm=None, **extra):
        if bias_correction:
            raise ValueError(
                f"{type(self).__name__}: bias_correction=True is not what the 1-bit LAMB paper's "
                "optimisers do (gradkit follows them: no bias correction); pass bias_correction=False"
            )
        super().__init__(params, {"lr": lr})
        if len(self.param_groups) != 1:
            raise ValueError(f"{type(self).__name__}: one parameter group (a flat vector), not {len(self.param_groups)}")
        self._params = list(self.param_groups[0]["params"])
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"{type(self).__name__}: parameter {i} is {p.dtype} on {p.device}; "
                                "gradkit's 1-bit optimisers step float32 CPU parameters")
        self.comm = comm if comm is not None else globals()["comm"]()
        config = dict(betas=tuple(betas), eps=eps, weight_decay=weight_decay, freeze_step=freeze_step, **extra)
        self._engine = native._lib().OnebitOptimizer(
            self.METHOD, self.comm, [p.numel() for p in self._params], config)
        self._step = 0
        self.last_metrics = {}

    def _flat(self, tensors):
        return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        w = self._flat(self._params)
        g = self._flat(grads)
        lr = float(self.param_groups[0]["lr"])
        self.last_metrics = dict(self._engine.step(w, g, lr, self._step))
        at = 0
        for p in self._params:
            n = p.numel()
            p.copy_(torch.from_numpy(w[at : at + n]).view_as(p))
            at += n
        self._step += 1
        return loss

    def state_dict(self):
        sd = super().state_dict()
        sd["gradkit"] = {"method": self.METHOD, "step": self._step, "world_size": self.comm.size,
                         "tensors": {k: np.frombuffer(v, dtype=np.float32).copy() for k, v in self._engine.state()}}
        return sd

    def load_state_dict(self, state_dict):
        mine = state_dict.get("gradkit")
        if mine is None or mine.get("method") != self.METHOD:
            raise ValueError(f"{type(self).__name__}: not a state_dict of {self.METHOD}")
        if mine["world_size"] != self.comm.size:
            raise ValueError(f"{type(self).__name__}: the state is of {mine['world_size']} ranks, "
                             f"this process group has {self.comm.size}")
        rest = {k: v for k, v in state_dict.items() if k != "gradkit"}
        super().load_state_dict(rest)
        self._engine.load_state([(k, np.ascontiguousarray(v, dtype=np.float32)) for k, v in mine["tensors"].items()])
        self._step = int(mine["step"])


class OnebitAdam(_Onebit):
    """1-bit Adam (the 1-bit LAMB paper's baseline, DeepSpeed's `OnebitAdam`): Adam for
    `freeze_step` steps, then frozen variance and 1-bit compressed momentum. DeepSpeed's
    argument names; gradkit's `onebit_clip`, `onebit_mask` (docs/ALGORITHMS.md)."""

    METHOD = "onebit-adam"


class OnebitLamb(_Onebit):
    """1-bit LAMB (Algorithm 1 of the paper, DeepSpeed's `OnebitLamb`): LAMB for `freeze_step`
    steps, then 1-bit compressed momentum with frozen variance and the reconstructed scaling
    ratio. DeepSpeed's argument names (`max_coeff`, `min_coeff`, `coeff_beta`, `factor_max`,
    `factor_min`, `factor_threshold`)."""

    METHOD = "onebit-lamb"


def step_profile(model, forward, optimizer=None, path=None, *, steps=5, warmup=2):
    """Measures `model`'s training step on this rank alone, without communication, as the
    step profile of `gradreport simulate --step-profile` (docs/SIMULATE.md § Whole steps): rows
    `(name, numel, ms)`, a row `forward`, one row per parameter in the order its gradient
    became ready in the backward pass (the order DDP fills its buckets in), with the backward
    time since the one before it, and a row `optimizer`.

    `forward()` runs one forward pass on a batch and returns the loss; `optimizer.step()` and
    `zero_grad()` are timed as the step's end (`None`: no optimizer row's time). Each time is
    the median over `steps` steps after `warmup` unmeasured ones (the parameters are updated:
    profile a copy, or before training). A CUDA model is synchronised at each mark. With
    `path`, the rows are written there as CSV (complete or not at all). Returns the rows."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"step_profile: steps must be >= 1 and warmup >= 0 (got {steps}, {warmup})")
    params = [(strip_wrappers(n), p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("step_profile: the model has no parameter that requires a gradient")
    cuda = any(p.is_cuda for _, p in params)

    def now():
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    marks = {}

    def mark(i):
        def hook(_param):  # must return None
            marks.setdefault(i, now())
        return hook

    hooks = [p.register_post_accumulate_grad_hook(mark(i)) for i, (_, p) in enumerate(params)]
    samples = []
    try:
        for s in range(warmup + steps):
            marks.clear()
            t0 = now()
            loss = forward()
            t1 = now()
            loss.backward()
            t2 = now()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
            t3 = now()
            if len(marks) != len(params):
                missing = [params[i][0] for i in range(len(params)) if i not in marks]
                raise ValueError(f"step_profile: no gradient for {', '.join(missing[:5])}: "
                                 "forward() must use every parameter that requires a gradient")
            if s >= warmup:
                samples.append((t0, t1, t2, t3, dict(marks)))
    finally:
        for h in hooks:
            h.remove()
    # The ready order of the first measured step; each layer's time since the one before
    # (the first's since the forward ended; the last's until the backward did).
    first = samples[0][4]
    order = sorted(first, key=first.get)
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    rows = [("forward", 0, med([t1 - t0 for t0, t1, _, _, _ in samples]))]
    for j, i in enumerate(order):
        spans = []
        for _, t1, t2, _, mark in samples:
            start = t1 if j == 0 else mark[order[j - 1]]
            end = max(t2, mark[i]) if j == len(order) - 1 else mark[i]
            spans.append(max(end - start, 0.0))
        rows.append((params[i][0], params[i][1].numel(), med(spans)))
    rows.append(("optimizer", 0, med([t3 - t2 for _, _, t2, t3, _ in samples]) if optimizer is not None else 0.0))
    if path is not None:
        tmp = _tempfiles.create(path)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("name,numel,ms\n")
                for name, numel, ms in rows:
                    f.write(f"{name},{numel},{ms:.6f}\n")
            _tempfiles.commit(tmp, path)
        except BaseException:
            _tempfiles.discard(tmp)
            raise
    return rows
