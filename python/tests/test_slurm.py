"""docs/SLURM.md's sbatch script, run here with the same lines and `LAUNCH="mpirun -np 4"` on
this machine: its exchanges across MPI processes equal in-process ranks bit for bit, the byte
counts equal the formulas, and the figure and CSV appear. Skipped where mpirun is missing.

The GPU script (pipelines/slurm/gpu.sbatch) the same way, with `LAUNCH="mpirun -np 2"` and a CPU
device (`DEVICE=counting`: the device seam's host device, which takes the same resident path as
`--device cuda`): every line and flag runs; its #SBATCH lines; gpu-rank.sh's choice of GPU; the
build's prerequisite checks, with stand-in cargo/rustc/mpicc. No GPU and no SLURM here."""

import os
import re
import hashlib
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from gradkit import Trace

from helpers import REPO, bin_dir, run_tool, tool

SCRIPT = os.path.join(REPO, "pipelines", "slurm", "repro.sbatch")
GPU_SCRIPT = os.path.join(REPO, "pipelines", "slurm", "gpu.sbatch")
GPU_RANK = os.path.join(REPO, "pipelines", "slurm", "gpu-rank.sh")
MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
# What SLURM or a launcher may have set in the environment that runs the tests.
LAUNCH_VARS = ("SLURM_NTASKS", "SLURM_SUBMIT_DIR", "SLURM_JOB_ID", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES",
               "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "GRADKIT_BIN", "BUILD", "TRACE",
               "DEVICE", "BACKEND", "ALGOS", "LAUNCH", "CARGO", "RUSTC", "MPICC", "PKG_CONFIG",
               "LIBCLANG_PATH", "CARGO_TARGET_DIR", "PYTHON")


def clean_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(kw)
    return env


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


def gpu_header(text):
    """gpu.sbatch's lines from the first #SBATCH through the end of the site's block."""
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    last = next(i for i, line in enumerate(lines) if line.startswith("# ---- end of the site's part"))
    return "".join(lines[first:last + 1])


def stub(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


class SlurmGpuScriptTest(unittest.TestCase):
    def run_script(self, env, cwd=REPO):
        return subprocess.run(["bash", GPU_SCRIPT], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)

    def test_sbatch_lines_site_block_and_doc(self):
        subprocess.run(["bash", "-n", GPU_SCRIPT], check=True)
        subprocess.run(["bash", "-n", GPU_RANK], check=True)
        with open(GPU_SCRIPT, encoding="utf-8") as f:
            script = f.read()
        opts = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", script, flags=re.M))
        for name in ("job-name", "nodes", "ntasks-per-node", "gpus-per-task", "cpus-per-task",
                     "exclusive", "time", "output"):
            self.assertIn(name, opts)
        self.assertEqual(opts["gpus-per-task"], "1")
        self.assertNotIn("gres", opts)
        self.assertIn("%j", opts["output"])
        # The --gres alternative is commented out, with one GPU per task of the node.
        gres = re.findall(r"^##SBATCH --gres=gpu:(\d+)", script, flags=re.M)
        self.assertEqual(gres, [opts["ntasks-per-node"]])
        # Every `module load` line is a comment inside the block marked as the site's.
        site = re.search(r"^# ---- THE SITE'S TO FILL.*?^# ---- end of the site's part", script,
                         flags=re.S | re.M).group(0)
        loads = re.findall(r"^.*module load.*$", script, flags=re.M)
        self.assertGreaterEqual(len(loads), 3)
        for line in loads:
            self.assertIn(line, site)
            self.assertTrue(line.startswith("# module load"), line)
        self.assertTrue(re.search(r'^  "\$\{CARGO:-cargo\}" build --release --locked --features cuda ', script,
                                  flags=re.M), "the cuda build line is missing")
        self.assertRegex(script, r"OUT=\$\{OUT:-results/slurm-gpu-\$\{SLURM_JOB_ID")
        with open(os.path.join(REPO, "docs", "SLURM.md"), encoding="utf-8") as f:
            doc = f.read()
        blocks = re.findall(r"^```bash gpu-header\n(.*?)^```$", doc, flags=re.S | re.M)
        self.assertEqual(blocks, [gpu_header(script)], "docs/SLURM.md's GPU header differs")

    def test_gpu_rank_gives_each_rank_one_gpu(self):
        cases = [  # (environment, CUDA_VISIBLE_DEVICES the command sees, or None: refused)
            (dict(SLURM_LOCALID="2", CUDA_VISIBLE_DEVICES="4,5,6,7"), "6"),
            (dict(SLURM_LOCALID="0", OMPI_COMM_WORLD_LOCAL_RANK="1", CUDA_VISIBLE_DEVICES="4,5,6,7"), "5"),
            (dict(MPI_LOCALRANKID="3", SLURM_LOCALID="0", CUDA_VISIBLE_DEVICES="0,1,2,3"), "3"),
            (dict(SLURM_LOCALID="3", CUDA_VISIBLE_DEVICES="2"), "2"),  # SLURM bound one GPU
            (dict(SLURM_LOCALID="1"), "1"),
            ({}, "0"),
            (dict(SLURM_LOCALID="1", CUDA_VISIBLE_DEVICES=""), ""),
            (dict(SLURM_LOCALID="4", CUDA_VISIBLE_DEVICES="0,1,2,3"), None),
            (dict(SLURM_LOCALID="x", CUDA_VISIBLE_DEVICES="0,1"), None),
        ]
        for extra, want in cases:
            p = subprocess.run([GPU_RANK, "sh", "-c", 'printf %s "$CUDA_VISIBLE_DEVICES"'],
                               env=clean_env(**extra), capture_output=True, text=True)
            if want is None:
                self.assertEqual(p.returncode, 1, extra)
                self.assertEqual(p.stdout, "", extra)
                self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
                self.assertTrue(p.stderr.startswith("error: gpu-rank.sh: "), p.stderr)
            else:
                self.assertEqual((p.returncode, p.stdout, p.stderr), (0, want, ""), extra)

    @unittest.skipUnless(shutil.which("mpirun"), "mpirun is not installed")
    def test_script_runs_under_mpirun_on_a_cpu_device(self):
        tool("gradallreduce")
        with tempfile.TemporaryDirectory(prefix="gradkit-slurm-gpu-") as out:
            env = clean_env(LAUNCH="mpirun -np 2", SLURM_NTASKS="2", DEVICE="counting", OUT=out,
                            SCALE="0.02", STEPS="3", SIZES="64K:256K", GRADKIT_BIN=bin_dir(),
                            PYTHON=sys.executable, **MPI_ENV)
            p = self.run_script(env)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            trace = os.path.join(out, "trace.parquet")
            self.assertEqual(Trace(trace).ranks, [0, 1])
            for algo in ("topka", "oktopk", "onebit"):
                local = os.path.join(out, f"local_{algo}.parquet")
                run_tool("gradallreduce", "--algo", algo, "--ranks", "2", trace, "-o", local)
                want = Trace(local)
                for dev in ("counting", "cpu"):
                    got = Trace(os.path.join(out, f"reduced_{algo}_{dev}.parquet"))
                    self.assertEqual(got.steps, [0, 1, 2])
                    for step in want.steps:
                        np.testing.assert_array_equal(got.flat(step).view(np.uint32),
                                                      want.flat(step).view(np.uint32))
            with open(os.path.join(out, "compare.md"), encoding="utf-8") as f:
                compare = f.read()
            self.assertIn("compared: every row (pyarrow)", compare)
            for algo in ("topka", "oktopk", "onebit"):
                self.assertIn(f"| {algo} | equal |", compare)
            with open(os.path.join(out, "bench.md"), encoding="utf-8") as f:
                bench = f.read()
            for algo in ("topka", "oktopk", "onebit"):
                self.assertRegex(bench, rf"\| +65536 \| +16384 \| {algo} +\|")
                self.assertRegex(bench, rf"\| +262144 \| +65536 \| {algo} +\|")
            with open(os.path.join(out, "table.md"), encoding="utf-8") as f:
                table = f.read()
            for run in ("topka-counting", "topka-cpu", "oktopk-counting", "onebit-cpu"):
                self.assertRegex(table, rf"\| {run} +\| +2 \|")
            with open(os.path.join(out, "volume.md"), encoding="utf-8") as f:
                volume = f.read()
            for algo in ("topka", "onebit"):
                self.assertRegex(volume, rf"\| {algo} +\| +2 \|.*\| +1\.00 \|")

    @unittest.skipUnless(shutil.which("mpirun"), "mpirun is not installed")
    def test_trace_variable_runs_the_recorded_trace(self):
        tool("gradallreduce")
        with tempfile.TemporaryDirectory(prefix="gradkit-slurm-gpu-") as tmp:
            recorded = os.path.join(tmp, "recorded.parquet")
            run_tool("gradtrace", "synthetic", "--shape", "mlp", "--ranks", "2", "--steps", "2",
                     "--seed", "7", "-q", "-o", recorded)
            with open(recorded, "rb") as f:
                before = hashlib.sha256(f.read()).hexdigest()
            out = os.path.join(tmp, "out")
            env = clean_env(LAUNCH="mpirun -np 2", SLURM_NTASKS="2", DEVICE="cpu", OUT=out,
                            TRACE=recorded, ALGOS="topka", SIZES="64K:64K", GRADKIT_BIN=bin_dir(),
                            **MPI_ENV)
            p = self.run_script(env)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertFalse(os.path.exists(os.path.join(out, "trace.parquet")))
            with open(recorded, "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), before)
            local = os.path.join(tmp, "local.parquet")
            run_tool("gradallreduce", "--algo", "topka", "--ranks", "2", recorded, "-o", local)
            got, want = Trace(os.path.join(out, "reduced_topka_cpu.parquet")), Trace(local)
            self.assertEqual([lay.name for lay in got.layers], [lay.name for lay in Trace(recorded).layers])
            for step in want.steps:
                np.testing.assert_array_equal(got.flat(step).view(np.uint32), want.flat(step).view(np.uint32))
            # A recorded trace of another rank count: one line naming it, nothing run.
            four = os.path.join(tmp, "four.parquet")
            run_tool("gradtrace", "synthetic", "--shape", "mlp", "--ranks", "4", "--steps", "1", "-q", "-o", four)
            p = self.run_script(dict(env, TRACE=four, OUT=os.path.join(tmp, "out4")))
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("holds 4 ranks but this run has 2", p.stderr)
            p = self.run_script(dict(env, TRACE=os.path.join(tmp, "none.parquet"), OUT=os.path.join(tmp, "o5")))
            self.assertEqual(p.returncode, 1)
            self.assertIn("error: TRACE=", p.stderr)

    def test_device_cuda_without_a_usable_gpu_stops_before_the_trace(self):
        bench = [tool("gradallreduce"), "bench", "--device", "cuda", "--algo", "topka", "--ranks", "1",
                 "--sizes", "1K:1K", "--iters", "1", "--warmup", "0", "-q"]
        if subprocess.run(bench, capture_output=True).returncode == 0:
            self.skipTest("--device cuda works here")
        with tempfile.TemporaryDirectory(prefix="gradkit-slurm-gpu-") as out:
            p = self.run_script(clean_env(LAUNCH="false", OUT=out, GRADKIT_BIN=bin_dir()))
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
            self.assertEqual(len(errors), 2, p.stderr)  # the tool's reason, then the script's
            self.assertRegex(errors[1], r"^error: --device cuda cannot be used on ")
            self.assertEqual(os.listdir(out), [])

    def test_build_checks_its_prerequisites(self):
        with tempfile.TemporaryDirectory(prefix="gradkit-slurm-build-") as tmp:
            calls = os.path.join(tmp, "cargo-args")
            cargo = stub(tmp, "cargo", f'echo "$*" > {calls}; exit 3')
            old, new = stub(tmp, "rustc-old", "echo 'rustc 1.87.9 (x 2025-01-01)'"), \
                stub(tmp, "rustc-new", "echo 'rustc 1.88.0 (x 2025-06-23)'")
            later = stub(tmp, "rustc-later", "echo 'rustc 1.100.0 (x 2027-01-01)'")  # not 1.1 < 1.88
            mpicc = stub(tmp, "mpicc", '[ "$1" = -show ] && echo "gcc -lmpi"')
            clang_dir, empty = os.path.join(tmp, "llvm"), os.path.join(tmp, "empty")
            os.makedirs(clang_dir)
            os.makedirs(empty)
            open(os.path.join(clang_dir, "libclang.so.18"), "w").close()
            good = dict(CARGO=cargo, RUSTC=new, LIBCLANG_PATH=clang_dir, MPICC=mpicc,
                        PKG_CONFIG="false", CARGO_TARGET_DIR=tmp, OUT=os.path.join(tmp, "out"))
            cases = [
                (dict(CARGO=os.path.join(tmp, "no-cargo")), r"^error: no cargo .*Rust >= 1\.88"),
                (dict(RUSTC=os.path.join(tmp, "no-rustc")), r"^error: no rustc .*Rust >= 1\.88"),
                (dict(RUSTC=old), r"^error: rustc 1\.87\.9 is too old: gradkit needs Rust >= 1\.88"),
                (dict(LIBCLANG_PATH=empty), r"^error: no libclang found in LIBCLANG_PATH=.*clang"),
                (dict(MPICC=os.path.join(tmp, "no-mpicc")), r"^error: no MPI compiler wrapper"),
                ({}, r"^error: the build failed \(cargo build --release --locked --features cuda, exit 3\)"),
                (dict(RUSTC=later), r"^error: the build failed "),
            ]
            for change, line in cases:
                p = self.run_script(clean_env(**dict(good, **change)))
                self.assertEqual(p.returncode, 1, change)
                self.assertEqual(p.stdout, "", change)
                self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
                self.assertRegex(p.stderr, line)
                built = "the build failed" in line  # cargo runs only when every check passed
                self.assertEqual(os.path.exists(calls), built, change)
                if built:
                    with open(calls, encoding="utf-8") as f:
                        self.assertEqual(f.read().split(), ["build", "--release", "--locked", "--features", "cuda"])
                    os.remove(calls)


if __name__ == "__main__":
    unittest.main()
