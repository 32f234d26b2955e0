"""Reads a gradtrace file with pyarrow, checks the DESIGN §2 tensor/1 schema and metadata,
and prints every row in a canonical text form (floats as hex bits) for the Rust test to compare."""
import sys

import pyarrow as pa
import pyarrow.parquet as pq

path, producer_tool = sys.argv[1], sys.argv[2]
table = pq.read_table(path)
want = {
    "step": pa.uint32(),
    "rank": pa.uint32(),
    "layer_id": pa.uint32(),
    "layer": pa.string(),
    "numel": pa.uint64(),
    "shape": pa.list_(pa.uint32()),
    "indices": pa.list_(pa.uint32()),
    "values": pa.list_(pa.float32()),
}
assert table.schema.names == list(want), table.schema.names
for name, typ in want.items():
    got = table.schema.field(name).type
    # List item field names and nullability differ between writers; compare value types.
    if pa.types.is_list(typ):
        assert pa.types.is_list(got) and got.value_type == typ.value_type, (name, got)
    else:
        assert got == typ, (name, got)
nullable = {f.name for f in table.schema if f.nullable}
assert nullable == {"shape", "indices"}, nullable
meta = pq.read_metadata(path).metadata
assert meta[b"gradkit.schema"] == b"tensor/1", meta
# Also in the stored Arrow schema, where pyarrow, pandas and polars look.
assert table.schema.metadata[b"gradkit.schema"] == b"tensor/1", table.schema.metadata
assert meta[b"gradkit.producer"].decode().startswith(producer_tool + " "), meta
assert b"gradkit.world_size" in meta, meta
# Encodings DESIGN §2b promises: zstd, byte-stream-split values, delta-packed indices.
col = pq.ParquetFile(path).metadata.row_group(0)
encodings = {col.column(i).path_in_schema: col.column(i).encodings for i in range(col.num_columns)}
assert "BYTE_STREAM_SPLIT" in encodings["values.list.item"], encodings
assert col.column(0).compression == "ZSTD", col.column(0).compression


def bits(values):
    import numpy as np
    return " ".join("%08x" % b for b in np.asarray(values, dtype=np.float32).view(np.uint32))


for r in table.to_pylist():
    shape = "-" if r["shape"] is None else "x".join(map(str, r["shape"]))
    idx = "-" if r["indices"] is None else " ".join(map(str, r["indices"]))
    print(f'{r["step"]}|{r["rank"]}|{r["layer_id"]}|{r["layer"]}|{r["numel"]}|{shape}|{idx}|{bits(r["values"])}')
