"""The reader against files the Rust tools wrote, and recorded runs through gradselect and
gradallreduce checked against numpy computations of the same thing."""

import os
import tempfile
import unittest

import numpy as np
import pyarrow.parquet as pq

from gradkit import Recorder, Trace, read_step
from gradkit.merge import merge

from helpers import have_torch, run_tool


class ReaderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="gradkit-py-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.dir, name)

    def recorded(self, ranks=3, steps=3, seed=0):
        """Per-rank files of layers of uneven sizes; returns {(step, rank): flat float32}."""
        rng = np.random.default_rng(seed)
        shapes = [("a.weight", (20, 7)), ("a.bias", (20,)), ("b.weight", (5, 20)), ("b.bias", (5,))]
        flat = {}
        for r in range(ranks):
            with Recorder(self.p(f"run/rank{r}.parquet"), rank=r, world_size=ranks) as rec:
                for s in range(steps):
                    g = {n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes}
                    rec.step(g)
                    flat[(s, r)] = np.concatenate([g[n].ravel() for n, _ in shapes])
        return flat

    def test_flat_index_space_of_a_synthetic_trace(self):
        # Written by gradtrace; rebuilt here from the rows with pyarrow alone.
        path = self.p("t.parquet")
        run_tool("gradtrace", "synthetic", "--shape", "mlp", "--scale", "0.02", "--ranks", "2",
                 "--steps", "2", "--seed", "4", "-q", "-o", path)
        rows = [r for r in pq.read_table(path).to_pylist() if r["step"] == 1 and r["rank"] == 1]
        rows.sort(key=lambda r: r["layer_id"])
        want = np.concatenate([np.array(r["values"], np.float32) for r in rows])
        t = Trace(path)
        self.assertEqual(t.numel, sum(r["numel"] for r in rows))
        self.assertEqual([lay.name for lay in t.layers], [r["layer"] for r in rows])
        for lay in t.layers:
            # Python ints: UInt64 numel never turns the offsets into float64.
            self.assertIs(type(lay.offset), int)
            self.assertIs(type(lay.numel), int)
        np.testing.assert_array_equal(t.flat(1, rank=1), want)
        got = t.tensors(1, rank=1)
        for r in rows:
            self.assertEqual(got[r["layer"]].shape, tuple(r["shape"]))
        self.assertEqual(sorted(t.step(1)), [0, 1])
        c = t.coo(1, rank=1)
        self.assertEqual(c.indices.dtype, np.int64)
        np.testing.assert_array_equal(c.indices, np.flatnonzero(want))

    def test_gradselect_topk_equals_numpy(self):
        flat = self.recorded()
        merge([self.p("run/rank*.parquet")], self.p("run.parquet"))
        density = 0.05
        run_tool("gradselect", "--method", "topk", "--density", str(density), self.p("run.parquet"),
                 "-o", self.p("sel.parquet"))
        sel = Trace(self.p("sel.parquet"))
        n = sel.numel
        k = max(1, int(np.floor(density * n)))
        for r in range(3):
            residual = np.zeros(n, np.float32)
            for s in range(3):
                # Error feedback: the accumulator is the residual plus this step's gradient.
                acc = residual + flat[(s, r)]
                order = np.lexsort((np.arange(n), -np.abs(acc)))  # ties to the lower index
                top = np.sort(order[:k])
                c = sel.coo(s, rank=r)
                np.testing.assert_array_equal(c.indices, top, f"step {s} rank {r}")
                np.testing.assert_array_equal(c.values, acc[top])
                dense = sel.flat(s, rank=r)
                np.testing.assert_array_equal(np.flatnonzero(dense), top)
                residual = acc.copy()
                residual[top] = 0

    def test_gradallreduce_ring_sum_equals_numpy(self):
        flat = self.recorded(ranks=3, steps=2, seed=1)
        merge([self.p("run/rank0.parquet"), self.p("run/rank[12].parquet")], self.p("run.parquet"))
        run_tool("gradallreduce", "--algo", "ring", "--ranks", "3", self.p("run.parquet"),
                 "-o", self.p("sum.parquet"))
        out = read_step(self.p("sum.parquet"), 1)
        self.assertEqual(list(out), [0])
        want = sum(flat[(1, r)].astype(np.float64) for r in range(3))
        np.testing.assert_allclose(out[0], want, rtol=0, atol=1e-5)

    def test_merge_orders_by_step(self):
        flat = self.recorded(ranks=2, steps=3)
        merge([self.p("run/rank*.parquet")], self.p("m.parquet"))
        f = pq.ParquetFile(self.p("m.parquet"))
        self.assertEqual(f.metadata.num_row_groups, 3)
        self.assertEqual(f.schema_arrow.metadata[b"gradkit.world_size"], b"2")
        steps = f.read(columns=["step"])["step"].to_pylist()
        self.assertEqual(steps, sorted(steps))
        t = Trace(self.p("m.parquet"))
        for (s, r), want in flat.items():
            np.testing.assert_array_equal(t.flat(s, rank=r), want)

    def test_missing_step_and_file(self):
        self.recorded(ranks=1, steps=1)
        t = Trace(self.p("run/rank0.parquet"))
        with self.assertRaisesRegex(KeyError, "step 9 is not in the trace"):
            t.step(9)
        with self.assertRaisesRegex(FileNotFoundError, "nope.parquet: no such file"):
            Trace(self.p("nope.parquet"))

    @unittest.skipUnless(have_torch(), "PyTorch is not installed")
    def test_torch_tensors(self):
        import torch

        self.recorded(ranks=1, steps=1)
        t = Trace(self.p("run/rank0.parquet"))
        x = t.flat(0, torch=True)
        self.assertIsInstance(x, torch.Tensor)
        self.assertEqual(x.dtype, torch.float32)
        np.testing.assert_array_equal(x.numpy(), t.flat(0))


if __name__ == "__main__":
    unittest.main()
