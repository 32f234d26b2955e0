"""The reading recipes of docs/FORMAT.md, run as written. Needs pandas, polars and duckdb
(not in the project venv): python format_examples.py TRACE.parquet METRICS.parquet"""
import sys

trace, metrics = sys.argv[1], sys.argv[2]

# --- pyarrow
import pyarrow.parquet as pq

t = pq.read_table(trace)
meta = {k.decode(): v.decode() for k, v in t.schema.metadata.items() if k.startswith(b"gradkit.")}
print(meta["gradkit.schema"], t.schema.field("values").type)
assert meta["gradkit.schema"] == "tensor/1"

# --- pandas
import numpy as np
import pandas as pd

df = pd.read_parquet(trace)
rows = df[(df["step"] == 0) & (df["rank"] == 0)].sort_values("layer_id")
flat = np.concatenate([
    v if i is None else np.bincount(i, weights=v, minlength=n).astype(np.float32)
    for v, i, n in zip(rows["values"], rows["indices"], rows["numel"])
])
print(flat.dtype, flat.shape)
print(df.groupby("layer", sort=False)["numel"].first().head())
m = pd.read_parquet(metrics)
print(m.pivot_table(index=["algo", "step"], columns="metric", values="value", aggfunc="mean"))

# --- polars
import polars as pl

p = pl.read_parquet(trace)
print(pl.read_parquet_metadata(trace)["gradkit.schema"])
print(
    p.group_by("layer_id", "layer", maintain_order=True)
    .agg(pl.col("values").list.len().sum().alias("stored"), pl.col("numel").first())
    .head()
)
print(pl.read_parquet(metrics).pivot(on="metric", index=["algo", "step", "rank"], values="value"))

# --- duckdb
import duckdb

print(duckdb.sql(f"SELECT decode(key) AS key, decode(value) AS value FROM parquet_kv_metadata('{trace}') WHERE decode(key) LIKE 'gradkit.%'").fetchall())
print(duckdb.sql(f"""
    SELECT layer, count(*) AS rows, sum(len("values")) AS stored,
           sqrt(sum(list_sum(list_transform("values", lambda x: x * x)))) AS l2
    FROM '{trace}' GROUP BY layer_id, layer ORDER BY layer_id LIMIT 5""").fetchall())
print(duckdb.sql(f"""
    SELECT step, rank, layer, unnest("values") AS v
    FROM '{trace}' WHERE step = 0 AND rank = 0 LIMIT 3""").fetchall())
print(duckdb.sql(f"SELECT algo, metric, avg(value) FROM '{metrics}' GROUP BY ALL ORDER BY ALL").fetchall())
