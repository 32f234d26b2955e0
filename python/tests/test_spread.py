"""pipelines/spread.py, the `median (min–max)` every repro table prints: the expected texts
are written out by hand."""

import os
import sys
import unittest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "pipelines"))
from spread import spread  # noqa: E402


class Spread(unittest.TestCase):
    def test_median_and_range(self):
        self.assertEqual(spread([1.52, 1.50, 1.51], "{:.2f}", "×"), "1.51× (1.50–1.52×)")

    def test_no_range_where_the_ends_print_the_same(self):
        self.assertEqual(spread([3.0, 3.0, 3.0]), "3.0")
        self.assertEqual(spread([1.0201, 1.0199, 1.02], "{:.2f}", "×"), "1.02×")

    def test_a_negative_end_reads_to(self):
        self.assertEqual(spread([-5.2, -1.7, -3.0]), "-3.0 (-5.2 to -1.7)")


if __name__ == "__main__":
    unittest.main()
