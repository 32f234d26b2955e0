"""make repro-sim's calibration (pipelines/sim_tables.py fit, docs/SIMULATE.md): from a ring
across 2 hosts whose rounds cost a known α + m/(f(m)·B), the fit gives back α and f; and a
replay with the fitted values as SMPI's send/receive overheads and bandwidth factors costs
what that model says (SimGrid's own arithmetic, checked against the formula; skipped without
smpirun)."""

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from helpers import REPO, run_tool, tool

FIT = os.path.join(REPO, "pipelines", "sim_tables.py")
RATE = 125e6  # 1 Gbit/s in bytes per second


def write_calsim(path, p, alpha, factor):
    """The bare replay (link alone: m/B per round) beside a measured time of α + m/(f(m)·B)
    per round, three calls per size, as `gradreport simulate --format csv` writes it."""
    rounds = 2 * (p - 1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "label", "phase", "simulated_ms", "recorded_ms", "alpha_beta_ms", "sim/alpha_beta"])
        step = 0
        for size in (4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304):
            m = size / p
            bare = rounds * m / RATE
            meas = rounds * (alpha + m / (factor(m) * RATE))
            for _ in range(3):
                w.writerow([step, f"ring {size}B", "(step)", bare * 1e3, meas * 1e3, bare * 1e3, 1.0])
                step += 1


def fit(*args):
    out = subprocess.run([sys.executable, FIT, "fit", *args], capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def factor_of(spec, m):
    """SMPI's piecewise lookup: the factor of the largest SIZE ≤ m."""
    pieces = sorted((int(s), float(f)) for s, f in (x.split(":") for x in spec.strip("'").split(";")))
    return [f for s, f in pieces if s <= m][-1]


def write_val(d, calls, rate="1gbit", p=2):
    """One repeat's validation replay (sim, bare: the same) of a ring: `calls` is a list of
    (simulated ms, recorded ms) per call; and its fit file."""
    os.makedirs(d, exist_ok=True)
    for kind in ("sim", "bare"):
        with open(os.path.join(d, f"{kind}-val-{rate}-p{p}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "label", "phase", "simulated_ms", "recorded_ms", "alpha_beta_ms", "sim/alpha_beta"])
            for i, (s, r) in enumerate(calls):
                w.writerow([i, "ring 4194304B", "(step)", s, r, s, 1.0])
    with open(os.path.join(d, f"fit-{rate}-p{p}.env"), "w") as f:
        f.write("ALPHA_US=10.00\nBW_FACTOR='0:1.0000'\n")


class ValidationTableTest(unittest.TestCase):
    def test_ratios_within_each_repeat_then_median_and_range(self):
        """Repeat by repeat (median over its calls): measured 10, 20, 10 ms, simulated 10, 10,
        15 ms, so sim/meas is 1.0, 0.5 and 1.5: the cell is 1.00 (0.50–1.50) and the row's
        error is that of the median ratio (0 %), not of the pooled times (10 / 12.5)."""
        with tempfile.TemporaryDirectory() as d:
            write_val(os.path.join(d, "r1"), [(10, 8), (10, 12)])
            write_val(os.path.join(d, "r2"), [(10, 20), (10, 20)])
            write_val(os.path.join(d, "r3"), [(15, 10), (15, 10)])
            out = subprocess.run([sys.executable, FIT, "table", "--rates", "1gbit", "--ps", "2",
                                  "--repeats", "r1 r2 r3"], cwd=d, capture_output=True, text=True,
                                 check=True).stdout
        row = [l for l in out.splitlines() if l.startswith("| 1gbit")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[3], "10.000 (10.000–20.000)")  # measured ms
        self.assertEqual(cells[4], "10.000")  # fastest call: the median of 8, 20, 10
        self.assertEqual(cells[6], "1.00 (0.50–1.50)")  # sim/meas
        # The error as a factor (too fast and too slow alike), per rate and family.
        self.assertIn("as a factor (max(sim/meas, meas/sim): too fast and too slow alike; 1 rows, "
                      "3 interleaved repeats each", out)
        self.assertIn("1gbit: median factor 1.00×, worst 1.00× (ring at P = 2, exact); by family dense 1.00×", out)
        self.assertIn("α = 10.00 µs", out)


class CalibrationFitTest(unittest.TestCase):
    def test_fit_recovers_overhead_and_factors(self):
        truth = lambda m: 0.6 if m >= 100_000 else (3.0 if m >= 1000 else 1.0)  # noqa: E731
        with tempfile.TemporaryDirectory() as d:
            cal = os.path.join(d, "cal.csv")
            write_calsim(cal, 2, 40e-6, truth)
            env = fit(cal, "2")
            self.assertAlmostEqual(float(env["OVERHEAD_S"]), 20e-6, delta=1e-9)
            self.assertAlmostEqual(float(env["ALPHA_US"]), 40.0, places=1)
            for m in (2048, 8192, 32768, 131072, 524288, 2097152):
                self.assertAlmostEqual(factor_of(env["BW_FACTOR"], m), truth(m), places=3, msg=f"m = {m}")

    def test_overhead_at_another_p_comes_from_its_small_sizes(self):
        with tempfile.TemporaryDirectory() as d:
            cal, small = os.path.join(d, "cal.csv"), os.path.join(d, "small.csv")
            write_calsim(cal, 2, 40e-6, lambda m: 1.0)
            write_calsim(small, 4, 150e-6, lambda m: 1.0)
            env = fit(cal, "2", small, "4")
            self.assertAlmostEqual(float(env["OVERHEAD_S"]), 75e-6, delta=1e-9)


@unittest.skipUnless(shutil.which("smpirun"), "smpirun is not installed (apt-get install libsimgrid-dev)")
class CalibratedReplayTest(unittest.TestCase):
    def test_overheads_and_factor_cost_what_the_model_says(self):
        """A ring of 64 KiB on 2 ranks is 2 rounds of one 32 KiB message each way: with latency
        0, bandwidth factor f and send and receive overheads o each, a round costs
        2·o + 32768/(f·B)."""
        tool("gradreport")
        with tempfile.TemporaryDirectory() as d:
            rec = os.path.join(d, "ring.parquet")
            run_tool("gradallreduce", "bench", "--algo", "ring", "--sizes", "64K:64K", "--warmup", "0",
                     "--iters", "1", "--ranks", "2", "-q", "--format", "csv", "--comm-trace", rec)
            o, f = 250e-6, 0.5
            out = run_tool("gradreport", "simulate", rec, "--link-rate", "1Gbps", "--latency", "0us",
                           "--bw-factor", f"0:{f}", "--smpi-cfg", f"smpi/ois:0:{o}:0",
                           "--smpi-cfg", f"smpi/os:0:{o}:0", "--smpi-cfg", f"smpi/or:0:{o}:0",
                           "--compute", "none", "--no-phases", "--format", "csv")
            row = next(csv.DictReader(out.splitlines()))
            want = 2 * (2 * o + 32768 / (f * RATE))
            self.assertAlmostEqual(float(row["simulated_ms"]) * 1e-3, want, delta=0.02 * want)


if __name__ == "__main__":
    unittest.main()
