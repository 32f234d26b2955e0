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
import pyarrow.parquet as pq

from . import _tempfiles
from ._checksum import KEY, WRITE_OPTIONS
from ._schema import tensor_schema
from .reader import Trace, _files
from .recorder import __version__


def merge(inputs, output):
    """Writes the rows of `inputs` (files or globs) to `output`, step by step (atomic: the
    file appears when complete). Returns the `Trace` of the inputs. Refuses, before reading
    any rows, a file given twice (also through a symlink or two globs) and an output that is
    one of the inputs (such as an earlier output matched by the glob)."""
    files = _files(inputs)
    _check_output(files, output)
    t = Trace(files)
    meta = {k: v for k, v in t.metadata.items() if k.startswith("gradkit.") and k not in (
        "gradkit.schema", "gradkit.producer", "gradkit.world_size", KEY)}
    meta.update({
        "gradkit.producer": f"gradkit-python {__version__} argv={' '.join(sys.argv)}",
        "gradkit.world_size": str(max(t.world_size, len(t.ranks))),
    })
    schema = tensor_schema(meta)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = _tempfiles.create(output)
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd", compression_level=1,
                              use_dictionary=["layer"], **WRITE_OPTIONS) as w:
            for step in t.steps:
                # Trace._rows checks each row group against its file's checksums first.
                parts = [p.select(schema.names).cast(schema) for _, p in t._rows(step)]
                rows = pa.concat_tables(parts)
                rows = rows.sort_by([("rank", "ascending"), ("layer_id", "ascending")])
                w.write_table(rows, row_group_size=max(rows.num_rows, 1))
        _tempfiles.commit(tmp, output)
    except BaseException:
        _tempfiles.discard(tmp)
        raise
    return t


def _check_output(files, output):
    if not os.path.exists(output):
        return
    for f in files:
        if os.path.samefile(f, output):
            raise ValueError(
                f"-o {output} is the same file as the input {f}: refusing to overwrite an "
                "input (give -o another path, or leave an earlier output out of the glob)"
            )


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gradkit.merge", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="tensor/1 files or globs (e.g. 'run/rank*.parquet')")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    try:
        t = merge(a.inputs, a.output)
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        # Exit 1, as the Rust tools for a damaged, duplicated or clobbered file; argparse's
        # usage errors exit 2.
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {a.output}: {len(t.steps)} steps, {len(t.ranks)} ranks, {len(t.layers)} layers",
          file=sys.stderr)


if __name__ == "__main__":
    main()
