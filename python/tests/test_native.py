"""The native module (gradkit.Reducer, gradkit.Metrics, the transports) against gradallreduce:
one truth between online and offline, the checkpoint, and the errors a user meets.

The identity: 3 ranks under mpirun reduce their gradients step by step with `gradkit.Reducer`
(MPI backend) and record them with `gradkit.Recorder`; `gradallreduce` then runs the same
algorithm on the merged trace with in-process ranks. Every algorithm the module runs must give
bit-identical results and identical traffic counters (bytes and messages per rank, step and
phase) and reducer metrics, step by step. numpy only: no torch here (test_torch_bridge.py)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import pyarrow.parquet as pq

import gradkit
from gradkit import native
from helpers import launch, tool

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS, STEPS = 3, 7

# Options per algorithm, as Python keywords (gradallreduce's flags with `_` for `-`): the
# sparse ones at a density that keeps a few dozen entries; Ok-Topk with short periods, so
# that the run repartitions, re-evaluates and reuses thresholds within STEPS steps.
OPTIONS = {
    "ring-fp16": {},
    "topka": {"density": 0.02},
    "topkdsa": {"density": 0.02},
    "gtopk": {"density": 0.02},
    "gaussiank": {"density": 0.02, "seed": 3},
    "oktopk": {"density": 0.02, "period": 4, "reeval": 2},
    "deft": {"density": 0.02},
    "cltk": {"density": 0.02},
    "topk-union": {"k": 30, "residual": False},
}


def _is_time(metric):
    """Measurements of time (`time_comm_s`, `time_select_s`, `time_s` per phase): equal only in
    name between two runs."""
    return metric.startswith("time")


def _require_native():
    if native._native is None:
        raise AssertionError(
            f"gradkit's native module is not built: make build puts it in python/gradkit ({native._IMPORT_ERROR})"
        )


def _flags(opts):
    out = []
    for k, v in opts.items():
        if k == "residual":
            out += [] if v else ["--no-residual"]
        else:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def _metric_rows(path):
    t = pq.read_table(path).to_pylist()
    return {
        (r["step"], r["rank"], r["metric"], r.get("phase") or ""): r["value"]
        for r in t
        if not _is_time(r["metric"])
    }


def _offline_results(path):
    """gradallreduce's result, one dense row per step (sparse rows scattered into their
    layer's `numel`)."""
    rows = pq.read_table(path, columns=["step", "layer_id", "numel", "indices", "values"]).to_pylist()
    layers = {}
    for r in rows:
        layers[r["layer_id"]] = r["numel"]
    offsets, off = {}, 0
    for lid in sorted(layers):
        offsets[lid], off = off, off + layers[lid]
    steps = sorted({r["step"] for r in rows})
    out = np.zeros((len(steps), off), dtype=np.float32)
    for r in rows:
        row, base = out[steps.index(r["step"])], offsets[r["layer_id"]]
        values = np.asarray(r["values"], dtype=np.float32)
        if r["indices"] is None:
            row[base : base + values.size] = values
        else:
            row[base + np.asarray(r["indices"], dtype=np.int64)] = values
    return out


class OnlineEqualsOffline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _require_native()
        if not shutil.which("mpirun"):
            raise AssertionError("mpirun is missing (make deps installs OpenMPI)")
        cls.algos = [a for a, d in native.algorithms().items() if d["reducer"]]
        cls.dir = tempfile.mkdtemp(prefix="gradkit-online-")
        specs = [f"{a}:{json.dumps(OPTIONS.get(a, {}))}" for a in cls.algos]
        launch(["mpirun", "-np", str(RANKS), "--oversubscribe", sys.executable,
                os.path.join(HERE, "online_run.py"), cls.dir, str(STEPS), *specs],
               "online_run.py", env={"GRADKIT_COMM_TIMEOUT": os.environ.get("GRADKIT_COMM_TIMEOUT", "120")})
        cls.trace = os.path.join(cls.dir, "trace.parquet")
        subprocess.run(
            [sys.executable, "-m", "gradkit.merge", os.path.join(cls.dir, "rank*.parquet"), "-o", cls.trace],
            check=True, capture_output=True,
        )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_every_reducer_is_covered(self):
        names = set(native.algorithms())
        self.assertEqual(set(self.algos), names - {"embrace"})
        self.assertTrue(set(OPTIONS) <= names, set(OPTIONS) - names)

    def test_results_and_counters_equal_gradallreduce_step_by_step(self):
        for algo in self.algos:
            with self.subTest(algo=algo):
                out = os.path.join(self.dir, f"{algo}.offline.parquet")
                met = os.path.join(self.dir, f"{algo}.offline.metrics.parquet")
                # On the same backend (MPI): the native allreduce is MPI's own, whose order of
                # summation is MPI's.
                cmd = ["mpirun", "-np", str(RANKS), "--oversubscribe", tool("gradallreduce"), self.trace,
                       "-o", out, "--metrics", met, "--algo", algo, "--run", algo, "--quiet",
                       *_flags(OPTIONS.get(algo, {}))]
                launch(cmd, f"gradallreduce --algo {algo}", timeout=300)
                online = np.load(os.path.join(self.dir, f"{algo}.online.npy"))
                offline = _offline_results(out)
                self.assertEqual(online.shape, offline.shape)
                self.assertTrue(np.any(online != 0))
                # Bit for bit (-0.0 and NaN payloads included).
                diff = np.flatnonzero(online.view(np.uint32) != offline.view(np.uint32))
                self.assertEqual(diff.size, 0, f"{algo}: first differing element {diff[:5]}")
                mine, theirs = _metric_rows(os.path.join(self.dir, f"{algo}.metrics.parquet")), _metric_rows(met)
                self.assertEqual(sorted(set(mine) ^ set(theirs)), [], f"{algo}: rows in one file only")
                for key, v in theirs.items():
                    self.assertEqual(mine[key], v, f"{algo}: {key}")
                sent = [v for (s, r, m, ph), v in theirs.items() if m == "bytes_sent" and not ph]
                self.assertEqual(len(sent), RANKS * STEPS)

    def test_a_checkpoint_resumes_the_same_run(self):
        for algo in self.algos:
            with self.subTest(algo=algo):
                online = np.load(os.path.join(self.dir, f"{algo}.online.npy"))
                resumed = np.load(os.path.join(self.dir, f"{algo}.resumed.npy"))
                self.assertTrue(np.array_equal(online.view(np.uint32), resumed.view(np.uint32)))


class OnebitOptimizers(unittest.TestCase):
    """gradkit-train's 1-bit Adam and LAMB from Python (the engine of gradkit.torch.OnebitAdam
    and OnebitLamb), 2 ranks under mpirun, checked against numpy: the warm-up is Adam without
    bias correction on the ranks' mean gradient; after it every rank holds the same
    parameters, the variance stays frozen, and the step is w − lr·m/(√v + ε) with the
    exchanged momentum m (clip and mask off)."""

    RANKS, STEPS, FREEZE = 2, 6, 3

    @classmethod
    def setUpClass(cls):
        _require_native()
        cls.dir = tempfile.mkdtemp(prefix="gradkit-onebit-")
        launch(["mpirun", "-np", str(cls.RANKS), "--oversubscribe", sys.executable,
                os.path.join(HERE, "onebit_run.py"), cls.dir, str(cls.STEPS), str(cls.FREEZE)],
               "onebit_run.py", timeout=300)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def load(self, method):
        return [np.load(os.path.join(self.dir, f"{method}.rank{r}.npz")) for r in range(self.RANKS)]

    def test_adam_warmup_is_adam_on_the_mean_gradient(self):
        runs = self.load("onebit-adam")
        b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
        m = np.zeros_like(runs[0]["before"][0], dtype=np.float64)
        v = np.zeros_like(m)
        for step in range(self.FREEZE):
            g = np.mean([r["grad"][step].astype(np.float64) for r in runs], axis=0)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            want = runs[0]["before"][step] - lr * m / (np.sqrt(v) + eps)
            for r in runs:
                self.assertEqual(r["compressed"][step], 0.0)
                np.testing.assert_allclose(r["after"][step], want, rtol=2e-5, atol=1e-6)

    def test_compressed_steps_agree_across_ranks_with_frozen_variance(self):
        lr, eps = 0.01, 1e-8
        for method in ("onebit-adam", "onebit-lamb"):
            runs = self.load(method)
            for step in range(self.FREEZE, self.STEPS):
                with self.subTest(method=method, step=step):
                    for r in runs:
                        self.assertEqual(r["compressed"][step], 1.0)
                        np.testing.assert_array_equal(r["after"][step], runs[0]["after"][step])
                        np.testing.assert_array_equal(r["v"][step], r["v"][self.FREEZE - 1])
                    self.assertFalse(np.array_equal(runs[0]["after"][step], runs[0]["before"][step]))
                    if method == "onebit-adam":
                        r = runs[0]
                        m, v = r["m"][step].astype(np.float64), r["v"][step].astype(np.float64)
                        want = r["before"][step] - lr * m / (np.sqrt(v) + eps)
                        np.testing.assert_allclose(r["after"][step], want, rtol=2e-5, atol=1e-6)


class StalledPeer(unittest.TestCase):
    def test_a_rank_that_stops_answering_fails_the_others_within_the_timeout(self):
        _require_native()
        p = launch(["mpirun", "-np", "2", "--oversubscribe", sys.executable, os.path.join(HERE, "stall_run.py")],
                   "stall_run.py", env={"GRADKIT_COMM_TIMEOUT": "3"}, timeout=300, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("raised after", p.stdout, p.stderr)
        self.assertIn("rank 1", p.stdout)
        waited = float(p.stdout.split("raised after ")[1].split(" s")[0])
        self.assertGreaterEqual(waited, 3.0)


class Loopback:
    """A transport for a world of one rank: it never carries a message."""

    def exchange(self, tag, sends, srcs):
        raise AssertionError("a world of one rank sent a message")

    def barrier(self):
        pass

    def allreduce(self, data, dtype):
        return data


def _one_rank():
    return native._lib().Comm.transport(Loopback(), 0, 1, "loopback")


class Errors(unittest.TestCase):
    """Each user mistake is one exception naming the argument."""

    @classmethod
    def setUpClass(cls):
        _require_native()
        cls.comm = _one_rank()
        cls.layers = [("w", (4, 5)), ("b", (4,))]

    def err(self, exc, fn, *words):
        with self.assertRaises(exc) as cm:
            fn()
        for w in words:
            self.assertIn(w, str(cm.exception))
        return str(cm.exception)

    def test_unknown_algorithm_lists_the_known(self):
        self.err(ValueError, lambda: gradkit.Reducer("oktop", self.comm, self.layers), "oktop", "oktopk", "ring")

    def test_an_option_the_algorithm_does_not_read(self):
        self.err(ValueError, lambda: gradkit.Reducer("topka", self.comm, self.layers, period=4), "period", "oktopk", "topka")
        self.err(ValueError, lambda: gradkit.Reducer("ring", self.comm, self.layers, density=0.1), "density", "topka")
        self.err(ValueError, lambda: gradkit.Reducer("ring", self.comm, self.layers, colour=1), "colour")

    def test_bad_values_name_the_option(self):
        self.err(ValueError, lambda: gradkit.Reducer("topka", self.comm, self.layers, density=2.0), "density")
        self.err(ValueError, lambda: gradkit.Reducer("oktopk", self.comm, self.layers, period=0), "period")
        self.err(ValueError, lambda: gradkit.Reducer("oktopk", self.comm, self.layers, balance="often"), "balance", "often")
        self.err(ValueError, lambda: gradkit.Reducer("embrace", self.comm, self.layers), "embrace", "gradallreduce")

    def test_arrays_that_would_copy_silently_are_refused(self):
        r = gradkit.Reducer("ring", self.comm, self.layers)
        self.err(ValueError, lambda: r.reduce(np.zeros(24, dtype=np.float64)), "grad", "float32")
        self.err(ValueError, lambda: r.reduce(np.zeros(48, dtype=np.float32)[::2]), "grad", "contiguous")
        self.err(ValueError, lambda: r.reduce(np.zeros(25, dtype=np.float32)), "grad", "25", "24")
        ro = np.zeros(24, dtype=np.float32)
        ro.flags.writeable = False
        self.err(ValueError, lambda: r.reduce(np.zeros(24, dtype=np.float32), out=ro), "out", "read-only")

    def test_a_state_of_another_world_is_refused(self):
        r = gradkit.Reducer("topka", self.comm, self.layers, density=0.25)
        r.reduce(np.arange(24, dtype=np.float32))
        state = r.state_dict()
        self.assertIn("residual", " ".join(state["tensors"]))
        state["world_size"] = 4
        self.err(ValueError, lambda: r.load_state_dict(state), "world_size", "4")

    def test_every_write_of_the_metrics_holds_every_row_so_far(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.parquet")
            m = gradkit.Metrics(path, self.comm, "run-a", algo="topka")
            r = gradkit.Reducer("topka", self.comm, self.layers, density=0.25, metrics=m)
            r.reduce(np.arange(24, dtype=np.float32))
            m.add("loss", 2.5, 0)
            m.write()
            self.assertEqual(len(m), 0)
            first = pq.read_table(path).to_pylist()
            r.reduce(np.arange(24, dtype=np.float32))
            m.add("loss", 1.5, 1)
            m.write()
            rows = pq.read_table(path).to_pylist()
        self.assertEqual(rows[: len(first)], first)
        self.assertEqual(len(rows), 2 * len(first))
        self.assertEqual([(x["step"], x["value"]) for x in rows if x["metric"] == "loss"], [(0, 2.5), (1, 1.5)])
        self.assertEqual({x["algo"] for x in rows}, {"topka"})

    def test_one_rank_reduces_to_its_own_gradient(self):
        g = np.random.default_rng(0).standard_normal(24).astype(np.float32)
        for algo in ("ring", "tree", "native"):
            out = gradkit.Reducer(algo, self.comm, self.layers).reduce(g)
            self.assertTrue(np.array_equal(out, g), algo)
        # In place: out is grad.
        h = g.copy()
        gradkit.Reducer("ring", self.comm, self.layers, op="mean").reduce(h, out=h)
        self.assertTrue(np.array_equal(h, g))


if __name__ == "__main__":
    unittest.main()
