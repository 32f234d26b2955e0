"""Recording from torch modules, and docs/PYTORCH.md's DDP script under torchrun (skipped
where PyTorch is not installed)."""

import os
import subprocess
import sys
import tempfile
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


if __name__ == "__main__":
    unittest.main()
