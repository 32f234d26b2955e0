"""Merging per-rank traces into one file ordered by step.

    python -m gradkit.merge run/rank*.parquet -o run.parquet

`gradtrace cat` concatenates files in the order given, so per-rank files come out rank by
rank, and the tools then read the whole trace at once instead of a step at a time
(docs/MEMORY.md). This writes each step of every input as one row group, ranks in order,
holding one step of one file in memory at a time.
"""

import argparse
import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._schema import tensor_schema
from .reader import Trace
from .recorder import __version__


def merge(inputs, output):
    """Writes the rows of `inputs` (files or globs) to `output`, step by step (atomic: the
    file appears when complete). Returns the `Trace` of the inputs."""
    t = Trace(inputs)
    meta = {k: v for k, v in t.metadata.items() if k.startswith("gradkit.") and k not in (
        "gradkit.schema", "gradkit.producer", "gradkit.world_size")}
    meta.update({
        "gradkit.producer": f"gradkit-python {__version__} argv={' '.join(sys.argv)}",
        "gradkit.world_size": str(max(t.world_size, len(t.ranks))),
    })
    schema = tensor_schema(meta)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = f"{output}.tmp-{os.getpid()}"
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd", compression_level=1,
                              use_dictionary=["layer"]) as w:
            for step in t.steps:
                parts = [pq.read_table(f, filters=pc.field("step") == step) for f in t.files]
                rows = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
                rows = rows.sort_by([("rank", "ascending"), ("layer_id", "ascending")])
                w.write_table(rows, row_group_size=max(rows.num_rows, 1))
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gradkit.merge", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="tensor/1 files or globs (e.g. 'run/rank*.parquet')")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    try:
        t = merge(a.inputs, a.output)
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {a.output}: {len(t.steps)} steps, {len(t.ranks)} ranks, {len(t.layers)} layers",
          file=sys.stderr)


if __name__ == "__main__":
    main()
