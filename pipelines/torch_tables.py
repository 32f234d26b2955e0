"""docs/RESULTS.md § torch from `make repro-torch`'s JSON lines (pipelines/torch_bench.py, one
file per link rate): per model and exchange, the time per step, the time to reach the
`default` run's final loss, the final loss and held-out accuracy, and gradkit's bytes per step
and rank, each the median (min–max) over the repeats; and the verdicts of issue 43's goals,
each computed from the numbers it judges.

    python pipelines/torch_tables.py data/out/torch/*.jsonl > section.md
"""

import json
import os
import statistics
import sys
from collections import defaultdict

WARM = 3  # steps left out of the time per step (allocation, the first messages, DDP's rebuild)
SMOOTH = 5  # the loss is smoothed over this many steps before it is compared
REACH = 1.005  # "reaching" the default run's final loss: within 0.5 % of it (sums differ in order)


# What carried gradkit's messages (torch_bench.py --transport): rows written before the option
# existed carried them over the process group.
TRANSPORTS = {"torch": "the process group (gloo, `gradkit.torch.comm()`)",
              "mpi": "gradkit's MPI backend (`gradkit.mpi_comm()`)"}


def smoothed(v):
    return [statistics.fmean(v[max(0, i - SMOOTH + 1) : i + 1]) for i in range(len(v))]


def time_to(row, target):
    """Seconds of training until the smoothed loss is at or below `target`; None if never."""
    t = 0.0
    for s, loss in zip(row["step_s"], smoothed(row["loss"])):
        t += s
        if loss <= target:
            return t
    return None


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "not reached"
    mid = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt(mid)
    return f"{fmt(mid)} ({fmt(min(values))}–{fmt(max(values))})"


def per_run(row, target):
    steps = row["step_s"][WARM:] or row["step_s"]
    sent = row["bytes_sent"]
    return {
        "step_s": statistics.median(steps),
        "to_target": time_to(row, target),
        "final": smoothed(row["loss"])[-1],
        "acc": row["eval_accuracy"],
        "bytes": statistics.median(sent[1:] or sent) if sent else None,
    }


def table(rows, rate, model):
    by = defaultdict(dict)
    for r in rows:
        by[r["exchange"]][r["repeat"]] = r
    if "default" not in by:
        return [], {}
    order = ["default"] + [e for e in by if e != "default"]
    stats = {}
    for ex in order:
        stats[ex] = []
        for rep, r in sorted(by[ex].items()):
            base = by["default"].get(rep)
            if base is None:
                continue
            stats[ex].append(per_run(r, smoothed(base["loss"])[-1] * REACH))
    any_row = next(iter(by["default"].values()))
    p, n = any_row["ranks"], any_row["n"]
    ring_bytes = 2 * (p - 1) / p * 4 * n
    carriers = sorted({r.get("transport", "torch") for ex in by if ex != "default" for r in by[ex].values()})
    carried = " and ".join(TRANSPORTS.get(c, c) for c in carriers)
    lines = [
        f"**{model}, {rate}** (P = {p}, n = {n:,} parameters, {len(by['default'])} repeat(s), "
        f"{steps_of(by)}; gradkit's messages carried by {carried}; loss smoothed over {SMOOTH} steps, reached within {(REACH - 1) * 100:.1f} %):",
        "",
        "| exchange | time per step (ms) | × default | time to default's loss (s) | final loss | accuracy | bytes sent per step and rank |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base_step = statistics.median(s["step_s"] for s in stats["default"])
    for ex in order:
        s = stats[ex]
        if not s:
            continue
        b = spread([x["bytes"] for x in s], lambda v: f"{v:,.0f}")
        if ex == "default":
            b = f"*{ring_bytes:,.0f} (ring formula)*"
        lines.append(
            f"| {ex} | {spread([x['step_s'] * 1e3 for x in s], lambda v: f'{v:.1f}')} | "
            f"{statistics.median(x['step_s'] for x in s) / base_step:.2f} | "
            f"{spread([x['to_target'] for x in s], lambda v: f'{v:.2f}')} | "
            f"{spread([x['final'] for x in s], lambda v: f'{v:.3f}')} | "
            f"{spread([x['acc'] for x in s], lambda v: f'{v:.3f}')} | {b} |"
        )
    return lines, stats


def steps_of(by):
    """`50 steps`, or `default 50 steps, the others 150` where they differ."""
    n = {ex: len(next(iter(reps.values()))["step_s"]) for ex, reps in by.items()}
    others = {v for e, v in n.items() if e != "default"}
    if others == {n["default"]} or not others:
        return f"{n['default']} steps"
    return f"default {n['default']} steps, the others {'/'.join(str(v) for v in sorted(others))}"


def ratio(stats, ex, key):
    """Median over repeats of ex's `key` over default's, per repeat; None where missing."""
    pairs = list(zip(stats.get(ex, []), stats.get("default", [])))
    if not pairs or any(a[key] is None or not b[key] for a, b in pairs):
        return None  # not reached in every repeat
    return statistics.median(a[key] / b[key] for a, b in pairs)


def overhead(path):
    """The lines of the overhead measurement (pipelines/torch_overhead.py) and its verdicts."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by = defaultdict(list)
    for r in rows:
        by[r["exchange"]].append(r)
    if not by.get("ring") or not by.get("default"):
        return [], []
    skip = 2
    step = {ex: [statistics.median(r["step_s"][skip:]) for r in rs] for ex, rs in by.items()}
    outside = [statistics.median((h - c) / c for h, c in zip(r["hook_s"][skip:], r["comm_s"][skip:]))
               for r in by["ring"]]
    ratio = statistics.median(a / b for a, b in zip(step["ring"], step["default"]))
    over = statistics.median(outside)
    r0 = by["ring"][0]
    lines = [
        f"**The hook's overhead** (one 5000×5000 linear layer, n = {r0['n']:,} parameters in one "
        f"DDP bucket, P = {r0['ranks']} ranks on this machine, {len(by['ring'])} repeat(s)): a "
        f"step takes {spread([v * 1e3 for v in step['default']], lambda v: f'{v:.0f}')} ms with "
        f"DDP's own allreduce and {spread([v * 1e3 for v in step['ring']], lambda v: f'{v:.0f}')} ms "
        f"with gradkit's `ring` as the hook; the hook spends "
        f"{spread([v * 100 for v in outside], lambda v: f'{v:.1f}')} % of its reduction's time "
        "outside it (the bucket's layout and Python: the bucket is reduced where it lies; the "
        "reduction's time includes the mean's pass, which counts `nnz` on its way).",
        "",
    ]
    verdicts = [
        f"- The hook's `ring` over gloo within 1.3× of DDP's own allreduce, the same bucket, one "
        f"host: {ratio:.2f}× per step — {'met' if ratio <= 1.3 else 'not met'}",
        f"- The hook's cost outside the reduction under 5 % of a 25 M-parameter exchange: "
        f"{over * 100:.1f} % — {'met' if over < 0.05 else 'not met'}",
    ]
    return lines, verdicts


def main(paths):
    out = [
        "Generated by `make repro-torch` (pipelines/repro-torch.sh, pipelines/torch_tables.py): "
        "real PyTorch models trained under torch.distributed (gloo) with DDP's own allreduce "
        "(`default`: bucketed and overlapped with the backward pass, the papers' DenseOvlp), "
        "gradkit's reducers as DDP's communication hook (density 1 % for the sparse ones) and "
        "gradkit's 1-bit Adam (no DDP). `local`: the ranks on this machine, no shaping; the "
        "rates: one rank per shaped host (docs/CLUSTER.md). The hosts share this machine's "
        "2 cores, so compute is slower than on real hosts and the ratios are this machine's.",
        "",
    ]
    verdicts = []

    def order(path):  # local, then the rates from slow to fast, the long runs after their rate
        name = os.path.basename(path).rsplit(".", 1)[0]
        rate = name.split("-")[0]
        if rate in ("local", "overhead"):
            return (rate == "overhead", 0.0, name)
        return (False, float(rate[:-4]) * (1e9 if rate.endswith("gbit") else 1e6), name)

    for path in sorted(paths, key=order):
        rate = os.path.basename(path).rsplit(".", 1)[0]
        if rate == "overhead":
            lines, v = overhead(path)
            out += lines
            verdicts += v
            continue
        rows = [json.loads(line) for line in open(path) if line.strip()]
        for model in sorted({r["model"] for r in rows}):
            lines, stats = table([r for r in rows if r["model"] == model], rate, model)
            out += lines + [""]
            if rate == "local" and model == "cnn":
                base = statistics.median(x["acc"] for x in stats["default"])
                for ex in ("topka", "oktopk", "onebit-adam"):
                    if stats.get(ex):
                        acc = statistics.median(x["acc"] for x in stats[ex])
                        verdicts.append(
                            f"- {ex} within 2 % of DDP-default's final accuracy in the same steps (CNN, "
                            f"{len(stats[ex])} seeds, {len(rows[0]['step_s'])} steps): {acc:.3f} vs {base:.3f} — "
                            f"{'met' if acc >= 0.98 * base else 'not met'}")
            ok = ratio(stats, "oktopk", "to_target")
            long_run = any(os.path.basename(p).startswith("100mbit-long") for p in paths)
            if rate == ("100mbit-long" if long_run else "100mbit") and model == "cnn":
                verdicts.append(
                    "- Ok-Topk's time to the dense loss at most 0.5× DDP-default's (CNN, 100 Mbit/s): "
                    + ("not reached by Ok-Topk in every repeat of the run" if ok is None else
                       f"{ok:.2f}× — {'met' if ok <= 0.5 else 'not met'}")
                )
    if verdicts:
        out += ["Issue 43's goals, judged from the tables above:", ""] + verdicts + [""]
    print("\n".join(out).rstrip())


if __name__ == "__main__":
    main(sys.argv[1:])
