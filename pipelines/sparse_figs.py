#!/usr/bin/env python3
"""Arithmetic behind the issue-16 tables of `make repro-oktopk` / `make repro-deft` that no
gradkit tool computes: it only reads what the tools wrote (tensor/1 traces and selections,
metrics/1 tables) and prints Markdown (or CSV) tables. Run with the repo's venv
(.venv/bin/python: numpy, pyarrow, pandas).

Subcommands:
  threshold TRACE SEL METRICS --density D [--label NAME]
      Rebuild gradselect's error-feedback accumulators (acc_t = residual_{t-1} + g_t; the
      residual is acc_t with the selected entries zeroed, docs/gradselect.md) from the dense
      trace and the selection, and compare the threshold the method recorded for each step with
      the true k-th largest |acc_t| of the same accumulator. Checks on the way that the
      selection is exactly {|acc| > threshold} (threshold steps) or has k entries (exact steps).
  xi TRACE RED METRICS --density D [--label NAME] [--csv OUT]
      Ok-Topk Assumption 1 along a run of `gradallreduce --algo oktopk` on the dense TRACE:
      rebuild every rank's accumulator with Algorithm 2's residual rule (an entry leaves rank
      i's residual iff i selected it and it is in the global result u_t), taking rank i's local
      selection from its recorded local `threshold` ({|acc| > th}, or the exact top-k on
      re-evaluation steps), check that u_t[j] = sum of acc_i[j] over the ranks that selected j,
      and report xi_t = ||Topk_k(mean_i acc_i) - u_t/P|| / ||mean_i g_i||.
  deviation METRICS... [--quarters]
      Mean |nnz - k|/k of gradselect metrics per run (and per quarter of the steps).
  errnorm TRACE --density D (--red RED --rule result|sent | --simulate topk-union|cltk
          [--tool-metrics M]) --label L
      DEFT Figs. 5/6: the error norm (1/P) sum_i ||e_i|| per step (see cmd_errnorm).
  balance METRICS...
      Fig. 7b: busiest rank's bytes with and without data balancing on the steps where the
      paper's rule (max buffer > 4x mean) fired.
"""
import argparse
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq


# ---------------------------------------------------------------- reading the tools' files
def layout(df):
    lay = df.groupby("layer_id")["numel"].first().sort_index()
    off = np.concatenate([[0], np.cumsum(lay.values)[:-1]]).astype(np.int64)
    return dict(zip(lay.index, off)), int(lay.sum())


def load_dense(path):
    """{(step, rank): flat float32 array}, layers concatenated by layer_id."""
    df = pq.read_table(path, columns=["step", "rank", "layer_id", "numel", "values"]).to_pandas()
    off, n = layout(df)
    out = {}
    for (s, r), g in df.groupby(["step", "rank"]):
        a = np.zeros(n, dtype=np.float32)
        for lid, v in zip(g["layer_id"], g["values"]):
            a[off[lid]:off[lid] + len(v)] = np.asarray(v, dtype=np.float32)
        out[(int(s), int(r))] = a
    return out, n


def load_sparse(path, offsets=None):
    """{(step, rank): (flat indices int64, values float32)}."""
    df = pq.read_table(path, columns=["step", "rank", "layer_id", "numel", "indices", "values"]).to_pandas()
    off, n = layout(df)
    if offsets is not None:
        off = offsets
    out = {}
    for (s, r), g in df.groupby(["step", "rank"]):
        idx, val = [], []
        for lid, i, v in zip(g["layer_id"], g["indices"], g["values"]):
            if i is None or len(i) == 0:
                continue
            idx.append(np.asarray(i, dtype=np.int64) + off[lid])
            val.append(np.asarray(v, dtype=np.float32))
        if idx:
            out[(int(s), int(r))] = (np.concatenate(idx), np.concatenate(val))
        else:
            out[(int(s), int(r))] = (np.zeros(0, np.int64), np.zeros(0, np.float32))
    return out, n


def load_metrics(paths):
    """metrics/1 rows with a phase's rows named `metric:phase` (the file keeps the phase in its
    own column, empty for a step's total)."""
    df = pd.concat([pq.read_table(p).to_pandas() for p in paths], ignore_index=True)
    if "phase" in df:
        ph = df["phase"].fillna("")
        df["metric"] = df["metric"].where(ph == "", df["metric"] + ":" + ph)
    return df


def wide(m, index=("run", "step", "rank")):
    return m.pivot_table(index=list(index), columns="metric", values="value", aggfunc="first").reset_index()


def write_metrics(path, run, algo, P, d, cols, args):
    """metrics/1 rows (rank 0), so that gradreport can table and plot them."""
    import pyarrow as pa
    recs = [(run, "sparse_figs", algo, P, int(r.step), 0, c, float(getattr(r, c)))
            for r in d.itertuples() for c in cols]
    cols_ = list(zip(*recs))
    schema = pa.schema([("run", pa.string(), False), ("tool", pa.string(), False),
                        ("algo", pa.string(), False), ("world_size", pa.uint32(), False),
                        ("step", pa.uint32(), False), ("rank", pa.uint32(), False),
                        ("metric", pa.string(), False), ("value", pa.float64(), False)],
                       metadata={"gradkit.schema": "metrics/1",
                                 "gradkit.producer": "pipelines/sparse_figs.py " + " ".join(sys.argv[1:])})
    t = pa.Table.from_arrays([pa.array(c) for c in cols_], schema=schema)
    pq.write_table(t, path)


def kth_largest(absv, k):
    if k >= len(absv):
        return float(absv.min())
    return float(np.partition(absv, len(absv) - k)[len(absv) - k])


def topk_idx(absv, k):
    """k largest, ties to the lower index (as gradkit's topk)."""
    if k >= len(absv):
        return np.arange(len(absv))
    kth = kth_largest(absv, k)
    above = np.flatnonzero(absv > kth)
    ties = np.flatnonzero(absv == kth)[: k - len(above)]
    return np.sort(np.concatenate([above, ties]))


def md(df, floatfmt="{:.4g}"):
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---" if df[c].dtype == object else "---:" for c in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            cells.append(floatfmt.format(v) if isinstance(v, (float, np.floating)) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def Z(density):
    """z(1 - density/2) of the standard normal, as gaussiank's threshold uses."""
    from statistics import NormalDist
    return NormalDist().inv_cdf(1 - density / 2)


def k_of(n, density):
    return max(1, int(np.floor(density * n)))


# ---------------------------------------------------------------- threshold vs true k-th
def cmd_threshold(a):
    g, n = load_dense(a.trace)
    lay = pq.read_table(a.trace, columns=["layer_id", "numel"]).to_pandas()
    off, _ = layout(lay)
    sel, _ = load_sparse(a.sel, off)
    m = wide(load_metrics([a.metrics]))
    mi = m.set_index(["step", "rank"])
    k = k_of(n, a.density)
    steps = sorted({s for s, _ in g})
    ranks = sorted({r for _, r in g})
    res = {r: np.zeros(n, np.float32) for r in ranks}
    rows, bad = [], 0
    for s in steps:
        for r in ranks:
            acc = res[r] + g[(s, r)]
            absv = np.abs(acc)
            idx, _ = sel.get((s, r), (np.zeros(0, np.int64), None))
            mr = mi.loc[(s, r)]
            th = float(mr["threshold"])
            exact = int(mr.get("exact_topk", 0)) == 1
            true = kth_largest(absv, k)
            if not exact:
                # the selected set must be exactly {|acc| > th} (float32 compare)
                want = np.flatnonzero(absv > np.float32(th))
                if len(want) != len(idx) or not np.array_equal(want, idx):
                    bad += 1
            res[r] = acc.copy()
            res[r][idx] = 0
            a64 = acc.astype(np.float64)
            fit = abs(a64.mean()) + Z(a.density) * a64.std()
            rows.append(dict(step=s, rank=r, exact=exact, nnz=len(idx), threshold=th, true_kth=true, fit=fit,
                             passing_true=int((absv > np.float32(th)).sum())))
    d = pd.DataFrame(rows)
    d["ratio"] = d.threshold / d.true_kth
    d["fit_ratio"] = d.fit / d.true_kth
    if a.csv:
        d.to_csv(a.csv, index=False)
    reuse = d[~d.exact]
    label = a.label or a.sel
    print(f"{label}\t{k}\t{len(d)}\t{bad}\t{reuse.ratio.median() if len(reuse) else float('nan'):.4g}\t"
          f"{reuse.ratio.min() if len(reuse) else float('nan'):.4g}\t{reuse.ratio.max() if len(reuse) else float('nan'):.4g}\t"
          f"{(d.nnz / k).median():.4g}\t{d.fit_ratio.median():.4g}")
    if bad:
        print(f"warning: {label}: {bad} (step, rank) selections are not {{|acc| > threshold}} "
              "for the rebuilt accumulator", file=sys.stderr)


# ---------------------------------------------------------------- xi of Assumption 1
def cmd_xi(a):
    g, n = load_dense(a.trace)
    lay = pq.read_table(a.trace, columns=["layer_id", "numel"]).to_pandas()
    off, _ = layout(lay)
    red, _ = load_sparse(a.red, off)
    m = wide(load_metrics([a.metrics]))
    mi = m.set_index(["step", "rank"])
    k = k_of(n, a.density)
    steps = sorted({s for s, _ in g})
    ranks = sorted({r for _, r in g})
    P = len(ranks)
    res = {r: np.zeros(n, np.float32) for r in ranks}
    rows = []
    worst_rel = 0.0
    for s in steps:
        accs, sels = {}, {}
        for r in ranks:
            acc = res[r] + g[(s, r)]
            accs[r] = acc
            mr = mi.loc[(s, r)]
            lnnz = int(mr["local_nnz"])
            th = float(mr["threshold"])
            absv = np.abs(acc)
            thr = np.flatnonzero(absv > np.float32(th))
            # a re-evaluation step is an exact top-k (ties to the lower index); a reuse step is
            # {|acc| > th}; the recorded local_nnz tells which one the rank ran
            sels[r] = thr if len(thr) == lnnz else topk_idx(absv, lnnz)
        ui, uv = red.get((s, ranks[0]), (np.zeros(0, np.int64), np.zeros(0, np.float32)))
        # check: u_t[j] = sum over the ranks that selected j of acc_i[j]
        rebuilt = np.zeros(len(ui), np.float64)
        for r in ranks:
            mask = np.isin(ui, sels[r], assume_unique=True)
            rebuilt[mask] += accs[r][ui[mask]]
        scale = max(1e-30, float(np.abs(uv).max()) if len(uv) else 1.0)
        rel = float(np.abs(rebuilt - uv).max() / scale) if len(uv) else 0.0
        worst_rel = max(worst_rel, rel)
        # Algorithm 2: entries that this rank selected and that made the global result leave
        for r in ranks:
            leave = np.intersect1d(sels[r], ui, assume_unique=True)
            nr = accs[r].copy()
            nr[leave] = 0
            res[r] = nr
        mean_acc = np.mean([accs[r].astype(np.float64) for r in ranks], axis=0)
        mean_g = np.mean([g[(s, r)].astype(np.float64) for r in ranks], axis=0)
        ideal = np.zeros(n)
        ti = topk_idx(np.abs(mean_acc), k)
        ideal[ti] = mean_acc[ti]
        got = np.zeros(n)
        got[ui] = uv.astype(np.float64) / P
        # exact second operator Topk((1/P) sum_i Topk_k(acc_i)) on the same accumulators
        inner = np.zeros(n)
        for r in ranks:
            tk = topk_idx(np.abs(accs[r]), k)
            inner[tk] += accs[r][tk]
        inner /= P
        ei = topk_idx(np.abs(inner), k)
        exact2 = np.zeros(n)
        exact2[ei] = inner[ei]
        gn = np.linalg.norm(mean_g)
        rows.append(dict(step=s, xi=np.linalg.norm(ideal - got) / gn,
                         xi_exact=np.linalg.norm(ideal - exact2) / gn,
                         u_nnz=len(ui), k=k, rel_err=rel))
    d = pd.DataFrame(rows)
    if a.csv:
        d.to_csv(a.csv, index=False)
    label = a.label or a.red
    if a.metrics_out:
        write_metrics(a.metrics_out, label, "oktopk", P, d, ["xi", "xi_exact"], a)
    print(f"{label}\t{P}\t{k}\t{len(steps)}\t{worst_rel:.2e}\t" + "\t".join(
        f"{d.xi[q].median():.3g}" for q in np.array_split(np.arange(len(d)), 4)) +
        f"\t{d.xi.max():.3g}\t{d.xi_exact.median():.3g}")
    if worst_rel > 1e-4:
        print(f"warning: {label}: the rebuilt u_t differs from gradallreduce's by {worst_rel:.2e} "
              "(relative): the accumulators are not the run's", file=sys.stderr)


# ---------------------------------------------------------------- DEFT error norm
def cmd_errnorm(a):
    """||e_t|| = (1/P) sum_i ||e_i,t|| (DEFT Eq. 2) along a run.

    --red RED --rule R: the accumulators of a gradallreduce run on the dense TRACE, rebuilt with
    the reducer's residual rule (result: every entry of u_t leaves every rank's residual, DEFT
    Alg. 1; sent: rank i's own exact top-k leaves, TopkA), checked against u_t.
    --simulate topk-union|cltk: computed here from the trace with DEFT Alg. 1's loop (every rank
    zeroes the gathered index set): Top-k = union of every rank's exact top-k, CLT-k = the
    cyclic leader's (rank t mod P) exact top-k.
    --tool-metrics M (with --simulate): the metrics/1 of `gradallreduce --algo topk-union|cltk`
    on the same TRACE; the row is the tool's (error norm = mean over ranks of its
    `residual_norm`, build-up = its result's `nnz` / k) and the worst-difference column is the
    largest relative difference per step between the tool's error norm and the simulation's.
    """
    g, n = load_dense(a.trace)
    lay = pq.read_table(a.trace, columns=["layer_id", "numel"]).to_pandas()
    off, _ = layout(lay)
    k = k_of(n, a.density)
    steps = sorted({s for s, _ in g})
    ranks = sorted({r for _, r in g})
    P = len(ranks)
    red = load_sparse(a.red, off)[0] if a.red else None
    res = {r: np.zeros(n, np.float32) for r in ranks}
    rows, worst = [], 0.0
    for s in steps:
        accs = {r: res[r] + g[(s, r)] for r in ranks}
        if red is not None:
            ui, uv = red.get((s, ranks[0]), (np.zeros(0, np.int64), np.zeros(0, np.float32)))
            if a.rule == "result":
                rebuilt = sum(accs[r][ui].astype(np.float64) for r in ranks)
                leave = {r: ui for r in ranks}
            else:
                sel = {r: topk_idx(np.abs(accs[r]), k) for r in ranks}
                rebuilt = np.zeros(len(ui))
                for r in ranks:
                    mask = np.isin(ui, sel[r], assume_unique=True)
                    rebuilt[mask] += accs[r][ui[mask]]
                leave = sel
            if len(uv):
                worst = max(worst, float(np.abs(rebuilt - uv).max() / max(1e-30, np.abs(uv).max())))
            union = len(ui)
        elif a.simulate == "topk-union":
            sel = [topk_idx(np.abs(accs[r]), k) for r in ranks]
            ui = np.unique(np.concatenate(sel))
            leave = {r: ui for r in ranks}
            union = len(ui)
        else:  # cltk
            ui = topk_idx(np.abs(accs[ranks[s % P]]), k)
            leave = {r: ui for r in ranks}
            union = len(ui)
        for r in ranks:
            e = accs[r].copy()
            e[leave[r]] = 0
            res[r] = e
        norm = float(np.mean([np.linalg.norm(res[r].astype(np.float64)) for r in ranks]))
        rows.append(dict(step=s, error_norm=norm, buildup=union / k))
    d = pd.DataFrame(rows)
    if a.tool_metrics:
        w = wide(load_metrics([a.tool_metrics]), index=("step", "rank"))
        if "residual_norm" not in w.columns:
            sys.exit(f"error: --tool-metrics {a.tool_metrics}: no residual_norm metric (error feedback off?)")
        tool = w.groupby("step").agg(error_norm=("residual_norm", "mean"), nnz=("nnz", "first"),
                                     ranks=("rank", "nunique"))
        if sorted(tool.index) != steps or (tool.ranks != P).any():
            sys.exit(f"error: --tool-metrics {a.tool_metrics}: not a run over the trace's {len(steps)} steps "
                     f"and {P} ranks")
        sim = d.set_index("step")
        worst = float((np.abs(tool.error_norm - sim.error_norm) / sim.error_norm.clip(lower=1e-30)).max())
        d = pd.DataFrame(dict(step=steps, error_norm=tool.error_norm.loc[steps].values,
                              buildup=tool.nnz.loc[steps].values / k))
    label = a.label
    if a.metrics_out:
        write_metrics(a.metrics_out, label, a.algo or label, P, d, ["error_norm", "buildup"], a)
    q = np.array_split(np.arange(len(d)), 4)
    checked = red is not None or a.tool_metrics
    print(f"{label}\t{P}\t{k}\t{len(steps)}\t" + (f"{worst:.2e}" if checked else "-") + "\t" +
          "\t".join(f"{d.error_norm[i].mean():.4g}" for i in q) + f"\t{d.error_norm.iloc[-1]:.4g}\t{d.buildup.mean():.3g}")
    if worst > 1e-4:
        what = "error norm" if a.tool_metrics else "rebuilt u_t"
        print(f"warning: {label}: the {what} differs from gradallreduce's by {worst:.2e}", file=sys.stderr)


# ---------------------------------------------------------------- count deviation
def cmd_deviation(a):
    m = wide(load_metrics(a.metrics))
    m["dev"] = (m.nnz - m.k_target).abs() / m.k_target
    out = []
    for run, g in m.groupby("run", sort=False):
        s = sorted(g.step.unique())
        q = np.array_split(np.array(s), 4)
        row = dict(run=run, k=int(g.k_target.median()), steps=len(s),
                   mean_dev_pct=100 * g.dev.mean(),
                   mean_nnz_over_k=(g.nnz / g.k_target).mean())
        for i, qs in enumerate(q):
            row[f"q{i + 1}_pct"] = 100 * g[g.step.isin(qs)].dev.mean()
        out.append(row)
    d = pd.DataFrame(out)
    print(d.to_csv(index=False, float_format="%.4g"), end="")


# ---------------------------------------------------------------- Fig. 7b
def cmd_balance(a):
    m = load_metrics(a.metrics)
    w = wide(m)
    w["bal_bytes"] = w.get("bytes_sent:balance_and_allgatherv", np.nan)
    w["bal_recv"] = w.get("bytes_recv:balance_and_allgatherv", np.nan)
    w["bal_time"] = w.get("time_s:balance_and_allgatherv", np.nan)
    # steps where the paper's rule fired: the `auto` run balanced
    src = wide(load_metrics([a.fired_from])) if a.fired_from else w
    auto = src[src.run.str.endswith("auto")]
    fired = sorted(auto[auto.balanced == 1].step.unique())
    print(f"fired\t{len(fired)}\t{len(auto.step.unique())}")
    # repetitions of one configuration are named RUN-1, RUN-2, …: pooled, one sample per (rep, step)
    w["rep"] = w.run.str.extract(r"-(\d+)$", expand=False).fillna("0")
    w["run"] = w.run.str.replace(r"-\d+$", "", regex=True)
    for run, g in w.groupby("run", sort=False):
        f = g[g.step.isin(fired)]
        per_step = f.groupby(["rep", "step"]).agg(max_bal=("bal_bytes", "max"), max_bal_recv=("bal_recv", "max"),
                                         max_total=("bytes_sent", "max"), sum_bal=("bal_bytes", "sum"),
                                         max_bal_time=("bal_time", "max"), max_time=("time_comm_s", "max"))
        reps = per_step.groupby(level="rep")["max_bal_time"].median()
        print("\t".join([run] + [f"{per_step[c].median():.6g}" for c in
                                 ("max_bal", "max_bal_recv", "max_total", "sum_bal", "max_bal_time", "max_time")]
                         + [str(len(per_step)), " / ".join(f"{v:.3g}" for v in reps)]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("threshold")
    t.add_argument("trace"); t.add_argument("sel"); t.add_argument("metrics")
    t.add_argument("--density", type=float, required=True); t.add_argument("--label"); t.add_argument("--csv")
    x = sub.add_parser("xi")
    x.add_argument("trace"); x.add_argument("red"); x.add_argument("metrics")
    x.add_argument("--density", type=float, required=True); x.add_argument("--label"); x.add_argument("--csv")
    x.add_argument("--metrics-out", help="also write xi as metrics/1 (for gradreport)")
    d = sub.add_parser("deviation")
    d.add_argument("metrics", nargs="+")
    b = sub.add_parser("balance")
    b.add_argument("metrics", nargs="+")
    b.add_argument("--fired-from", help="metrics of the --balance auto run that says which steps fired")
    e = sub.add_parser("errnorm")
    e.add_argument("trace"); e.add_argument("--density", type=float, required=True)
    e.add_argument("--red"); e.add_argument("--rule", choices=["result", "sent"], default="result")
    e.add_argument("--simulate", choices=["topk-union", "cltk"]); e.add_argument("--label", required=True)
    e.add_argument("--algo"); e.add_argument("--metrics-out")
    e.add_argument("--tool-metrics", help="with --simulate: the metrics/1 of gradallreduce's run of that exchange")
    a = p.parse_args()
    if a.cmd == "errnorm" and (a.red is None) == (a.simulate is None):
        p.error("errnorm: give exactly one of --red and --simulate")
    if a.cmd == "errnorm" and a.tool_metrics and a.simulate is None:
        p.error("errnorm: --tool-metrics goes with --simulate")
    {"threshold": cmd_threshold, "xi": cmd_xi, "deviation": cmd_deviation, "balance": cmd_balance,
     "errnorm": cmd_errnorm}[a.cmd](a)


if __name__ == "__main__":
    main()
