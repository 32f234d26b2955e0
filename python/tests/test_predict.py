"""make predict (pipelines/predict.sh, docs/SIMULATE.md § Predict): a 2-rank recording to a
table at 4 and 8 ranks. Every row is there; each whole step is the profile's compute plus
the row's replayed exchange; Dense and DenseOvlp follow the α-β timeline written here
(skipped without smpirun)."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

from helpers import REPO, bin_dir, run_tool

PREDICT = os.path.join(REPO, "pipelines", "predict.sh")


@unittest.skipUnless(shutil.which("smpirun"), "smpirun is not installed (make deps installs SimGrid)")
class Predict(unittest.TestCase):
    def test_a_two_rank_recording_to_a_table_at_scale(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "two.parquet")
            run_tool("gradtrace", "synthetic", "--layers", "w=20000,b=100", "--ranks", "2", "--steps", "2",
                     "--seed", "3", "-q", "-o", trace)
            prof = os.path.join(d, "step.csv")
            with open(prof, "w") as f:
                f.write("name,numel,ms\nforward,0,4\nw1,300000,2\nw2,100,2\noptimizer,0,2\n")
            env = dict(os.environ, GRADKIT_BIN=bin_dir(), TRACE=trace, P="4 8", ALGOS="ring topka oktopk",
                       PLATFORM="--link-rate 1Gbps --latency 10us", PROFILE=prof, OUT=os.path.join(d, "out"))
            out = subprocess.run(["bash", PREDICT], env=env, capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            rows = [r for r in out.stdout.splitlines() if re.match(r"\| [0-9]+ \| \w+ \|", r)]
            self.assertEqual(len(rows), 6, out.stdout)
            alpha, beta = 20e-6, 8e-9  # 2 · latency; 1 / (1 Gbit/s in bytes)
            for r in rows:
                p, algo, exchange, whole, x_ovlp, x_dense = [c.strip() for c in r.strip("|").split("|")][:6]
                p, exchange, whole = int(p), float(exchange), float(whole)
                # The whole step: forward 4 + backward 4 + the exchange + optimizer 2 (ms).
                self.assertAlmostEqual(whole, 10 + exchange, delta=0.01 * whole, msg=r)
                ring = lambda b: 2 * (p - 1) * (alpha + b / p * beta) * 1e3
                # DenseOvlp: w1's 1.2 MB fill the first bucket (1 MiB) at 2 ms, w2 the last at 4.
                first = 2 + ring(1_200_000)
                last = max(4, first) + ring(400)
                ovlp = 4 + max(4, last) + 2
                dense = 4 + 4 + ring(1_200_400) + 2
                self.assertAlmostEqual(float(x_ovlp.rstrip("×")), ovlp / whole, delta=0.011, msg=r)
                self.assertAlmostEqual(float(x_dense.rstrip("×")), dense / whole, delta=0.011, msg=r)


if __name__ == "__main__":
    unittest.main()
