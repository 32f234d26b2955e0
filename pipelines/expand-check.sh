#!/usr/bin/env bash
# make repro-expand [FAST=1]: how well `gradtrace expand` makes P ranks from fewer (issue 44
# point 2, docs/SIMULATE.md § From P recorded ranks to any P). Real per-rank gradients of a
# gradtrain model (`gradtrace model`, MODELS, P ranks in-process, 4 steps); its ranks 0 and 1
# alone, expanded back to P; then, at density 1 %, the statistics that decide the sparse
# exchanges' volumes (each rank's L2 norm and k-th largest magnitude, the top-k overlap between
# ranks, the union of the ranks' top-k) and the bytes each algorithm sends, on the real P ranks
# and on the expanded ones. Writes the docs/RESULTS.md section "expand-check".
source "$(dirname "$0")/lib.sh"
OUT=$ROOT/data/out/expand-check
[ "$FAST" != 0 ] && OUT=$ROOT/data/out/expand-check-fast
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
if [ "$FAST" != 0 ]; then P=4; MODELS=mlp; else P=${P:-8}; MODELS=${MODELS:-"mlp cnn"}; fi
ALGOS="topka gtopk oktopk deft"
for m in $MODELS; do
  run $B/gradtrace model --model "$m" --data digits --ranks "$P" --steps 4 --seed 1 -q -o real-$m.parquet
  "$PY" - real-$m.parquet two-$m.parquet <<'PY'
import sys, pyarrow.compute as pc, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
pq.write_table(t.filter(pc.less(t["rank"], 2)), sys.argv[2])
PY
  run $B/gradtrace expand two-$m.parquet --ranks "$P" --seed 1 -q -o exp-$m.parquet
  for kind in real exp; do
    for a in $ALGOS; do
      run $B/gradallreduce --algo "$a" --density 0.01 --metrics m-$kind-$m-$a.parquet $kind-$m.parquet -o /dev/null
    done
  done
done
"$PY" - "$P" $MODELS > section.md <<'PY'
import sys, itertools, numpy as np, pyarrow.parquet as pq, pyarrow.compute as pc
P, models = int(sys.argv[1]), sys.argv[2:]
ALGOS = ["topka", "gtopk", "oktopk", "deft"]

def per_rank(path):
    """{step: [flat gradient of rank r]}, layers in layer_id order."""
    t = pq.read_table(path, columns=["step", "rank", "layer_id", "values"]).to_pandas()
    out = {}
    for (s, r), g in t.sort_values("layer_id").groupby(["step", "rank"]):
        out.setdefault(s, {})[r] = np.concatenate([np.asarray(v, dtype=np.float32) for v in g["values"]])
    return {s: [d[r] for r in sorted(d)] for s, d in out.items()}

def stats(grads):
    """Means over steps of: rank L2 norm, k-th magnitude, pairwise top-k Jaccard, |union|/k."""
    acc = {"norm": [], "kth": [], "jaccard": [], "union": []}
    for s, gs in grads.items():
        n = gs[0].size
        k = max(1, int(0.01 * n))
        tops = [set(np.argpartition(-np.abs(g), k - 1)[:k].tolist()) for g in gs]
        acc["norm"].append(np.mean([np.linalg.norm(g) for g in gs]))
        acc["kth"].append(np.mean([np.sort(np.abs(g))[-k] for g in gs]))
        acc["jaccard"].append(np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(tops, 2)]))
        acc["union"].append(len(set().union(*tops)) / k)
    return {key: float(np.mean(v)) for key, v in acc.items()}

def sent(path):
    t = pq.read_table(path).to_pandas()
    t = t[t.metric == "bytes_sent"]
    return float(t.groupby("step").value.mean().mean())

NAMES = {"norm": "L2 norm of a rank's gradient", "kth": "k-th largest magnitude (k = 1 % of n)",
         "jaccard": "top-k overlap between two ranks (Jaccard)", "union": "union of the ranks' top-k, ÷ k"}
print(f"Real per-rank gradients of gradtrain models on digits (`gradtrace model`, P = {P} ranks "
      "in-process, 4 steps, seed 1) against the same recording's ranks 0 and 1 expanded back to "
      f"P = {P} (`gradtrace expand --seed 1`: the recorded mean, shrunk by its noise share, plus Gaussian noise of the recorded spread per coordinate); means over the steps (pipelines/expand-check.sh). "
      "Bytes: `gradallreduce --algo A --density 0.01`, bytes sent per rank and step.\n")
print("| model | statistic | real | expanded from 2 | expanded ÷ real |")
print("|---|---|---:|---:|---:|")
worst = 1.0
for m in models:
    real, exp = stats(per_rank(f"real-{m}.parquet")), stats(per_rank(f"exp-{m}.parquet"))
    for key in NAMES:
        r = exp[key] / real[key]
        print(f"| {m} | {NAMES[key]} | {real[key]:.4g} | {exp[key]:.4g} | {r:.2f} |")
    for a in ALGOS:
        br, be = sent(f"m-real-{m}-{a}.parquet"), sent(f"m-exp-{m}-{a}.parquet")
        worst = max(worst, be / br, br / be)
        print(f"| {m} | {a}: bytes sent per rank and step | {br:,.0f} | {be:,.0f} | {be / br:.2f} |")
print(f"\nThe exchanges' volumes on the expanded ranks are within {worst:.2f}× of the real ranks' "
      "(the worst over models and algorithms).")
PY
section expand-check section.md
[ "$FAST" != 0 ] && expect section.md '\| topka: bytes' '\| oktopk: bytes' 'expanded ÷ real'
cat section.md
