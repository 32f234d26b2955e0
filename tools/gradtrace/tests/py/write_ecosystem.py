"""Rewrites gradkit tables the way pandas, polars and pyarrow users do, for
tools/gradtrace/tests/gradtrace/ecosystem.rs to read back.

usage: write_ecosystem.py IN_DIR OUT_DIR
IN_DIR holds trace.parquet (tensor/1, dense and sparse rows), plan.parquet (plan/1, some `k`
null), metrics.parquet (metrics/1) and digits.parquet (gradtrain's data file). Each output is
written by the library itself, with its defaults, and checked here to have the property it is
meant to cover (a large type, a Null column, no `gradkit.schema` key, a codec), so that a
change in pandas or polars cannot make a test pass vacuously.
"""
import os
import sys

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


def field_type(name, column):
    return pq.read_schema(path(name)).field(column).type


def check_no_schema_key(name):
    kv = pq.ParquetFile(path(name)).metadata.metadata or {}
    schema_md = pq.read_schema(path(name)).metadata or {}
    assert b"gradkit.schema" not in kv and b"gradkit.schema" not in schema_md, name


def codec(name):
    return pq.ParquetFile(path(name)).metadata.row_group(0).column(0).compression


trace = pd.read_parquet(os.path.join(src, "trace.parquet"))

# pandas round trip: LargeUtf8 `layer` (pandas' str dtype), the schema key dropped.
trace.to_parquet(path("pandas_tensor.parquet"))
check_no_schema_key("pandas_tensor.parquet")
assert field_type("pandas_tensor.parquet", "layer") == pa.large_string()

# A DataFrame built from Python ints: Int64 scalars and List<Int64> shape/indices.
ints = trace.astype({"step": "int64", "rank": "int64", "layer_id": "int64", "numel": "int64"})
for c in ["shape", "indices"]:
    ints[c] = [None if v is None else [int(x) for x in v] for v in ints[c]]
ints.to_parquet(path("pandas_int64.parquet"))
assert field_type("pandas_int64.parquet", "step") == pa.int64()
assert field_type("pandas_int64.parquet", "indices") == pa.list_(pa.int64())

# Only the dense rows: every `indices` is None, which pandas writes as a column typed Null;
# an index that is not a range is written as an extra `__index_level_0__` column.
dense = trace[trace["indices"].isna()].copy()
dense.index = [f"row{i}" for i in range(len(dense))]
dense.to_parquet(path("pandas_dense.parquet"))
assert field_type("pandas_dense.parquet", "indices") == pa.null()
assert "__index_level_0__" in pq.read_schema(path("pandas_dense.parquet")).names

# polars round trip: LargeUtf8 and LargeList, the schema key dropped, zstd.
pl.read_parquet(os.path.join(src, "trace.parquet")).write_parquet(path("polars_tensor.parquet"))
check_no_schema_key("polars_tensor.parquet")
assert field_type("polars_tensor.parquet", "values") == pa.large_list(pa.float32())
assert field_type("polars_tensor.parquet", "layer") in (pa.large_string(), pa.string_view())

# plan/1 through pandas: `k` with nulls becomes Float64 (pandas has no nullable int by default).
pd.read_parquet(os.path.join(src, "plan.parquet")).to_parquet(path("pandas_plan.parquet"))
assert field_type("pandas_plan.parquet", "k") == pa.float64()
check_no_schema_key("pandas_plan.parquet")
# metrics/1 through polars.
pl.read_parquet(os.path.join(src, "metrics.parquet")).write_parquet(
    path("polars_metrics.parquet"))
check_no_schema_key("polars_metrics.parquet")

# gradtrain's data file through pandas and polars (LargeList features, LargeUtf8 split).
digits = os.path.join(src, "digits.parquet")
pd.read_parquet(digits).to_parquet(path("digits_pandas.parquet"))
pl.read_parquet(digits).write_parquet(path("digits_polars.parquet"))
assert field_type("digits_polars.parquet", "features") == pa.large_list(pa.float32())
assert field_type("digits_pandas.parquet", "split") == pa.large_string()

# The codecs other writers use, written by pyarrow and polars (both write LZ4_RAW when asked
# for `lz4`; the test checks which codec each file really has).
table = pq.read_table(os.path.join(src, "trace.parquet"))
for c in ["gzip", "lz4", "lz4_raw", "brotli"]:
    pq.write_table(table, path(f"pyarrow_{c}.parquet"), compression=c)
pl.read_parquet(os.path.join(src, "trace.parquet")).write_parquet(
    path("polars_lz4.parquet"), compression="lz4")
assert codec("pyarrow_gzip.parquet") == "GZIP"
assert codec("pyarrow_brotli.parquet") == "BROTLI"
assert codec("pyarrow_lz4.parquet").startswith("LZ4")

# Files that must be refused, naming the column (and the row).
bad = ints.copy()
bad.loc[bad.index[5], "step"] = -1
bad.to_parquet(path("pandas_negative_step.parquet"))
f64 = trace.copy()
f64["values"] = [np.asarray(v, dtype=np.float64) for v in f64["values"]]
f64.to_parquet(path("pandas_float64_values.parquet"))
assert field_type("pandas_float64_values.parquet", "values") == pa.list_(pa.float64())

print("ok")
