#!/usr/bin/env python3
"""Tables of the closed-loop reproductions (`make repro-oktopk-closed`, `make repro-onebit-table3`)
from the metrics/1 files gradtrain wrote. Reads columns by name (run, step, rank, metric, value;
any other column is ignored) and prints Markdown. Run with the repo's venv (.venv/bin/python).

Subcommands:
  oktopk METRICS... [--series OUT.parquet]
      Ok-Topk Figs. 5-6 in training: per run, over the steps after the dense warm-up (rows
      whose metric `dense_warmup` is 1 are left out), the mean over steps and ranks of
      |local_nnz - k|/k (each rank's selection) and |nnz - k|/k (the global result), the mean
      nnz/k of both, and the mean, median and max of `xi` (Ok-Topk's Assumption 1). --series writes
      the per-step deviations (mean over ranks) as metrics/1 rows for `gradreport plot`.
  onebit METRICS... --group REGEX --freeze F
      1-bit LAMB Table 3: final eval_loss per run, grouped by the REGEX's first group of the
      run name (the variant; the rest is the seed): median, min-max and the seeds; and the
      median over seeds of the mean LAMB coefficient at the last step and of the variance
      norms at step F-1 (the last warm-up step) and at the last step.
"""
import argparse
import re
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

PAPER_DEV_PCT = 11.0  # Ok-Topk Fig. 6: average count deviation < 11 %


def load(paths):
    cols = ["run", "step", "rank", "metric", "value"]
    return pd.concat([pq.read_table(p, columns=cols).to_pandas() for p in paths], ignore_index=True)


def wide(m):
    return m.pivot_table(index=["run", "step", "rank"], columns="metric", values="value",
                         aggfunc="first").reset_index()


def oktopk_rows(w):
    """One summary row per run, over its sparse steps."""
    out = []
    for run, g in w.groupby("run", sort=False):
        if "dense_warmup" in g:
            warm = g[g.dense_warmup == 1].step.nunique()
            g = g[g.dense_warmup != 1]
        else:
            warm = 0
        g = g.dropna(subset=["k"])
        k = g.k
        xi = g.xi.dropna() if "xi" in g else pd.Series(dtype=float)
        quarters = np.array_split(np.array(sorted(g.step.unique())), 4)
        xi_q = [g[g.step.isin(q)].xi.median() if "xi" in g else float("nan") for q in quarters]
        out.append(dict(
            run=run, P=int(g["rank"].max()) + 1, k=int(k.median()), warm=warm, steps=g.step.nunique(),
            dev_local=100 * ((g.local_nnz - k).abs() / k).mean(),
            dev_global=100 * ((g.nnz - k).abs() / k).mean(),
            ratio_local=(g.local_nnz / k).mean(), ratio_global=(g.nnz / k).mean(),
            xi_mean=xi.mean() if len(xi) else float("nan"),
            xi_median=xi.median() if len(xi) else float("nan"),
            xi_q=" / ".join(f"{x:.3g}" for x in xi_q),
            xi_max=xi.max() if len(xi) else float("nan"),
        ))
    return out


def verdict(r):
    dev = "< 11 %" if max(r["dev_local"], r["dev_global"]) < PAPER_DEV_PCT else (
        "local only" if r["dev_local"] < PAPER_DEV_PCT else (
            "global only" if r["dev_global"] < PAPER_DEV_PCT else "≥ 11 %"))
    xi = "ξ < P" if r["xi_max"] < r["P"] else "ξ ≥ P"
    ok = dev == "< 11 %" and xi == "ξ < P"
    return ("reproduced" if ok else "not reproduced") + f" ({dev}; max {xi})"


def write_series(path, w):
    """Per-step |nnz − k|/k (mean over ranks) as metrics/1 rows of rank 0."""
    w = w[(w.get("dense_warmup", 0) != 1)].dropna(subset=["k"]).copy()
    w["dev_local_pct"] = 100 * (w.local_nnz - w.k).abs() / w.k
    w["dev_global_pct"] = 100 * (w.nnz - w.k).abs() / w.k
    cols = ["dev_local_pct", "dev_global_pct"] + (["xi"] if "xi" in w else [])
    s = w.groupby(["run", "step"])[cols].mean().reset_index()
    recs = [(r.run, "closed_loop.py", "oktopk", 1, int(r.step), 0, c, float(getattr(r, c)))
            for r in s.itertuples() for c in cols if not np.isnan(getattr(r, c))]
    schema = pa.schema([("run", pa.string(), False), ("tool", pa.string(), False),
                        ("algo", pa.string(), False), ("world_size", pa.uint32(), False),
                        ("step", pa.uint32(), False), ("rank", pa.uint32(), False),
                        ("metric", pa.string(), False), ("value", pa.float64(), False)],
                       metadata={"gradkit.schema": "metrics/1",
                                 "gradkit.producer": "pipelines/closed_loop.py oktopk --series"})
    pq.write_table(pa.Table.from_arrays([pa.array(c) for c in zip(*recs)], schema=schema), path)


def cmd_oktopk(a):
    w = wide(load(a.metrics))
    rows = oktopk_rows(w)
    print("| run | P | k | warm-up steps | sparse steps | mean \\|local nnz−k\\|/k | mean \\|global nnz−k\\|/k "
          "| mean local nnz/k | mean global nnz/k | ξ mean | ξ median | ξ median by quarter of the sparse steps | ξ max | verdict (paper: < 11 %, ξ < P) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['run']} | {r['P']} | {r['k']} | {r['warm']} | {r['steps']} | {r['dev_local']:.1f} % "
              f"| {r['dev_global']:.1f} % | {r['ratio_local']:.2f} | {r['ratio_global']:.2f} "
              f"| {r['xi_mean']:.3g} | {r['xi_median']:.3g} | {r['xi_q']} | {r['xi_max']:.3g} | {verdict(r)} |")
    if a.series:
        write_series(a.series, w)


def last_row(g, col):
    s = g.dropna(subset=[col]) if col in g else g.iloc[0:0]
    return s[s.step == s.step.max()][col].median() if len(s) else float("nan")


def at_step(g, col, step):
    s = g[(g.step == step)][col].dropna() if col in g else []
    return s.median() if len(s) else float("nan")


def cmd_onebit(a):
    raw = load(a.metrics)
    w = wide(raw)
    pat = re.compile(a.group)
    coeff_cols = [c for c in w.columns if isinstance(c, str) and c.startswith("lamb_coeff:")]
    per_run = []
    for run in raw.run.unique():  # the order of the files given
        g = w[w.run == run]
        m = pat.match(run)
        if not m:
            sys.exit(f"error: run '{run}' does not match --group {a.group}")
        last = g[g.step == g.step.max()]
        per_run.append(dict(
            variant=m.group(1), run=run, eval_loss=last_row(g, "eval_loss"), loss=last_row(g, "loss"),
            coeff=last[coeff_cols].median(axis=0).mean() if coeff_cols else float("nan"),
            v_freeze=at_step(g, "variance_norm", a.freeze - 1),
            vnorm=last_row(g, "variance_norm"), vfresh=last_row(g, "variance_fresh_norm")))
    d = pd.DataFrame(per_run)

    def f(x):
        return "–" if np.isnan(x) else f"{x:.4g}"
    print("| variant | seeds | final eval loss: median | min | max | final train loss (median) "
          "| mean LAMB coefficient, last step (median) "
          f"| variance_norm at step {a.freeze - 1} (median) | variance_norm, last step (median) "
          "| variance_fresh_norm, last step (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in d.variant.unique():
        g = d[d.variant == v]
        print(f"| {v} | {len(g)} | {g.eval_loss.median():.4f} | {g.eval_loss.min():.4f} | {g.eval_loss.max():.4f} "
              f"| {g.loss.median():.4f} | {f(g.coeff.median())} | {f(g.v_freeze.median())} "
              f"| {f(g.vnorm.median())} | {f(g.vfresh.median())} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("oktopk")
    o.add_argument("metrics", nargs="+")
    o.add_argument("--series")
    b = sub.add_parser("onebit")
    b.add_argument("metrics", nargs="+")
    b.add_argument("--group", required=True)
    b.add_argument("--freeze", type=int, required=True, help="the 1-bit warm-up steps (variance_norm at step FREEZE-1)")
    a = ap.parse_args()
    {"oktopk": cmd_oktopk, "onebit": cmd_onebit}[a.cmd](a)


if __name__ == "__main__":
    main()
