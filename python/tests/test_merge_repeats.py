"""pipelines/merge_repeats.py (make repro-cluster's repeats): numbers that differ become the median
over the repeats with their min–max, equal ones stay, differing words are shown with their
counts; the expected texts are written out by hand from the repeats below."""

import os
import subprocess
import sys
import tempfile
import unittest

from helpers import REPO

MERGE = os.path.join(REPO, "pipelines", "merge_repeats.py")


def merge(*texts):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, t in enumerate(texts):
            p = os.path.join(d, f"r{i}.md")
            with open(p, "w", encoding="utf-8") as f:
                f.write(t)
            paths.append(p)
        return subprocess.run([sys.executable, MERGE, *paths], capture_output=True, text=True)


class MergeRepeats(unittest.TestCase):
    def test_numbers_become_median_and_range(self):
        r = merge("| ring | 1.50 | 6,758 | 12 % |\nstep 3.\n",
                  "| ring | 1.70 | 6,758 | 30 % |\nstep 3.\n",
                  "| ring | 1.60 | 6,758 | -4 % |\nstep 3.\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        # 1.50/1.70/1.60: median 1.60; -4/12/30 %: median 12 %; equal numbers stay as printed.
        self.assertEqual(r.stdout, "| ring | 1.60 (1.50–1.70) | 6,758 | 12 % (-4 to 30 %) |\nstep 3.\n")

    def test_units_and_sentences(self):
        r = merge("- x 2.45× [1.1× at equal compute]. Wins here.\n",
                  "- x 2.10× [1.3× at equal compute]. Loses here.\n",
                  "- x 2.60× [0.9× at equal compute]. Wins here.\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "- x 2.45× (2.10–2.60×) [1.1× (0.9–1.3×) at equal compute]. "
                                   "Wins here. (2 of 3 repeats) | Loses here. (1 of 3 repeats)\n")

    def test_table_cell_whose_words_differ(self):
        r = merge("| a | 5 | reached |\n", "| a | 7 | - |\n", "| a | 6 | reached |\n")
        self.assertEqual(r.stdout, "| a | 6 (5–7) | reached / - |\n")

    def test_different_shapes_are_one_error_line(self):
        r = merge("a\nb\n", "a\n")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("different numbers of lines", r.stderr)


if __name__ == "__main__":
    unittest.main()
