"""Recording gradients from a training loop as a `tensor/1` trace (docs/FORMAT.md)."""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import _tempfiles
from ._checksum import KEY, WRITE_OPTIONS
from ._schema import SCHEMA_KEY, tensor_schema

__version__ = "0.1.0"

# Prefixes that wrappers put before a parameter's own name: DistributedDataParallel and
# DataParallel (`module.`), torch.compile (`_orig_mod.`).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

# Metadata keys the recorder (or the tools) set: `metadata=` cannot replace them.
RESERVED_KEYS = (SCHEMA_KEY, "gradkit.producer", "gradkit.method", "gradkit.world_size", KEY)

# A List column's offsets are int32: one row group holds fewer list items than this.
_MAX_ITEMS = 2**31 - 1


def strip_wrappers(name):
    """`module.fc1.weight` → `fc1.weight` (any number of wrapper prefixes)."""
    changed = True
    while changed:
        changed = False
        for p in WRAPPER_PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p) :], True
    return name


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _as_float32(name, x, step):
    """A float32 numpy copy of a numpy array or torch tensor (any device, any float dtype)."""
    if _is_torch(x):
        x = x.detach()
        if not x.is_floating_point():
            raise TypeError(f"layer `{name}` at step {step}: dtype {x.dtype} is not a float type")
        import torch

        return x.to(dtype=torch.float32, device="cpu").contiguous().numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(
            f"layer `{name}` at step {step}: dtype {a.dtype} is not a float type "
            "(gradients are recorded as float32)"
        )
    # float16 converts exactly, float64 rounds to the nearest float32 (as `gradtrace import`).
    return np.ascontiguousarray(a, dtype=np.float32)


def _named_gradients(source):
    """(name, array) pairs from a torch module (its parameters' .grad), a mapping, or pairs."""
    if hasattr(source, "named_parameters"):
        return [(n, p.grad) for n, p in source.named_parameters() if p.grad is not None]
    if hasattr(source, "items"):
        return list(source.items())
    return list(source)


class Recorder:
    """Writes one `tensor/1` file: a row per (step, rank, layer), one row group per step.

    with Recorder("run/rank0.parquet", rank=0, world_size=4) as rec:
        for step, batch in enumerate(loader):
            ...backward()...
            rec.step(model)                  # or rec.step({"fc.weight": array, ...})

    The file appears at `path` when the recorder closes without an error; until then it is
    the hidden `.NAME.tmp-<pid>-<random>` in the same directory, which an error, SIGTERM or
    SIGHUP removes (nothing is left behind; gradkit/_tempfiles.py). Directories are created;
    a `path` that is a directory, or lies below a file, is refused here, not at the end. Layer names lose DDP's `module.` prefix; `layer_id` follows the
    order of the first recorded step (`named_parameters()` order for a module).
    """

    def __init__(self, path, rank=0, world_size=1, *, metadata=None, strip_prefixes=True,
                 allow_nonfinite=False):
        path = os.fspath(path)
        for what, v in (("rank", rank), ("world_size", world_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{what} must be a non-negative integer, got {v!r}")
        if world_size < 1 or rank >= world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
        self.path = path
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.strip_prefixes = strip_prefixes
        self.allow_nonfinite = allow_nonfinite
        meta = {
            "gradkit.producer": f"gradkit-python {__version__} argv={' '.join(sys.argv)}",
            "gradkit.method": "record",
            "gradkit.world_size": str(self.world_size),
        }
        for k, v in (metadata or {}).items():
            k = str(k)
            key = k if k.startswith("gradkit.") else "gradkit." + k
            if key in RESERVED_KEYS:
                raise ValueError(f"metadata key `{k}` is reserved: the recorder sets `{key}` "
                                 "itself (give the value another name)")
            meta[key] = str(v)
        self.schema = tensor_schema(meta)
        # name → (layer_id, numel, shape), fixed by the first recorded step.
        self._layers = {}
        self._last_step = {}
        self._done = set()
        _check_path(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._closed = True  # until the writer exists: close() and abort() do nothing
        self._tmp = _tempfiles.create(path)
        try:
            self._writer = pq.ParquetWriter(
                self._tmp, self.schema, compression="zstd", compression_level=1,
                use_dictionary=["layer"], **WRITE_OPTIONS,
            )
        except BaseException:
            _tempfiles.discard(self._tmp)
            raise
        self._closed = False

    # -- context manager ------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def close(self):
        """Finishes the file and gives it its name (an error leaves nothing behind)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
            _tempfiles.commit(self._tmp, self.path)
        except BaseException:
            _tempfiles.discard(self._tmp)
            raise

    def abort(self):
        """Drops everything recorded: no file at `path`, no temporary file."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        finally:
            _tempfiles.discard(self._tmp)

    # -- recording ------------------------------------------------------------------------
    def step(self, source, step=None, *, rank=None):
        """Records one step: `source` is a torch module (its parameters' `.grad`), a mapping
        name → array/tensor, or (name, array) pairs. `step` defaults to the previous step of
        this rank + 1 (0 first); `rank` to the recorder's (give it to write several ranks of
        a single-process simulation into one file). Returns the step number."""
        if self._closed:
            raise ValueError(f"{self.path}: the recorder is closed")
        rank = self.rank if rank is None else int(rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {self.world_size}")
        if step is None:
            step = self._last_step.get(rank, -1) + 1
        step = int(step)
        if not 0 <= step < 2**32:
            raise ValueError(f"step {step} does not fit UInt32")
        if (step, rank) in self._done:
            raise ValueError(f"step {step} of rank {rank} is already recorded in {self.path}")
        grads = []
        for name, g in _named_gradients(source):
            name = strip_wrappers(name) if self.strip_prefixes else str(name)
            a = _as_float32(name, g, step)
            grads.append((name, a, tuple(a.shape)))
        self._check_layers(grads, step)
        rows = sorted(((self._layers[n][0], n, a, s) for n, a, s in grads), key=lambda r: r[0])
        for chunk in _chunks(rows):
            self._writer.write_table(self._table(step, rank, chunk), row_group_size=len(chunk))
        self._done.add((step, rank))
        self._last_step[rank] = max(step, self._last_step.get(rank, -1))
        return step

    def _check_layers(self, grads, step):
        names = [n for n, _, _ in grads]
        if not grads:
            raise ValueError(f"step {step}: no gradients to record (no parameter has a .grad)")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"step {step}: layer names repeat: {', '.join(dup)}")
        if not self._layers:
            for i, (n, a, s) in enumerate(grads):
                self._layers[n] = (i, a.size, s)
        for n, a, _ in grads:
            if n not in self._layers:
                raise ValueError(
                    f"step {step}: layer `{n}` was not in the first recorded step "
                    "(every step records the same layers)"
                )
            if self._layers[n][1] != a.size:
                raise ValueError(
                    f"step {step}: layer `{n}` has {a.size} elements, "
                    f"{self._layers[n][1]} in the first recorded step"
                )
            if self._layers[n][2] != a.shape:
                raise ValueError(
                    f"step {step}: layer `{n}` has shape {_dims(a.shape)}, "
                    f"{_dims(self._layers[n][2])} in the first recorded step"
                )
            if not self.allow_nonfinite and not np.isfinite(a).all():
                raise ValueError(
                    f"step {step}: layer `{n}` holds NaN or Inf "
                    "(Recorder(..., allow_nonfinite=True) keeps them; the tools then need "
                    "--allow-nonfinite)"
                )
        missing = sorted(set(self._layers) - set(names))
        if missing:
            raise ValueError(
                f"step {step}: no gradient for layer(s) {', '.join(missing)} "
                "(recorded in the first step; every step records the same layers)"
            )

    def _table(self, step, rank, rows):
        n = len(rows)
        values = [a.reshape(-1) for _, _, a, _ in rows]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([v.size for v in values], out=offsets[1:])
        flat = np.concatenate(values) if values else np.zeros(0, np.float32)
        shape_off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(s) for _, _, _, s in rows], out=shape_off[1:])
        shape_items = np.array([d for *_, s in rows for d in s], dtype=np.uint32)
        f = {fl.name: fl.type for fl in self.schema}
        cols = [
            pa.array(np.full(n, step, np.uint32)),
            pa.array(np.full(n, rank, np.uint32)),
            pa.array(np.array([lid for lid, _, _, _ in rows], np.uint32)),
            pa.array([name for _, name, _, _ in rows], pa.string()),
            pa.array(np.array([a.size for _, _, a, _ in rows], np.uint64)),
            pa.ListArray.from_arrays(pa.array(shape_off), pa.array(shape_items), type=f["shape"]),
            pa.nulls(n, f["indices"]),
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=f["values"]),
        ]
        return pa.Table.from_arrays(cols, schema=self.schema)


def _dims(shape):
    return "x".join(map(str, shape)) if shape else "()"


def _check_path(path):
    """Refuses, before anything is recorded, a path the file could not be renamed to at the
    end: a directory, or one below a file."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory (give the path of the file to write)")
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise NotADirectoryError(f"{path}: {d} is not a directory")


def _chunks(rows):
    """Rows in groups whose values fit one List column (int32 offsets)."""
    cur, size = [], 0
    for r in rows:
        if cur and size + r[2].size > _MAX_ITEMS:
            yield cur
            cur, size = [], 0
        if r[2].size > _MAX_ITEMS:
            raise ValueError(f"layer `{r[1]}` has {r[2].size} elements, more than a row holds")
        cur.append(r)
        size += r[2].size
    if cur:
        yield cur
