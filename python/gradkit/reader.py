"""Reading `tensor/1` traces back as numpy arrays or torch tensors (docs/FORMAT.md)."""

import glob
import os
from collections import namedtuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
    return out


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
        by_id, steps, ranks, shapes = {}, set(), set(), {}
        for f in self.files:
            pf = pq.ParquetFile(f)
            meta = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
            schema = meta.get(SCHEMA_KEY, TENSOR)
            if schema != TENSOR:
                raise ValueError(f"{f}: file holds `{schema}` but `{TENSOR}` is expected here")
            for k, v in meta.items():
                if k.startswith("gradkit."):
                    self.metadata.setdefault(k, v)
            t = pf.read(columns=["step", "rank", "layer_id", "layer", "numel", "shape"])
            steps.update(pc.unique(t["step"]).to_pylist())
            ranks.update(pc.unique(t["rank"]).to_pylist())
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
        """The rows of one step (and rank), read row group by row group where the row
        groups' statistics exclude the others."""
        expr = pc.field("step") == step
        if rank is not None:
            expr = expr & (pc.field("rank") == rank)
        parts = [pq.read_table(f, filters=expr) for f in self.files]
        t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if t.num_rows == 0:
            what = f"step {step}" + ("" if rank is None else f", rank {rank}")
            raise KeyError(f"{what} is not in the trace (steps {_span(self.steps)}, "
                           f"ranks {_span(self.ranks)})")
        return t

    def _by_rank(self, t):
        """{rank: [(layer, indices or None, values)]}, each list in layer_id order."""
        out = {}
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
            out.setdefault(int(ranks[row]), []).append((lay, indices, values))
        for rank, rows in out.items():
            rows.sort(key=lambda r: r[0].layer_id)
            ids = [r[0].layer_id for r in rows]
            if len(set(ids)) != len(ids):
                raise ValueError(f"rank {rank}: a layer appears twice in one step")
        return out

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
        a = self._flat(self._by_rank(self._rows(step, rank))[rank])
        return _to_torch(a) if torch else a

    def coo(self, step, rank=0, *, torch=False):
        """One (step, rank) as COO over the flat index space (a dense row's zeros left out)."""
        c = self._coo(self._by_rank(self._rows(step, rank))[rank])
        if torch:
            return Coo(_to_torch(c.indices), _to_torch(c.values), c.numel)
        return c

    def tensors(self, step, rank=0, *, torch=False):
        """{layer name: dense array of the layer's shape} for one (step, rank)."""
        out = {}
        for lay, indices, values in self._by_rank(self._rows(step, rank))[rank]:
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
        for rank, rows in sorted(self._by_rank(self._rows(step)).items()):
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


def _span(v):
    if not v:
        return "none"
    return f"{v[0]}..{v[-1]}" if len(v) > 1 else f"{v[0]}"


def read_step(paths, step, *, dense=True, torch=False):
    """{rank: flat tensor} (or {rank: Coo}) of one step of a trace: `Trace(paths).step(...)`."""
    return Trace(paths).step(step, dense=dense, torch=torch)
