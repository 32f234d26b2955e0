"""`median (min–max)` of repeated measurements, as the repro tables print them (one place for the
pipelines' tables: dense.sh, embrace.sh, embrace_fig7.py, sim_tables.py, bench/goals.py; and the
range alone, `span`, for merge_repeats.py and docs_check.py)."""
import statistics


def spread(xs, fmt="{:.1f}", unit=""):
    """The median of xs, and (min–max) when the values differ: formatted by
    FMT, UNIT after each ('1.51× (1.50–1.52×)'); a range with a negative end reads 'a to b'; no
    range where min and max print the same."""
    m = fmt.format(statistics.median(xs)) + unit
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    if lo == hi:  # equal as printed: no range
        return m
    return f"{m} {span(lo, hi, unit)}"


def span(lo, hi, unit=""):
    """`(lo–hi UNIT)` of two ends as printed; `(lo to hi UNIT)` where lo is negative ("-5.2–-1.7"
    would read as a subtraction). The one rule of spread(), merge_repeats.py and docs_check.py."""
    dash = " to " if lo.startswith("-") else "–"
    return f"({lo}{dash}{hi}{unit})"
