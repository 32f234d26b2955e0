"""The reader against files the Rust tools wrote, and recorded runs through gradselect and
gradallreduce checked against numpy computations of the same thing."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gradkit import Recorder, Trace, read_step
from gradkit._schema import tensor_schema
from gradkit.merge import merge

from helpers import column_chunks, flipped, have_torch, run_tool, tool


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

    def read_everything(self, path):
        t = Trace(path)
        for s in t.steps:
            t.step(s)
            for r in t.ranks:
                t.flat(s, rank=r)

    def test_damaged_chunks_of_a_gradtrace_file_are_refused(self):
        # gradtrace writes a CRC-32 per column chunk in the footer (gradkit.crc32); 4 bytes
        # inverted at a random place inside a random chunk, 20 copies: every copy is refused
        # with one ValueError naming the file and the damaged chunk's row group and column.
        path = self.p("t.parquet")
        run_tool("gradtrace", "synthetic", "--shape", "mlp", "--scale", "0.02", "--ranks", "2",
                 "--steps", "3", "--seed", "4", "-q", "-o", path)
        self.assertIn(b"gradkit.crc32", pq.ParquetFile(path).metadata.metadata)
        self.read_everything(path)  # the undamaged file reads
        chunks = column_chunks(path)
        total = pq.ParquetFile(path).metadata.num_row_groups
        rng = np.random.default_rng(41)
        for i in range(20):
            g, column, start, length = chunks[rng.integers(len(chunks))]
            at = start + int(rng.integers(0, length - 4))
            q = flipped(path, self.p(f"d{i}.parquet"), at)
            want = (rf"^{re.escape(q)}: row group {g} of {total}, column `{re.escape(column)}`: "
                    r"checksum mismatch .*: the file is damaged$")
            with self.assertRaisesRegex(ValueError, want, msg=f"bytes {at}..{at + 4}"):
                self.read_everything(q)

    def test_a_damaged_checksum_key_is_refused(self):
        path = self.p("t.parquet")
        run_tool("gradtrace", "synthetic", "--shape", "mlp", "--scale", "0.02", "--ranks", "1",
                 "--steps", "2", "-q", "-o", path)
        with open(path, "rb") as f:
            data = f.read()
        value = pq.ParquetFile(path).metadata.metadata[b"gradkit.crc32"]
        at = data.rindex(value)
        for bad in (b"g", b"0"):  # not hex; hex but the wrong CRC
            damaged = bytearray(data)
            damaged[at] = bad[0] if damaged[at] != bad[0] else ord("1")
            q = self.p("bad.parquet")
            with open(q, "wb") as f:
                f.write(damaged)
            msg = ("metadata `gradkit.crc32` does not hold one checksum for each of the "
                   "file's 8 column chunks: the footer is damaged" if bad == b"g" else
                   "row group 0 of 1, column `step`: checksum mismatch")
            with self.assertRaisesRegex(ValueError, re.escape(msg)):
                self.read_everything(q)

    def test_merge_refuses_a_damaged_input_and_writes_page_checksums(self):
        self.recorded(ranks=2, steps=2)
        merged = self.p("m.parquet")
        merge([self.p("run/rank*.parquet")], merged)
        # A data page of the merged file, 4 bytes inverted in the middle of the values:
        # refused by the reader (Parquet's page CRC) and by the Rust tools.
        _, column, start, length = [c for c in column_chunks(merged) if c[1].startswith("values")][1]
        q = flipped(merged, self.p("d.parquet"), start + length // 2)
        with self.assertRaisesRegex(ValueError, rf"^{re.escape(q)}: row group 1 of 2: .*CRC"):
            self.read_everything(q)
        with self.assertRaisesRegex(ValueError, rf"^{re.escape(q)}: row group 1 of 2: "):
            merge([q], self.p("m2.parquet"))
        self.assertFalse(os.path.exists(self.p("m2.parquet")))
        p = subprocess.run([tool("gradtrace"), "inspect", q], capture_output=True, text=True)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"^error: .*d\.parquet.*\n$")

    def test_rows_that_do_not_fit_their_layer_are_refused(self):
        # Layer a has 4 elements, b 3; each file holds one bad row of layer a at step 2, rank 1.
        cases = [
            ([1, 4], [0.5, 0.25], "index 4 is not below the layer's 4 elements"),
            ([0, 2, 3], [0.5, 0.25], "3 indices but 2 values"),
            (None, [1.0] * 5, "a dense row holds 5 values, but the layer has 4 elements"),
            (None, [1.0] * 3, "a dense row holds 3 values, but the layer has 4 elements"),
        ]
        for i, (indices, values, msg) in enumerate(cases):
            path = self.p(f"bad{i}.parquet")
            rows = [(2, 1, 0, "a", 4, [4], indices, values),
                    (2, 1, 1, "b", 3, [3], None, [1.0, 2.0, 3.0])]
            cols = list(zip(*rows))
            schema = tensor_schema({})
            pq.write_table(pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, schema)], schema=schema), path)
            t = Trace(path)
            want = rf"^{re.escape(path)}: step 2, rank 1, layer `a`: {re.escape(msg)}$"
            for read in (lambda: t.coo(2, rank=1), lambda: t.flat(2, rank=1),
                         lambda: t.step(2, dense=False), lambda: t.tensors(2, rank=1)):
                with self.assertRaisesRegex(ValueError, want):
                    read()

    def merge_cli(self, *args):
        return subprocess.run([sys.executable, "-m", "gradkit.merge", *args], cwd=self.dir,
                              capture_output=True, text=True)

    def assert_refused(self, p, msg):
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, rf"^error: [^\n]*{msg}[^\n]*\n$")

    def test_merge_refuses_a_file_twice_and_overwriting_an_input(self):
        self.recorded(ranks=2, steps=2)
        os.symlink("run/rank0.parquet", self.p("link.parquet"))
        with open(self.p("run/rank1.parquet"), "rb") as f:
            rank1 = f.read()
        cases = [
            (["run/rank0.parquet", "link.parquet"], "m.parquet",
             "run/rank0.parquet and link.parquet are the same file"),
            (["run/rank*.parquet", "run/rank0*"], "m.parquet",
             "run/rank0.parquet is given twice"),
            (["run/rank0.parquet", "run/rank1.parquet"], "run/rank1.parquet",
             "-o run/rank1.parquet is the same file as the input run/rank1.parquet"),
            (["run/rank0.parquet", "run/rank1.parquet"], "link.parquet",
             "-o link.parquet is the same file as the input run/rank0.parquet"),
        ]
        path = self.p("run/rank0.parquet")
        with self.assertRaisesRegex(ValueError, re.escape(f"{path} is given twice")):
            Trace([path, path])
        for inputs, out, msg in cases:
            self.assert_refused(self.merge_cli(*inputs, "-o", out), re.escape(msg))
            self.assertFalse(os.path.exists(self.p("m.parquet")))
            with open(self.p("run/rank1.parquet"), "rb") as f:
                self.assertEqual(f.read(), rank1, "an input was overwritten")
            self.assertTrue(os.path.islink(self.p("link.parquet")))
            self.assertEqual(sorted(os.listdir(self.p("run"))), ["rank0.parquet", "rank1.parquet"])

    def test_merge_refuses_its_earlier_output_matched_by_the_glob(self):
        self.recorded(ranks=2, steps=2)
        p = self.merge_cli("run/*.parquet", "-o", "run/all.parquet")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.p("run/all.parquet"), "rb") as f:
            first = f.read()
        # Again into the same file: the glob now matches it.
        self.assert_refused(self.merge_cli("run/*.parquet", "-o", "run/all.parquet"),
                            re.escape("-o run/all.parquet is the same file as the input "
                                      "run/all.parquet"))
        with open(self.p("run/all.parquet"), "rb") as f:
            self.assertEqual(f.read(), first)
        # Into another file: its rows would be there twice.
        self.assert_refused(self.merge_cli("run/*.parquet", "-o", "all2.parquet"),
                            re.escape("step 0, rank 0 is in run/all.parquet and again in "
                                      "run/rank0.parquet"))
        self.assertFalse(os.path.exists(self.p("all2.parquet")))

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
