"""gradkit's reducers inside PyTorch (gradkit.torch): the torch.distributed transport passes
gradkit_comm's conformance suite, the DDP hook's result equals gradallreduce's on the
gradients it recorded (bit for bit, with the same traffic counters), a checkpoint resumes
the same run, and mistakes raise one exception naming the argument.

Needs torch: `make test-torch` runs these in a venv of their own (.venv-torch); elsewhere
they skip, saying why. Two ranks under torchrun, gloo on the CPU."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from helpers import have_torch, launch, tool
from test_native import OPTIONS, _flags, _metric_rows, _offline_results, _require_native

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS, STEPS = 2, 6
NO_TORCH = "torch is not installed in this Python: `make test-torch` runs these tests in .venv-torch"


@unittest.skipUnless(have_torch(), NO_TORCH)
class DdpHook(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _require_native()
        from gradkit import native

        # Every reducer but `native`, whose sum is the backend's own (gloo's order here, the
        # in-process threads' offline): the MPI test covers it on one backend.
        cls.native = native
        cls.algos = [a for a, d in native.algorithms().items() if d["reducer"] and a != "native"]
        cls.dir = tempfile.mkdtemp(prefix="gradkit-torch-")
        specs = [f"{a}:{json.dumps(OPTIONS.get(a, {}))}" for a in cls.algos]
        launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS), "--standalone",
                os.path.join(HERE, "torch_run.py"), cls.dir, str(STEPS), *specs],
               "torchrun torch_run.py", env={"OMP_NUM_THREADS": "1"}, timeout=900)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_the_transport_passes_the_conformance_suite(self):
        with open(os.path.join(self.dir, "conformance.json")) as f:
            checks = json.load(f)
        for name in ("exchange_raw_every_kind", "exchange_counts_traffic", "exchange_errors",
                     "collective_counts", "allreduce_native", "large_message"):
            self.assertIn(name, checks)

    def test_the_hook_equals_gradallreduce_on_its_recording(self):
        for algo in self.algos:
            with self.subTest(algo=algo):
                trace = os.path.join(self.dir, f"{algo}.trace.parquet")
                subprocess.run([sys.executable, "-m", "gradkit.merge",
                                os.path.join(self.dir, algo, "bucket0", "rank*.parquet"), "-o", trace],
                               check=True, capture_output=True)
                out, met = (os.path.join(self.dir, f"{algo}.offline{x}.parquet") for x in ("", ".metrics"))
                opts = dict(OPTIONS.get(algo, {}))
                if "op" in self.native.algorithms()[algo]["options"]:
                    opts.setdefault("op", "mean")  # the hook's default: DDP averages
                launch([tool("gradallreduce"), trace, "-o", out, "--metrics", met, "--algo", algo,
                        "--ranks", str(RANKS), "--run", algo, "--quiet", *_flags(opts)], f"gradallreduce --algo {algo}")
                online = np.load(os.path.join(self.dir, f"{algo}.online.npy"))
                offline = _offline_results(out)
                self.assertEqual(online.shape, offline.shape)
                self.assertTrue(np.array_equal(online.view(np.uint32), offline.view(np.uint32)), algo)
                mine = {k: v for k, v in _metric_rows(os.path.join(self.dir, f"{algo}.metrics.parquet")).items()
                        if k[2] != "loss"}
                theirs = _metric_rows(met)
                self.assertEqual(sorted(set(mine) ^ set(theirs)), [])
                for key, v in theirs.items():
                    self.assertEqual(mine[key], v, f"{algo}: {key}")

    def test_a_checkpoint_resumes_the_same_run(self):
        online = np.load(os.path.join(self.dir, "oktopk.online.npy"))
        resumed = np.load(os.path.join(self.dir, "oktopk.resumed.npy"))
        cut = len(online) - len(resumed)
        self.assertTrue(np.array_equal(online[cut:].view(np.uint32), resumed.view(np.uint32)))

    def test_onebit_optimizers_keep_the_ranks_in_step(self):
        for method in ("onebit-adam", "onebit-lamb"):
            with self.subTest(method=method):
                params = [np.load(os.path.join(self.dir, f"{method}.params.rank{r}.npy")) for r in range(RANKS)]
                for p in params[1:]:
                    np.testing.assert_array_equal(p, params[0])
                losses = np.load(os.path.join(self.dir, f"{method}.losses.npy"))
                self.assertTrue(np.all(np.isfinite(losses)))

    def test_the_runs_learn(self):
        ring = np.load(os.path.join(self.dir, "ring.losses.npy"))
        self.assertLess(ring[-1], ring[0])


@unittest.skipUnless(have_torch(), NO_TORCH)
class HookErrors(unittest.TestCase):
    """Mistakes found before any message (one process, a world of one rank over gloo)."""

    @classmethod
    def setUpClass(cls):
        _require_native()
        import torch.distributed as dist

        if not dist.is_initialized():
            import socket

            with socket.socket() as s:  # a free port, and no MASTER_* left in the environment
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    def test_unknown_algorithm_and_unread_option(self):
        import gradkit.torch as gt

        with self.assertRaises(ValueError) as cm:
            gt.hook("oktop")
        self.assertIn("oktopk", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            gt.hook("topka", period=3)
        self.assertIn("period", str(cm.exception))

    def test_a_float64_model_is_refused_naming_the_dtype(self):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        import gradkit.torch as gt

        net = torch.nn.Linear(3, 2).double()
        ddp = DDP(net)
        ddp.register_comm_hook(*gt.hook("ring", model=net))
        with self.assertRaises(Exception) as cm:
            ddp(torch.ones(4, 3, dtype=torch.float64)).sum().backward()
        self.assertIn("float64", str(cm.exception))

    def test_tensors_are_reduced_in_place_and_bad_ones_refused(self):
        import torch

        import gradkit
        import gradkit.torch as gt

        red = gradkit.Reducer("ring", gt.comm(), [("w", (3, 4))])
        t = torch.arange(12, dtype=torch.float32)
        before = t.clone()
        self.assertIs(red.reduce(t, out=t), t)  # a world of one: the sum is the tensor itself
        self.assertTrue(torch.equal(t, before))
        self.assertIsInstance(red.reduce(t), torch.Tensor)
        for bad, words in ((t.double(), "float64"), (t.view(3, 4).t(), "contiguous")):
            with self.assertRaises((TypeError, ValueError)) as cm:
                red.reduce(bad)
            self.assertIn(words, str(cm.exception))

    def test_a_state_for_another_world_size_is_refused(self):
        import gradkit
        import gradkit.torch as gt

        red = gradkit.Reducer("topka", gt.comm(), [("w", (8,))], density=0.25)
        red.reduce(np.arange(8, dtype=np.float32))
        state = red.state_dict()
        state["world_size"] = 2
        with self.assertRaises(ValueError) as cm:
            red.load_state_dict(state)
        self.assertIn("world_size", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
