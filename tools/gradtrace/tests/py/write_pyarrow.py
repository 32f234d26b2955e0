"""Writes a tensor/1 table with plain pyarrow (default options: snappy, nullable columns),
as a user of pandas or pyarrow would, for gradtrace to read."""
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

schema = pa.schema(
    [
        ("step", pa.uint32()),
        ("rank", pa.uint32()),
        ("layer_id", pa.uint32()),
        ("layer", pa.string()),
        ("numel", pa.uint64()),
        ("shape", pa.list_(pa.uint32())),
        ("indices", pa.list_(pa.uint32())),
        ("values", pa.list_(pa.float32())),
    ],
    metadata={"gradkit.schema": "tensor/1", "gradkit.producer": "pyarrow test"},
)
rows = []
for step in range(2):
    for rank in range(2):
        dense = (np.arange(6, dtype=np.float32) * (step + 1) - rank).tolist()
        rows.append(dict(step=step, rank=rank, layer_id=0, layer="enc.weight", numel=6,
                         shape=[2, 3], indices=None, values=dense))
        rows.append(dict(step=step, rank=rank, layer_id=1, layer="enc.bias", numel=5,
                         shape=None, indices=[1, 4], values=[step + 0.5, -rank - 1.0]))
table = pa.Table.from_pylist(rows, schema=schema)
if sys.argv[1] == "-":  # a pipe cannot seek: write to memory, then to stdout
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    sys.stdout.buffer.write(sink.getvalue().to_pybytes())
else:
    pq.write_table(table, sys.argv[1])
