"""Recording from torch modules, and docs/PYTORCH.md's DDP script under torchrun (skipped
where PyTorch is not installed)."""

import os
import subprocess
import sys
import tempfile
import time
import unittest
from collections import OrderedDict

import numpy as np

from gradkit import Recorder, Trace

from helpers import REPO, have_torch


@unittest.skipUnless(have_torch(), "PyTorch is not installed")
class TorchTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="gradkit-torch-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def net(self):
        import torch
        from torch import nn

        torch.manual_seed(0)
        return nn.Sequential(OrderedDict(fc1=nn.Linear(32, 64), relu=nn.ReLU(), fc2=nn.Linear(64, 10)))

    def test_module_gradients_without_the_ddp_prefix(self):
        import torch
        from torch import nn

        class Wrapper(nn.Module):  # names its child `module`, as DDP does
            def __init__(self, m):
                super().__init__()
                self.module = m

            def forward(self, x):
                return self.module(x)

        model = Wrapper(self.net())
        x = torch.randn(16, 32)
        model(x).square().sum().backward()
        path = os.path.join(self.dir, "r.parquet")
        with Recorder(path) as rec:
            rec.step(model)
        got = Trace(path).tensors(0)
        self.assertEqual(list(got), ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
        for n, p in model.module.named_parameters():
            np.testing.assert_array_equal(got[n], p.grad.numpy())

    def test_ddp_script_records_each_ranks_own_gradient(self):
        import torch
        import torch.nn.functional as F

        out = os.path.join(self.dir, "run")
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "gradkit.ddp_example", "--out", out,
                        "--steps", "2"], check=True, env=env, timeout=300)
        t = Trace(os.path.join(out, "rank*.parquet"))
        self.assertEqual((t.steps, t.ranks, t.world_size), ([0, 1], [0, 1], 2))
        for rank in range(2):
            # Step 0 again, alone: the same weights and the rank's own first batch.
            net = self.net()
            data = torch.Generator().manual_seed(1000 + rank)
            x = torch.randn(64, 32, generator=data)
            F.cross_entropy(net(x), x[:, :10].argmax(1)).backward()
            got = t.tensors(0, rank=rank)
            for n, p in net.named_parameters():
                np.testing.assert_allclose(got[n], p.grad.numpy(), rtol=1e-6, atol=1e-7)


@unittest.skipUnless(have_torch(), "PyTorch is not installed")
class StepProfile(unittest.TestCase):
    """gradkit.torch.step_profile against delays put into the step by the test: a forward that
    sleeps, a backward that sleeps between fc2's gradients and fc1's, an optimizer that sleeps.
    Each lands in its own row; the rows are the model's parameters in backward order."""

    FWD, BWD, OPT = 0.05, 0.2, 0.05  # seconds: well above what a busy machine adds to a tiny step

    def test_delays_land_in_their_rows_in_backward_order(self):
        import torch
        from torch import nn

        from gradkit.torch import step_profile

        bwd_delay = self.BWD

        class SlowBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                time.sleep(bwd_delay)
                return g

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

            def forward(self, x):
                return self.fc2(SlowBackward.apply(torch.relu(self.fc1(x))))

        torch.manual_seed(0)
        model, x, y = Net(), torch.randn(8, 16), torch.randn(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        real_step = opt.step

        def slow_step(*a, **k):
            time.sleep(self.OPT)
            return real_step(*a, **k)

        opt.step = slow_step

        def forward():
            time.sleep(self.FWD)
            return nn.functional.mse_loss(model(x), y)

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "step.csv")
            rows = step_profile(model, forward, opt, path, steps=3, warmup=1)
            with open(path) as f:
                lines = f.read().splitlines()
        self.assertEqual(lines[0], "name,numel,ms")
        self.assertEqual([ln.split(",")[0] for ln in lines[1:]], [r[0] for r in rows])
        names = [r[0] for r in rows]
        self.assertEqual((names[0], names[-1]), ("forward", "optimizer"))
        sizes = {n: p.numel() for n, p in model.named_parameters()}
        self.assertEqual({r[0]: r[1] for r in rows[1:-1]}, sizes)
        # Backward order: fc2's gradients are ready before fc1's.
        layers = names[1:-1]
        self.assertLess(max(layers.index("fc2.weight"), layers.index("fc2.bias")),
                        min(layers.index("fc1.weight"), layers.index("fc1.bias")))
        ms = {r[0]: r[2] for r in rows}
        self.assertGreaterEqual(ms["forward"], self.FWD * 1e3)
        self.assertGreaterEqual(ms["optimizer"], self.OPT * 1e3)
        # The sleep between fc2's and fc1's gradients is in fc1's first row, not in fc2's.
        first_fc1 = min(("fc1.weight", "fc1.bias"), key=layers.index)
        self.assertGreaterEqual(ms[first_fc1], self.BWD * 1e3)
        self.assertLess(ms["fc2.weight"] + ms["fc2.bias"], self.BWD * 1e3)

    def test_a_parameter_without_a_gradient_is_named(self):
        import torch
        from torch import nn

        from gradkit.torch import step_profile

        model = nn.ModuleDict({"used": nn.Linear(4, 2), "unused": nn.Linear(4, 2)})
        x = torch.randn(3, 4)
        with self.assertRaisesRegex(ValueError, "no gradient for unused.weight"):
            step_profile(model, lambda: model["used"](x).sum(), None, steps=1, warmup=0)


if __name__ == "__main__":
    unittest.main()
