"""pyarrow side of tools/gradtrace/examples/bench_io.rs: reads the trace gradtrace wrote and
writes the same table back, timing both, with gradtrace's settings (zstd 1, byte-stream-split
values, no dictionary) and with pyarrow's defaults (snappy, dictionary). Prints one line per
measurement: `name seconds bytes_on_disk`."""
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

path, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
print(f"pyarrow_version {pa.__version__} 0", flush=True)


def best(f):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return min(times), out


secs, table = best(lambda: pq.read_table(path))
print(f"pyarrow_read {secs:.4f} {os.path.getsize(path)}", flush=True)
# The list item's name as read back ("item" from arrow-rs) names the column to encode.
item = table.schema.field("values").type.value_field.name
gradkit_like = dict(
    compression="zstd",
    compression_level=1,
    use_dictionary=["layer"],
    column_encoding={f"values.list.{item}": "BYTE_STREAM_SPLIT"},
)
out = path + ".pyarrow.parquet"
secs, _ = best(lambda: pq.write_table(table, out, **gradkit_like))
print(f"pyarrow_write_zstd1_bss {secs:.4f} {os.path.getsize(out)}", flush=True)
secs, t2 = best(lambda: pq.read_table(out))
print(f"pyarrow_read_own_zstd1_bss {secs:.4f} {os.path.getsize(out)}", flush=True)
secs, _ = best(lambda: pq.write_table(table, out))
print(f"pyarrow_write_defaults {secs:.4f} {os.path.getsize(out)}", flush=True)
os.remove(out)
