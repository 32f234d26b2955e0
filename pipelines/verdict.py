"""The word for a measured speedup judged against a paper's claim, by one rule that tells a tie
from a win (issue 44 point 6): used by the pipelines that print verdicts (embrace_fig7.py) and
by docs_check.py, which recomputes the words from the numbers printed beside them.

A win needs every repeat above 1.00× and the median at least 1 + TIE (3 %: above the spread
of one configuration's step time between repeats, 0.6–4 % in the cluster tables); a loss
needs every repeat below 1.00× and the median at most 1 − TIE; anything else is a tie. The
numbers are taken as printed (two decimals), so the words can be checked from the page."""

TIE = 0.03

TIE_WORD = "tie (within 3 % of 1.00×, or a repeat on the other side: no speedup shown)"


def speedup_word(med, lo, hi, paper):
    """`med`, `lo`, `hi`: a speedup's median and its repeats' min and max (> 1: faster);
    `paper`: the paper's (low, high) range of the same speedup."""
    med, lo, hi = round(med, 2), round(lo, 2), round(hi, 2)
    if lo > 1.0 and med >= 1 + TIE:
        if paper[0] <= med <= paper[1]:
            return "reproduced (in the paper's range)"
        if med > paper[1]:
            return "direction (a win, faster than the paper's range)"
        return "direction (a win, below the paper's range)"
    if hi < 1.0 and med <= 1 - TIE:
        return "not reproduced (slower)"
    return TIE_WORD
