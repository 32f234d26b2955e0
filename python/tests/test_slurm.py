"""docs/SLURM.md's sbatch script, run here with the same lines and `LAUNCH="mpirun -np 4"` on
this machine: its exchanges across MPI processes equal in-process ranks bit for bit, the byte
counts equal the formulas, and the figure and CSV appear. Skipped where mpirun is missing."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

from gradkit import Trace

from helpers import REPO, bin_dir, run_tool, tool

SCRIPT = os.path.join(REPO, "pipelines", "slurm", "repro.sbatch")


class SlurmScriptTest(unittest.TestCase):
    def test_doc_shows_the_script(self):
        with open(os.path.join(REPO, "docs", "SLURM.md"), encoding="utf-8") as f:
            doc = f.read()
        with open(SCRIPT, encoding="utf-8") as f:
            script = f.read()
        blocks = re.findall(r"^```bash script\n(.*?)^```$", doc, flags=re.S | re.M)
        self.assertEqual(blocks, [script], "docs/SLURM.md's script differs from " + SCRIPT)

    @unittest.skipUnless(shutil.which("mpirun"), "mpirun is not installed")
    def test_script_runs_under_mpirun(self):
        tool("gradallreduce")
        with tempfile.TemporaryDirectory(prefix="gradkit-slurm-") as out:
            env = dict(os.environ, LAUNCH="mpirun -np 4", OUT=out, SCALE="0.02", STEPS="12",
                       GRADKIT_BIN=bin_dir(), OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            env.pop("SLURM_NTASKS", None)
            env.pop("SLURM_SUBMIT_DIR", None)
            p = subprocess.run(["bash", SCRIPT], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            trace = os.path.join(out, "trace.parquet")
            local = os.path.join(out, "local_ring.parquet")
            run_tool("gradallreduce", "--algo", "ring", "--ranks", "4", trace, "-o", local)
            t, mpi, inproc = Trace(trace), Trace(os.path.join(out, "reduced_ring.parquet")), Trace(local)
            for step in t.steps:
                got = mpi.flat(step)
                np.testing.assert_array_equal(got.view(np.uint32), inproc.flat(step).view(np.uint32))
                want = sum(g.astype(np.float64) for g in t.step(step).values())
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
            with open(os.path.join(out, "volume.md"), encoding="utf-8") as f:
                volume = f.read()
            for algo in ("ring", "topka"):
                self.assertRegex(volume, rf"\| {algo} +\| +4 \|.*\| +1\.00 \|")
            with open(os.path.join(out, "loss.pdf"), "rb") as f:
                self.assertEqual(f.read(5), b"%PDF-")
            with open(os.path.join(out, "loss.csv"), encoding="utf-8") as f:
                series = {line.split(",")[1] for line in f.read().splitlines()[1:]}
            self.assertEqual(series, {"dense", "oktopk"})


if __name__ == "__main__":
    unittest.main()
