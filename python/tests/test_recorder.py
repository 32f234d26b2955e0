"""The Recorder writes tensor/1 files that pyarrow (read here without gradkit's reader) and
the Rust tools accept, and an error leaves nothing behind."""

import glob
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import gradkit
from gradkit import Recorder, Trace, strip_wrappers

from helpers import column_chunks, flipped, run_tool, tool

# A child process that records one step and waits to be killed.
CHILD = """
import signal, sys, time
import numpy as np
from gradkit import Recorder

own = sys.argv[2] == "own"
if own:
    def handler(signum, frame):
        pass
    signal.signal(signal.SIGTERM, handler)
rec = Recorder(sys.argv[1])
rec.step({"w": np.ones(3, np.float32)})
print("kept" if own and signal.getsignal(signal.SIGTERM) is handler else "ready", flush=True)
if not own:
    time.sleep(600)
"""


def default_signals():
    """In the child: SIGTERM and SIGHUP at their default action. A process started under
    `nohup` (or by a runner that ignores SIGHUP) passes SIG_IGN on, and the Recorder rightly
    leaves an ignored signal alone: the child would then sleep through the test's SIGHUP."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


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
        # Hidden until complete: neither a glob nor ls shows it.
        self.assertEqual(glob.glob(os.path.join(self.dir, "*")), [])
        self.assertEqual(len(glob.glob(os.path.join(self.dir, ".r.parquet.tmp-*"))), 1)
        rec.close()
        self.assertEqual(os.listdir(self.dir), ["r.parquet"])

    def child(self, path, mode):
        env = dict(os.environ)
        package = os.path.dirname(os.path.dirname(gradkit.__file__))
        env["PYTHONPATH"] = os.pathsep.join([package, env.get("PYTHONPATH", "")])
        return subprocess.Popen([sys.executable, "-c", CHILD, path, mode], env=env,
                                stdout=subprocess.PIPE, text=True, preexec_fn=default_signals)

    def test_a_signal_leaves_no_temporary_file(self):
        for sig in (signal.SIGTERM, signal.SIGHUP):
            path = os.path.join(self.dir, "r.parquet")
            p = self.child(path, "default")
            self.assertEqual(p.stdout.readline(), "ready\n")
            self.assertEqual(len(os.listdir(self.dir)), 1)  # the temporary file
            p.send_signal(sig)
            p.wait(timeout=120)
            p.stdout.close()
            self.assertEqual(p.returncode, -sig, "the process ends as the signal says")
            self.assertEqual(os.listdir(self.dir), [], sig)
        # A program with its own handler keeps it.
        p = self.child(os.path.join(self.dir, "own.parquet"), "own")
        self.assertEqual(p.communicate(timeout=120)[0], "kept\n")

    def test_a_damaged_data_page_is_refused_by_the_reader_and_the_tools(self):
        path = os.path.join(self.dir, "r.parquet")
        rng = np.random.default_rng(5)
        with Recorder(path) as rec:
            for _ in range(2):
                rec.step({"w": rng.standard_normal(5000).astype(np.float32)})
        # 4 bytes inverted in the middle of step 1's values: inside a data page, which
        # carries a CRC (pyarrow's write_page_checksum).
        _, _, start, length = [c for c in column_chunks(path) if c[1].startswith("values")][1]
        q = flipped(path, os.path.join(self.dir, "d.parquet"), start + length // 2)
        np.testing.assert_array_equal(Trace(q).flat(0), Trace(path).flat(0))
        with self.assertRaisesRegex(ValueError, r"d\.parquet: row group 1 of 2: .*CRC"):
            Trace(q).flat(1)
        out = os.path.join(self.dir, "sum.parquet")
        for args in (["gradtrace", "inspect", q],
                     ["gradallreduce", "--algo", "ring", "--ranks", "1", q, "-o", out]):
            p = subprocess.run([tool(args[0]), *args[1:]], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1, args)
            self.assertRegex(p.stderr, r"^error: .*d\.parquet: row group 1 of 2.*CRC.*\n$")
            self.assertFalse(os.path.exists(out))

    def test_a_path_that_cannot_take_the_file_is_refused_at_once(self):
        with self.assertRaisesRegex(IsADirectoryError, "is a directory"):
            Recorder(self.dir)
        blocker = os.path.join(self.dir, "file")
        with open(blocker, "w") as f:
            f.write("x")
        for path in (os.path.join(blocker, "r.parquet"), os.path.join(blocker, "a", "r.parquet")):
            with self.assertRaisesRegex(NotADirectoryError, f"{blocker} is not a directory"):
                Recorder(path)
        self.assertEqual(os.listdir(self.dir), ["file"])

    def test_reserved_metadata_keys_are_refused(self):
        path = os.path.join(self.dir, "r.parquet")
        for key in ("schema", "gradkit.schema", "producer", "world_size", "gradkit.method",
                    "crc32"):
            with self.assertRaisesRegex(ValueError, f"metadata key `{key}` is reserved"):
                Recorder(path, metadata={key: "x"})
        self.assertEqual(os.listdir(self.dir), [])
        with Recorder(path, metadata={"lr": 0.1}) as rec:
            rec.step({"w": np.ones(2)})
        self.assertEqual(pq.read_schema(path).metadata[b"gradkit.lr"], b"0.1")

    def test_bad_input_is_refused_by_name(self):
        path = os.path.join(self.dir, "r.parquet")
        cases = [
            ([{"a": np.ones(3)}, {"a": np.ones(4)}], "layer `a` has 4 elements, 3"),
            ([{"a": np.ones((4, 3))}, {"a": np.ones((3, 4))}],
             "step 1: layer `a` has shape 3x4, 4x3 in the first recorded step"),
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
