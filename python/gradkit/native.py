"""gradkit's reducers in a training loop: the Rust allreduces of `gradallreduce` (same names,
options and defaults), called step by step from Python with the state they keep across steps.

    import numpy as np, gradkit
    comm = gradkit.mpi_comm()                     # under mpirun; gradkit.torch.comm() under torchrun
    red = gradkit.Reducer("oktopk", comm, [("fc1.weight", (64, 32)), ("fc1.bias", (64,))],
                          density=0.01)
    out = red.reduce(flat_grad)                   # float32, the layers concatenated

The reduction is `gradkit_collectives::step::reduce_step`, the one `gradallreduce` runs on a
trace: a run here and `gradallreduce` on the recorded gradients give the same result and the
same metrics/1 rows (docs/PYTORCH.md § Train with it)."""

import atexit
import os

import numpy as np

try:
    from . import _native
except ImportError as e:  # pragma: no cover - the message is the point
    _native = None
    _IMPORT_ERROR = e


def _lib():
    if _native is None:
        raise ImportError(
            "gradkit's native module is not built for this Python: `pip install ./python` "
            "builds it (Rust >= 1.88 and maturin), or `make build` in the repository puts it "
            f"beside the package for the project's venv ({_IMPORT_ERROR})"
        )
    return _native


def algorithms():
    """Every algorithm: a dict per `--algo` name with its family, paper, description, the
    options it reads and whether a `Reducer` runs it (every one but EmbRace's AlltoAll, whose
    input is sparse embedding rows)."""
    keys = ("family", "paper", "description", "options", "reducer")
    return {a[0]: dict(zip(keys, a[1:])) for a in _lib().algorithms()}


def reads(algo, option):
    """Whether `algo` takes `option` (a keyword of `Reducer`)."""
    info = algorithms().get(algo)
    if info is None:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(algorithms())}")
    return option in info["options"]


_finalize_registered = False


def mpi_comm():
    """This process's rank of the MPI job `mpirun` started (gradkit's MPI backend; MPI is
    initialised here once and finalized at exit)."""
    global _finalize_registered
    lib = _lib()
    if not lib.under_mpi_launcher():
        raise RuntimeError(
            "gradkit.mpi_comm(): this process was not started by mpirun or mpiexec; under "
            "torchrun use gradkit.torch.comm() (torch.distributed's process group)"
        )
    c = lib.Comm.mpi()
    if not _finalize_registered:
        atexit.register(lib.finalize_mpi)
        _finalize_registered = True
    return c


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _buffer(x, what):
    """A CPU torch tensor as the numpy array that shares its memory (no copy); anything else as
    it is (the native module checks dtype, layout and size, naming `what`)."""
    if not _is_torch(x):
        return x
    if x.device.type != "cpu":
        raise ValueError(
            f"`{what}` is on {x.device}; this build reduces CPU tensors (the CUDA build is "
            "`cargo build --release --features cuda`, docs/GPU.md)"
        )
    import torch

    if x.dtype != torch.float32:
        raise TypeError(f"`{what}` is {x.dtype}; gradkit reduces float32 (a conversion would be a silent copy)")
    if not x.is_contiguous():
        raise ValueError(f"`{what}` is not contiguous; a copy would be silent (tensor.contiguous())")
    return x.detach().numpy()


def _layers(layers):
    out = []
    for item in layers:
        try:
            name, shape = item
        except (TypeError, ValueError):
            raise TypeError(
                f"layers: each item is a (name, shape) pair, not {item!r}"
            ) from None
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
        out.append((str(name), list(shape)))
    return out


class Reducer:
    """One allreduce algorithm by its `--algo` name (`gradkit.algorithms()` lists them), with
    `gradallreduce`'s options as keywords: `density`, `k`, `op`, `wire`, `period`, `reeval`,
    `adjust`, `balance`, `reeval_step_d`, `plan` (a plan/1 file), `residual`, `seed`. An option
    the algorithm does not read raises a `ValueError` naming the algorithms that read it.

    `layers`: (name, shape) pairs in the order of the flat buffer `reduce` takes. `metrics`: a
    `gradkit.Metrics` that receives every step's rows (as `gradallreduce --metrics`)."""

    def __init__(self, algo, comm, layers, *, run=None, metrics=None, **options):
        lib = _lib()
        if not isinstance(algo, str):
            raise TypeError(f"algo must be an --algo name (str), not {type(algo).__name__}")
        native_metrics = metrics._native if metrics is not None else None
        self._r = lib.Reducer(algo, comm, _layers(layers), options, run, native_metrics)
        self.comm = comm

    algo = property(lambda self: self._r.algo, doc="The `--algo` name.")
    numel = property(lambda self: self._r.numel, doc="Elements of the flat buffer.")
    run = property(lambda self: self._r.run, doc="The run's name in the metrics.")
    next_step = property(lambda self: self._r.next_step, doc="The step the next call reduces.")

    def reduce(self, grad, out=None, step=None):
        """Reduces `grad` (float32, contiguous, `numel` elements: a numpy array or a CPU torch
        tensor, read in place) with the other ranks; the result goes into `out` (default: a new
        array, or tensor for a tensor; `out=grad` reduces in place). Returns `out`. The step's
        metrics are in `last_metrics`."""
        if out is None:
            out = np.empty(self.numel, dtype=np.float32)
            if _is_torch(grad):
                import torch

                out = torch.empty(self.numel, dtype=torch.float32)
        self.last_metrics = dict(self._r.reduce(_buffer(grad, "grad"), _buffer(out, "out"), step))
        return out

    def state_dict(self):
        """The state kept across steps (residuals, 1-bit error buffers, reused thresholds) as
        numpy arrays, with what `load_state_dict` checks."""
        return {
            "algo": self.algo,
            "world_size": self.comm.size,
            "numel": self.numel,
            "next_step": self.next_step,
            "tensors": {k: np.frombuffer(v, dtype=np.float32).copy() for k, v in self._r.state()},
        }

    def load_state_dict(self, state):
        """Restores a `state_dict()` of the same algorithm, world size and layers."""
        for key, mine in (("algo", self.algo), ("world_size", self.comm.size), ("numel", self.numel)):
            if state.get(key) != mine:
                what = "process group's size" if key == "world_size" else key
                raise ValueError(
                    f"state_dict: its {key} is {state.get(key)!r} but this reducer's {what} is "
                    f"{mine!r}; a state restores into the same algorithm, world size and layers"
                )
        tensors = [
            (k, np.ascontiguousarray(v, dtype=np.float32).reshape(-1))
            for k, v in state["tensors"].items()
        ]
        self._r.load_state(tensors, int(state["next_step"]))

    def finish(self):
        """The reducer's last messages, once after the last step (every rank calls it)."""
        self._r.finish()


class Metrics:
    """A run's metrics/1 file: every reducer's step rows given `metrics=` and the loop's own
    (`add("loss", 0.31, step)`, with `algo` as the run's), every rank's gathered to rank 0, which writes `path` on
    `write()` (every rank calls it; atomic: the file holds every row so far).
    `gradreport plot loss path` draws the run."""

    def __init__(self, path, comm, run, *, algo="", model=None, optimizer=None, seed=None):
        self._native = _lib().Metrics(os.fspath(path), comm, run, algo, model, optimizer, seed)

    path = property(lambda self: self._native.path)
    run = property(lambda self: self._native.run)

    def add(self, metric, value, step, algo=None):
        """One row of the loop's own for `step` from this rank (`algo`: the run's)."""
        self._native.add(str(metric), float(value), int(step), algo)

    def write(self):
        self._native.write()

    def __len__(self):
        """Rows this rank holds that no `write()` has sent yet."""
        return len(self._native)
