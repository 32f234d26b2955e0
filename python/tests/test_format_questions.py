"""docs/FORMAT.md's three analysis questions, run as printed (the commands, then the polars
code), each answer checked against the rows read with pyarrow and summed here."""

import os
import re
import subprocess
import sys
import tempfile
import unittest
from collections import defaultdict

import pyarrow.parquet as pq

from helpers import REPO, bin_dir, tool

HEADING = "### Three questions, two lines each"


def section():
    with open(os.path.join(REPO, "docs", "FORMAT.md"), encoding="utf-8") as f:
        text = f.read()
    rest = text[text.index(HEADING):]
    nxt = re.search(r"^#{2,6} ", rest[len(HEADING):], flags=re.M)  # not a code comment
    if nxt:
        rest = rest[:len(HEADING) + nxt.start()]
    sh = re.findall(r"^```sh\n(.*?)^```$", rest, flags=re.S | re.M)
    py = re.findall(r"^```python\n(.*?)^```$", rest, flags=re.S | re.M)
    return sh, py


class FormatQuestionsTest(unittest.TestCase):
    def test_each_question_takes_at_most_two_lines(self):
        _, py = section()
        self.assertEqual(len(py), 1)
        questions = re.split(r"^# \d\. .*$", py[0], flags=re.M)[1:]
        self.assertEqual(len(questions), 3)
        for q in questions:
            code = [ln for ln in q.splitlines() if ln.strip() and not ln.startswith("#")]
            self.assertLessEqual(len(code), 2, q)

    def test_answers(self):
        tool("gradtrain")
        sh, py = section()
        pl = __import__("polars")
        env = dict(os.environ, PATH=os.pathsep.join([bin_dir(), os.environ["PATH"]]))
        with tempfile.TemporaryDirectory(prefix="gradkit-format-") as d:
            for block in sh:
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=d, env=env,
                                   capture_output=True, text=True, timeout=600)
                self.assertEqual(p.returncode, 0, f"{block}\nfailed:\n{p.stderr}")
            ns = {}
            cwd = os.getcwd()
            os.chdir(d)
            try:
                exec(compile(py[0], "docs/FORMAT.md", "exec"), ns)
            finally:
                os.chdir(cwd)
            self.check_bytes(d, ns["per_algo"])
            self.check_layers(d, ns["layers"])
            self.check_curve(d, ns["curve"], pl)

    def rows(self, path):
        return pq.read_table(path).to_pylist()

    def check_bytes(self, d, per_algo):
        want = {}
        for a in ("ring", "topka", "oktopk"):
            for r in self.rows(os.path.join(d, f"m_{a}.parquet")):
                # The step's total; its phases' rows name the phase in `phase`.
                if r["metric"] == "bytes_sent" and not r["phase"]:
                    want[(r["step"], r["rank"], a)] = r["value"]
        got = {(r["step"], r["rank"], a): r[a] for r in per_algo.to_dicts()
               for a in ("ring", "topka", "oktopk")}
        self.assertEqual(got, want)
        self.assertEqual(len(got), 3 * 4 * 3)

    def check_layers(self, d, layers):
        count = defaultdict(int)
        for r in self.rows(os.path.join(d, "sel.parquet")):
            count[r["layer"]] += len(r["values"])
        total = sum(count.values())
        got = layers.to_dicts()
        self.assertEqual({r["layer"]: r["selected"] for r in got}, dict(count))
        self.assertEqual([r["selected"] for r in got], sorted(count.values(), reverse=True))
        for r in got:
            self.assertAlmostEqual(r["share"], count[r["layer"]] / total)

    def check_curve(self, d, curve, pl):
        for run in ("dense", "oktopk"):
            elapsed, loss = defaultdict(list), defaultdict(list)
            for r in self.rows(os.path.join(d, f"{run}.parquet")):
                if r["metric"] == "time_elapsed_s":
                    elapsed[r["step"]].append(r["value"])
                elif r["metric"] == "loss":
                    loss[r["step"]].append(r["value"])
            steps = sorted(loss)
            self.assertEqual(sorted(elapsed), steps)
            got = curve.filter(pl.col("run") == run).sort("step")
            self.assertEqual(got["step"].to_list(), steps)
            for s, g in zip(steps, got.to_dicts()):
                self.assertAlmostEqual(g["loss"], sum(loss[s]) / len(loss[s]), places=12)
                self.assertEqual(g["wall_s"], max(elapsed[s]))
            walls = got["wall_s"].to_list()
            self.assertEqual(walls, sorted(walls))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
