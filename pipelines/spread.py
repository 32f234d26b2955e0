"""`median (min–max)` of repeated measurements, as the repro tables print them (one place for the
pipelines' inline tables: pipelines/dense.sh, embrace.sh, embrace_fig7.py)."""
import statistics


def spread(xs, fmt="{:.1f}", unit=""):
    """The median of xs, and (min–max) when the values differ: formatted by
    FMT, UNIT after each ('1.51× (1.50–1.52×)'); a range with a negative end reads 'a to b'; no
    range where min and max print the same."""
    m = fmt.format(statistics.median(xs)) + unit
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    if lo == hi:  # equal as printed: no range
        return m
    dash = " to " if min(xs) < 0 else "–"  # "-5.2–-1.7" would read as a subtraction
    return f"{m} ({lo}{dash}{hi}{unit})"
