"""The Recorder writes tensor/1 files that pyarrow (read here without gradkit's reader) and
the Rust tools accept, and an error leaves nothing behind."""

import glob
import os
import tempfile
import unittest

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gradkit import Recorder, strip_wrappers

from helpers import run_tool


def grads(rng, step):
    return {
        "module.fc1.weight": rng.standard_normal((8, 5)),  # float64: rounded to float32
        "module.fc1.bias": rng.standard_normal(8).astype(np.float16),
        "module.fc2.weight": rng.standard_normal((3, 8)).astype(np.float32),
    }


class RecorderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="gradkit-py-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def record(self, path, ranks=2, steps=3, seed=0):
        rng = np.random.default_rng(seed)
        given = {}
        for r in range(ranks):
            with Recorder(path.format(r=r), rank=r, world_size=ranks) as rec:
                for s in range(steps):
                    g = grads(rng, s)
                    rec.step(g)
                    given[(s, r)] = g
        return given

    def test_file_is_tensor1_with_one_row_group_per_step(self):
        path = os.path.join(self.dir, "a", "b", "rank{r}.parquet")  # directories made
        given = self.record(path)
        f = pq.ParquetFile(path.format(r=1))
        schema = f.schema_arrow
        self.assertEqual(schema.metadata[b"gradkit.schema"], b"tensor/1")
        self.assertEqual(schema.metadata[b"gradkit.world_size"], b"2")
        self.assertEqual(schema.metadata[b"gradkit.method"], b"record")
        expect = {"step": pa.uint32(), "rank": pa.uint32(), "layer_id": pa.uint32(),
                  "layer": pa.string(), "numel": pa.uint64()}
        for name, typ in expect.items():
            self.assertEqual(schema.field(name).type, typ, name)
        self.assertEqual(schema.field("values").type.value_type, pa.float32())
        self.assertEqual(schema.field("indices").type.value_type, pa.uint32())
        self.assertEqual(f.metadata.num_row_groups, 3)
        for i in range(3):
            steps = f.read_row_group(i, columns=["step"])["step"].to_pylist()
            self.assertEqual(set(steps), {i})
        t = pq.read_table(path.format(r=1)).to_pylist()
        self.assertEqual([r["layer"] for r in t[:3]], ["fc1.weight", "fc1.bias", "fc2.weight"])
        self.assertEqual([r["layer_id"] for r in t[:3]], [0, 1, 2])
        for row in t:
            self.assertEqual(row["rank"], 1)
            self.assertIsNone(row["indices"])
            g = given[(row["step"], 1)]["module." + row["layer"]]
            self.assertEqual(row["shape"], list(g.shape))
            self.assertEqual(row["numel"], g.size)
            want = np.asarray(g, dtype=np.float64).astype(np.float32).ravel()
            np.testing.assert_array_equal(np.array(row["values"], np.float32), want)

    def test_tools_accept_it(self):
        path = os.path.join(self.dir, "rank{r}.parquet")
        self.record(path)
        out = run_tool("gradtrace", "inspect", path.format(r=0), "--format", "csv")
        self.assertIn("fc1.weight,8x5,40,3,3,1", out)
        merged = os.path.join(self.dir, "all.parquet")
        run_tool("gradtrace", "cat", path.format(r=0), path.format(r=1), "-o", merged)
        self.assertEqual(pq.read_schema(merged).metadata[b"gradkit.world_size"], b"2")

    def test_error_in_the_block_leaves_nothing(self):
        path = os.path.join(self.dir, "sub", "r.parquet")
        with self.assertRaises(RuntimeError):
            with Recorder(path) as rec:
                rec.step({"w": np.ones(3, np.float32)})
                raise RuntimeError("training failed")
        self.assertEqual(os.listdir(os.path.dirname(path)), [])

    def test_file_appears_only_on_close(self):
        path = os.path.join(self.dir, "r.parquet")
        rec = Recorder(path)
        rec.step({"w": np.ones(3, np.float32)})
        self.assertFalse(os.path.exists(path))
        self.assertEqual(len(glob.glob(path + ".tmp-*")), 1)
        rec.close()
        self.assertEqual(os.listdir(self.dir), ["r.parquet"])

    def test_bad_input_is_refused_by_name(self):
        path = os.path.join(self.dir, "r.parquet")
        cases = [
            ([{"a": np.ones(3)}, {"a": np.ones(4)}], "layer `a` has 4 elements, 3"),
            ([{"a": np.ones(3)}, {"b": np.ones(3)}], "layer `b` was not in the first"),
            ([{"a": np.ones(3), "b": np.ones(1)}, {"a": np.ones(3)}], "no gradient for layer(s) b"),
            ([{"a": np.array([1.0, np.nan])}], "layer `a` holds NaN or Inf"),
            ([{"a": np.arange(3)}], "layer `a` at step 0: dtype int64 is not a float type"),
            ([{}], "no gradients to record"),
        ]
        for steps, msg in cases:
            with self.assertRaises((ValueError, TypeError)) as cm:
                with Recorder(path) as rec:
                    for s in steps:
                        rec.step(s)
            self.assertIn(msg, str(cm.exception))
            self.assertEqual(os.listdir(self.dir), [], msg)
        with self.assertRaises(ValueError):
            Recorder(path, rank=2, world_size=2)
        with Recorder(path) as rec:
            rec.step({"a": np.ones(2)}, step=5)
            with self.assertRaisesRegex(ValueError, "step 5 of rank 0 is already recorded"):
                rec.step({"a": np.ones(2)}, step=5)
            self.assertEqual(rec.step({"a": np.ones(2)}), 6)

    def test_wrapper_prefixes(self):
        self.assertEqual(strip_wrappers("module.fc1.weight"), "fc1.weight")
        self.assertEqual(strip_wrappers("_orig_mod.module.enc.w"), "enc.w")
        self.assertEqual(strip_wrappers("encoder.module.w"), "encoder.module.w")

    def test_several_ranks_in_one_file(self):
        path = os.path.join(self.dir, "all.parquet")
        rng = np.random.default_rng(3)
        with Recorder(path, world_size=3) as rec:
            for s in range(2):
                for r in range(3):
                    rec.step({"w": rng.standard_normal(4)}, rank=r)
        t = pq.read_table(path)
        self.assertEqual(sorted(set(zip(t["step"].to_pylist(), t["rank"].to_pylist()))),
                         [(s, r) for s in range(2) for r in range(3)])
        run_tool("gradtrace", "inspect", path)


if __name__ == "__main__":
    unittest.main()
