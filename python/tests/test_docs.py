"""docs/PYTORCH.md as printed: its DDP and training scripts are the package's, its shell
blocks run in order (torchrun only where PyTorch is installed), and its Python blocks run on
what they made (```py blocks are fragments of a script, not run)."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

from helpers import REPO, bin_dir, have_torch, tool

DOC = os.path.join(REPO, "docs", "PYTORCH.md")


def blocks(text, lang):
    return re.findall(r"^```" + lang + r"\n(.*?)^```$", text, flags=re.S | re.M)


class PytorchDocTest(unittest.TestCase):
    def setUp(self):
        with open(DOC, encoding="utf-8") as f:
            self.text = f.read()

    def test_ddp_script_is_the_packages(self):
        path = os.path.join(REPO, "python", "gradkit", "ddp_example.py")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        body = source[source.index("import argparse"):]
        self.assertIn(body, blocks(self.text, "python"),
                      "docs/PYTORCH.md's DDP script differs from python/gradkit/ddp_example.py")

    def test_train_and_reduce_scripts_are_the_packages(self):
        for name, start, lang in (("train_example.py", "import argparse", "python"),
                                  ("reduce_example.py", "import numpy as np", "py")):
            with open(os.path.join(REPO, "python", "gradkit", name), encoding="utf-8") as f:
                source = f.read()
            self.assertIn(source[source.index(start):], blocks(self.text, lang),
                          f"docs/PYTORCH.md's copy of python/gradkit/{name} differs from it")

    def test_commands_and_snippets_run(self):
        tool("gradselect")  # skipped or failed here when the binaries are missing
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([bin_dir(), os.path.dirname(sys.executable), env["PATH"]])
        env["PYTHONPATH"] = os.path.join(REPO, "python")
        with tempfile.TemporaryDirectory(prefix="gradkit-pytorch-md-") as d:
            for block in blocks(self.text, "sh"):
                if "torchrun" in block and not have_torch():
                    continue
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=d, env=env,
                                   capture_output=True, text=True, timeout=600)
                self.assertEqual(p.returncode, 0, f"{block}\nfailed:\n{p.stderr}")
            for code in blocks(self.text, "python"):
                if "Recorder(" in code or "def main():" in code:
                    continue  # the recording snippets and the package's scripts: run by their tests
                if "import torch" in code and not have_torch():
                    continue  # make test-torch runs it, in the venv that has torch
                p = subprocess.run([sys.executable, "-c", code], cwd=d, env=env,
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, f"{code}\nfailed:\n{p.stderr}")


if __name__ == "__main__":
    unittest.main()
