"""The error bar of the SimGrid replay against the shaped cluster, as a factor (issue 44
point 4): each row's error is max(sim/meas, meas/sim), so a replay 12.5× too fast counts as
much as one 12.5× too slow (|sim/meas − 1| capped an under-estimate at 100 %). One summary per
link rate and algorithm family, written by pipelines/sim_tables.py under its table and checked
against the table by pipelines/docs_check.py (fragment `sim-error-bar`)."""

import statistics

DENSE = ("ring", "rabenseifner")


def factor(ratio):
    """How far a simulated/measured ratio is from 1, over- and under-estimates alike."""
    return max(ratio, 1 / ratio)


def family(algo):
    return "dense" if algo in DENSE else "sparse, 1-bit, AlltoAll"


def rate_bits(rate):
    """`100mbit` → 1e8: link rates in their order."""
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult
    return float("inf")


CORES = 2  # the machine the validation ran on (docs/CLUSTER.md: every shaped host shares its cores)


def describe(rows):
    """One sentence per link rate from (rate, P, algorithm, sim/meas, α-β/meas) rows: the median
    and worst factor of the calibrated replay, per family, the rows within 1.25× and 2×, and the
    α-β model's median factor beside it."""
    out = []
    for rate in sorted({r[0] for r in rows}, key=rate_bits):
        mine = [r for r in rows if r[0] == rate]
        f = [factor(r[3]) for r in mine]
        worst = max(mine, key=lambda r: factor(r[3]))
        fams = []
        for fam in ("dense", "sparse, 1-bit, AlltoAll"):
            g = [factor(r[3]) for r in mine if family(r[2]) == fam]
            if g:
                fams.append(f"{fam} {statistics.median(g):.2f}× (worst {max(g):.2f}×)")
        side = "too fast" if worst[3] < 1 else "too slow" if worst[3] > 1 else "exact"
        # Per P: where the ranks outnumber this machine's 2 cores, the measured runs wait for
        # cores as well as links, which a replay of the links alone cannot know.
        by_p = []
        for p in sorted({int(r[1]) for r in mine}):
            g = [factor(r[3]) for r in mine if int(r[1]) == p]
            note = f" ({p // CORES} ranks per core)" if p > CORES else ""
            by_p.append(f"P = {p}{note} {statistics.median(g):.2f}× (worst {max(g):.2f}×)")
        out.append(
            f"{rate}: median factor {statistics.median(f):.2f}×, worst {factor(worst[3]):.2f}× ({worst[2]} at "
            f"P = {worst[1]}, {side}); by family {', '.join(fams)}; by ranks {', '.join(by_p)}; "
            f"{sum(x <= 1.25 for x in f)} of {len(f)} rows "
            f"within 1.25×, {sum(x <= 2 for x in f)} within 2×; the α-β model on the same messages: median "
            f"{statistics.median(factor(r[4]) for r in mine):.2f}×"
        )
    return "; ".join(out)
