"""pyarrow side of tools/gradtrace/examples/bench_io.rs: reads the trace gradtrace wrote and
writes the same table back, timing both, with gradtrace's settings (zstd 1, byte-stream-split
values, delta-packed indices, no dictionary but for `layer`, no statistics on
`values`/`indices`) and with pyarrow's defaults (snappy, dictionary).
bench_io.rs runs this once per repetition, between its own runs, so both sides see the same
machine load. Prints one line per measurement: `name seconds bytes_on_disk`."""
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

path, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
print(f"pyarrow_version {pa.__version__} 0 0", flush=True)


def timed(f):
    t, c = time.perf_counter(), time.process_time()
    out = f()
    return (time.perf_counter() - t, time.process_time() - c), out


for _ in range(reps):
    secs, table = timed(lambda: pq.read_table(path))
    print(f"pyarrow_read {secs[0]:.4f} {secs[1]:.4f} {os.path.getsize(path)}", flush=True)
    # The list item's name as read back ("item" from arrow-rs) names the column to encode.
    item = table.schema.field("values").type.value_field.name
    gradkit_like = dict(
        compression="zstd",
        compression_level=1,
        use_dictionary=["layer"],
        column_encoding={
            f"values.list.{item}": "BYTE_STREAM_SPLIT",
            f"indices.list.{item}": "DELTA_BINARY_PACKED",
        },
        # gradkit keeps no min/max of `values` and `indices` (they prune nothing).
        write_statistics=[c for c in table.column_names if c not in ("values", "indices")],
    )
    out = path + ".pyarrow.parquet"
    secs, _ = timed(lambda: pq.write_table(table, out, **gradkit_like))
    print(f"pyarrow_write_zstd1_bss {secs[0]:.4f} {secs[1]:.4f} {os.path.getsize(out)}", flush=True)
    secs, t2 = timed(lambda: pq.read_table(out))
    print(f"pyarrow_read_own_zstd1_bss {secs[0]:.4f} {secs[1]:.4f} {os.path.getsize(out)}", flush=True)
    del t2
    secs, _ = timed(lambda: pq.write_table(table, out))
    print(f"pyarrow_write_defaults {secs[0]:.4f} {secs[1]:.4f} {os.path.getsize(out)}", flush=True)
    os.remove(out)
    del table
