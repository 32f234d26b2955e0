"""Reading `tensor/1` traces back as numpy arrays or torch tensors (docs/FORMAT.md)."""

import glob
import os
from collections import namedtuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import _checksum
from ._checksum import KEY
from ._schema import SCHEMA_KEY, TENSOR

Layer = namedtuple("Layer", "layer_id name numel shape offset")
Layer.__doc__ = """One layer: `numel` and `offset` (its first position in the flat index space,
the sum of `numel` over the layers with a smaller `layer_id`) are Python ints."""

Coo = namedtuple("Coo", "indices values numel")
Coo.__doc__ = """A sparse vector: int64 `indices` (ascending), float32 `values`, its length."""


def _files(paths):
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        p = os.fspath(p)
        hits = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        if not hits:
            raise FileNotFoundError(f"{p}: no file matches")
        for h in hits:
            if not os.path.isfile(h):
                raise FileNotFoundError(f"{h}: no such file")
        out.extend(hits)
    if not out:
        raise ValueError("no trace file given")
    seen = {}
    for i, f in enumerate(out):
        st = os.stat(f)
        j = seen.setdefault((st.st_dev, st.st_ino), i)
        if j != i:
            first = out[j]
            what = f"{f} is given twice" if first == f else f"{first} and {f} are the same file"
            raise ValueError(f"{what}: give each file once (two paths, a symlink or two "
                             "globs lead to it)")
    return out


# The columns read for the layer table when a trace is opened.
_KEY_COLUMNS = ["step", "rank", "layer_id", "layer", "numel", "shape"]


def _stat_range(rg, column):
    """(min, max) of a column's statistics in row group `rg`, or None where it has none."""
    st = rg.column(column).statistics
    if st is None or not st.has_min_max:
        return None
    return st.min, st.max


class _Source:
    """One file of a trace: its footer, its chunks' checksums (checked before a row group's
    rows are used, each chunk once) and the step and rank range of each row group."""

    def __init__(self, path):
        self.path = path
        pf = _checksum.open_file(path)
        self.metadata = pf.metadata
        self.schema = pf.schema_arrow
        self.sums = _checksum.of(path, self.metadata)
        leaf = {self.metadata.schema.column(c).path: c for c in range(self.metadata.num_columns)}
        self._ranges = []
        for g in range(self.metadata.num_row_groups):
            rg = self.metadata.row_group(g)
            self._ranges.append(tuple(
                _stat_range(rg, leaf[name]) if name in leaf else None for name in ("step", "rank")))

    def groups(self, step, rank=None):
        """The row groups whose statistics do not exclude `step` (and `rank`)."""
        def may_hold(r, v):
            return v is None or r is None or r[0] <= v <= r[1]
        return [g for g, (s, r) in enumerate(self._ranges) if may_hold(s, step) and may_hold(r, rank)]

    def read(self, groups, columns=None):
        """Row groups `groups` (all columns, or `columns`), their chunks checked first."""
        groups = list(groups)
        if self.sums is not None:
            self.sums.verify(groups, None if columns is None else self.sums.columns_of(columns))
        pf = _checksum.open_file(self.path, self.metadata)
        try:
            return pf.read_row_groups(groups, columns=columns, use_threads=False)
        except (OSError, pa.ArrowException):
            pass
        # Name the row group that fails: read them again one by one.
        n = self.metadata.num_row_groups
        for g in groups:
            try:
                pf.read_row_group(g, columns=columns, use_threads=False)
            except (OSError, pa.ArrowException) as e:
                raise ValueError(f"{self.path}: row group {g} of {n}: {e}") from e
        return pf.read_row_groups(groups, columns=columns, use_threads=False)


def _claim_steps(f, t, owner):
    """Refuses a (step, rank) that an earlier file of the trace holds too."""
    pairs = t.group_by(["step", "rank"], use_threads=False).aggregate([])
    for s, r in zip(pairs["step"].to_pylist(), pairs["rank"].to_pylist()):
        first = owner.setdefault((s, r), f)
        if first != f:
            raise ValueError(
                f"step {s}, rank {r} is in {first} and again in {f}: each (step, rank) belongs "
                "in one file (an earlier merged output matched by a glob?)"
            )


def _collect_layers(f, t, by_id):
    """Adds the layers of file `f` (its rows `t`) to `by_id` (layer_id → (name, numel)),
    refusing a layer_id that names two layers or two sizes."""
    firsts = t.group_by(["layer_id"], use_threads=False).aggregate(
        [("layer", "min"), ("layer", "max"), ("numel", "min"), ("numel", "max")]
    )
    for lid, lo, hi, nlo, nhi in zip(*(firsts[c].to_pylist() for c in (
            "layer_id", "layer_min", "layer_max", "numel_min", "numel_max"))):
        if lo != hi or nlo != nhi:
            raise ValueError(f"{f}: layer_id {lid} names two layers or two sizes")
        known = by_id.setdefault(lid, (lo, int(nlo)))
        if known != (lo, int(nlo)):
            raise ValueError(
                f"{f}: layer_id {lid} is `{lo}` ({nlo} elements) here but "
                f"`{known[0]}` ({known[1]} elements) in an earlier file"
            )


def _to_torch(a):
    try:
        import torch
    except ImportError as e:
        raise ImportError("torch=True needs PyTorch (pip install torch)") from e
    return torch.from_numpy(a)


class Trace:
    """A `tensor/1` trace in one file or several (one per rank: a list or a glob such as
    `run/rank*.parquet`). Nothing but the layer table is read until a step is asked for.

    t = Trace("run/rank*.parquet")
    t.steps, t.ranks, t.layers, t.numel      # numel: length of the flat index space
    t.flat(3, rank=1)                        # float32, every layer at its offset
    t.coo(3, rank=1)                         # Coo(int64 indices, float32 values, numel)
    t.tensors(3, rank=1)                     # {layer: array of its shape}
    t.step(3)                                # {rank: flat}; dense=False → {rank: Coo}
    """

    def __init__(self, paths):
        self.files = _files(paths)
        self.metadata = {}
        self._sources = {}
        by_id, steps, ranks, shapes, owner = {}, set(), set(), {}, {}
        for f in self.files:
            src = self._sources[f] = _Source(f)
            meta = {k.decode(): v.decode() for k, v in (src.schema.metadata or {}).items()}
            schema = meta.get(SCHEMA_KEY, TENSOR)
            if schema != TENSOR:
                raise ValueError(f"{f}: file holds `{schema}` but `{TENSOR}` is expected here")
            for k, v in meta.items():
                if k.startswith("gradkit.") and k != KEY:
                    self.metadata.setdefault(k, v)
            t = src.read(range(src.metadata.num_row_groups), _KEY_COLUMNS)
            steps.update(pc.unique(t["step"]).to_pylist())
            ranks.update(pc.unique(t["rank"]).to_pylist())
            _claim_steps(f, t, owner)
            _collect_layers(f, t, by_id)
            for lid, shape in zip(t["layer_id"].to_pylist(), t["shape"].to_pylist()):
                if shape is not None:
                    shapes.setdefault(lid, tuple(shape))
        self.layers = []
        offset = 0
        for lid in sorted(by_id):
            name, numel = by_id[lid]
            shape = shapes.get(lid, (numel,))
            self.layers.append(Layer(lid, name, numel, shape, offset))
            # Python ints: numel is UInt64, and numpy promotes uint64 + int to float64.
            offset += numel
        self.numel = offset
        self.steps = sorted(steps)
        self.ranks = sorted(ranks)
        self._by_id = {lay.layer_id: lay for lay in self.layers}

    @property
    def world_size(self):
        """`gradkit.world_size` of the (first) file, else the number of ranks present."""
        ws = self.metadata.get("gradkit.world_size")
        return int(ws) if ws is not None else len(self.ranks)

    def _rows(self, step, rank=None):
        """[(file, rows)] of one step (and rank): only the row groups whose statistics do not
        exclude it are read, each checked against the file's checksums first."""
        expr = pc.field("step") == step
        if rank is not None:
            expr = expr & (pc.field("rank") == rank)
        parts = []
        for f in self.files:
            src = self._sources[f]
            groups = src.groups(step, rank)
            if groups:
                t = src.read(groups).filter(expr)
                if t.num_rows:
                    parts.append((f, t))
        if not parts:
            what = f"step {step}" + ("" if rank is None else f", rank {rank}")
            raise KeyError(f"{what} is not in the trace (steps {_span(self.steps)}, "
                           f"ranks {_span(self.ranks)})")
        return parts

    def _by_rank(self, parts, step):
        """{rank: [(layer, indices or None, values)]}, each list in layer_id order; a row
        whose positions do not fit its layer is refused."""
        out = {}
        for f, t in parts:
            for rank, lay, indices, values in self._split(t):
                _check_row(f, step, rank, lay, indices, values)
                out.setdefault(rank, []).append((lay, indices, values))
        for rank, rows in out.items():
            rows.sort(key=lambda r: r[0].layer_id)
            ids = [r[0].layer_id for r in rows]
            if len(set(ids)) != len(ids):
                raise ValueError(f"rank {rank}: a layer appears twice in one step")
        return out

    def _split(self, t):
        """(rank, layer, indices or None, values) of each row of `t`."""
        ranks = t["rank"].to_numpy()
        lids = t["layer_id"].to_numpy()
        vals = t["values"].combine_chunks()
        idx = t["indices"].combine_chunks()
        v_off, v_all = vals.offsets.to_numpy(), vals.values.to_numpy(zero_copy_only=False)
        i_null = idx.is_null().to_numpy(zero_copy_only=False)
        i_off = idx.offsets.to_numpy()
        i_all = idx.values.to_numpy(zero_copy_only=False)
        for row in range(t.num_rows):
            lay = self._by_id[int(lids[row])]
            values = v_all[v_off[row]:v_off[row + 1]]
            indices = None if i_null[row] else i_all[i_off[row]:i_off[row + 1]]
            yield int(ranks[row]), lay, indices, values

    def _flat(self, rows):
        out = np.zeros(self.numel, dtype=np.float32)
        for lay, indices, values in rows:
            if indices is None:
                out[lay.offset:lay.offset + lay.numel] = values
            else:
                out[lay.offset + indices.astype(np.int64)] = values
        return out

    def _coo(self, rows):
        idx, val = [], []
        for lay, indices, values in rows:
            if indices is None:
                nz = np.flatnonzero(values)
                idx.append(lay.offset + nz.astype(np.int64))
                val.append(values[nz])
            else:
                idx.append(lay.offset + indices.astype(np.int64))
                val.append(values)
        i = np.concatenate(idx) if idx else np.zeros(0, np.int64)
        v = np.concatenate(val).astype(np.float32, copy=False) if val else np.zeros(0, np.float32)
        return Coo(i, v, self.numel)

    def flat(self, step, rank=0, *, torch=False):
        """The dense flat vector of one (step, rank): float32 of length `numel`; a sparse
        row's absent positions are zeros, a layer the rank lacks is zeros."""
        a = self._flat(self._by_rank(self._rows(step, rank), step)[rank])
        return _to_torch(a) if torch else a

    def coo(self, step, rank=0, *, torch=False):
        """One (step, rank) as COO over the flat index space (a dense row's zeros left out)."""
        c = self._coo(self._by_rank(self._rows(step, rank), step)[rank])
        if torch:
            return Coo(_to_torch(c.indices), _to_torch(c.values), c.numel)
        return c

    def tensors(self, step, rank=0, *, torch=False):
        """{layer name: dense array of the layer's shape} for one (step, rank)."""
        out = {}
        for lay, indices, values in self._by_rank(self._rows(step, rank), step)[rank]:
            a = np.zeros(lay.numel, dtype=np.float32)
            if indices is None:
                a[:] = values
            else:
                a[indices.astype(np.int64)] = values
            a = a.reshape(lay.shape)
            out[lay.name] = _to_torch(a) if torch else a
        return out

    def step(self, step, *, dense=True, torch=False):
        """{rank: tensor} for every rank of one step: the flat dense vector, or a Coo with
        `dense=False`."""
        out = {}
        for rank, rows in sorted(self._by_rank(self._rows(step), step).items()):
            if dense:
                a = self._flat(rows)
                out[rank] = _to_torch(a) if torch else a
            else:
                c = self._coo(rows)
                out[rank] = Coo(_to_torch(c.indices), _to_torch(c.values), c.numel) if torch else c
        return out

    def __repr__(self):
        return (f"Trace({len(self.files)} file(s), steps {_span(self.steps)}, ranks "
                f"{_span(self.ranks)}, {len(self.layers)} layers, numel {self.numel})")


def _check_row(f, step, rank, lay, indices, values):
    """Refuses a row whose values do not fill its layer (dense) or whose indices are not
    positions in it (sparse): they would land in another layer, or past the flat space."""
    where = f"{f}: step {step}, rank {rank}, layer `{lay.name}`"
    if indices is None:
        if len(values) != lay.numel:
            raise ValueError(f"{where}: a dense row holds {len(values)} values, "
                             f"but the layer has {lay.numel} elements")
        return
    if len(indices) != len(values):
        raise ValueError(f"{where}: {len(indices)} indices but {len(values)} values")
    if len(indices) and int(indices.max()) >= lay.numel:
        raise ValueError(f"{where}: index {int(indices.max())} is not below the layer's "
                         f"{lay.numel} elements")


def _span(v):
    if not v:
        return "none"
    return f"{v[0]}..{v[-1]}" if len(v) > 1 else f"{v[0]}"


def read_step(paths, step, *, dense=True, torch=False):
    """{rank: flat tensor} (or {rank: Coo}) of one step of a trace: `Trace(paths).step(...)`."""
    return Trace(paths).step(step, dense=dense, torch=torch)
