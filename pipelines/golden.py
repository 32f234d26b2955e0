#!/usr/bin/env python3
"""The golden harness: every tool's outputs on a fixed list of cases, recorded at one commit
and compared at another (docs/CONTRIBUTING.md, "Refactoring: the golden harness").

    golden.py record  --bin DIR OUT.json   # run the cases with DIR's binaries, write the manifest
    golden.py compare --bin DIR OUT.json   # run them again: every difference, exit 1; or
                                           # "N cases, M files, all identical", exit 0
    golden.py list                         # the cases, one a line

The cases (CASES below): each tool's --help and -h, every subcommand's; gradtrace's shapes,
imports, cat and inspect; every gradselect and gradpartition method; every gradallreduce
--algo on dense input and the sparse ones on a selection, each Ok-Topk flag value, DEFT with
and without a plan, 1-bit with --state twice, EmbRace's splits, --op mean, --wire fp16,
--comm-trace, bench and model; every gradtrain exchange, optimiser and model, a checkpoint
and its resume; gradreport table, volume, plot, tensor and simulate on those outputs; a few
runs under `mpirun -np 2` (skipped, and said so, where there is no mpirun); and the usage and
input errors of every flag family (exit status and message, compared exactly). They run in
order in one fresh scratch directory (the cwd; later cases read earlier cases' files) with a
fixed environment; a case's files are those it created, changed or removed there.

The manifest holds per case its argv, exit status, stdout and stderr (text; Parquet on stdout
as a digest) and a digest of each of its files: Parquet as its schema, key-value metadata,
layout (row groups, codecs, encodings) and rows (a sha256 per column and per row, and each
row's first characters, so that compare names the first differing row); text files as their
text; checkpoints (safetensors) as their sorted header and a sha256 of the tensors; other
files as a sha256. What is masked, because it differs between two runs of one binary or two
builds of one commit (nothing else is):

- Parquet metadata: `gradkit.producer` keeps only the tool's name (its version and argv differ
  between builds and directories); `gradkit.crc32` is dropped (it checksums the bytes of the
  masked timing columns; the data it covers is digested itself); `ARROW:schema` is dropped
  (an encoding of the schema and the metadata, both digested). Every other key is kept
  (`gradkit.backend` too: a case always has the same launch).
- Parquet rows, timings only: metrics/1 `value` where `metric` is a measured time or a
  quantity derived from one (a name starting with `time_` or ending in `_s`, but `model_*`,
  which the cost model computes; and `time_max_over_min`, `algbw_GBps`, `busbw_GBps`,
  `minflt_per_call`, `majflt_per_call` of bench, `selection_speedup_measured` of gradpartition,
  `peak_rss_bytes` of gradtrain --rss); commtrace/1 `start_s` and `end_s`; in any table a
  column named so.
- Text (stdout, stderr, text files): the scratch and binary directories' paths always, and
  under mpirun its job id and the rank it saw exit first. Unless a case is exact: durations
  (`1.2 ms`, `3 s`, `4 µs`) and rates (`5 MB/s`, `10.00 GB/s`), a producer's version and argv
  (`gradtrace inspect`), the cells of timing-named columns of Markdown, CSV and JSON tables
  (a Markdown table with a masked cell is compared with its padding collapsed: the column
  widths follow the masked numbers), gradtrain's summary time split, gradpartition's measured
  selection speedup, carriage-return progress and terminal escapes. Exact cases (`--help`,
  the errors, the figures) keep all but the paths.
- `.lock` files hold a pid: only that they were written is kept.

Left out as nondeterministic: `--algo native` under mpirun (MPI_Allreduce sums in its own
order), `gradallreduce bench --fit` (its model column is fitted to measured times),
`gradreport simulate --compute recorded` (it replays measured compute intervals). CUDA and
NCCL run only as their errors (no `--features cuda` build here).

Standard library and pyarrow only: run it with the venv of `make deps` (.venv/bin/python);
make golden-record and make golden-check do.
"""
import argparse
import csv
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq

FORMAT = "gradkit-golden/1"
TIMEOUT_S = 300

# ------------------------------------------------------------------------------ masking
# Measured (not computed) quantities besides the time_* / *_s names.
MEASURED = {"time_max_over_min", "algbw_GBps", "busbw_GBps", "minflt_per_call",
            "majflt_per_call", "selection_speedup_measured", "peak_rss_bytes",
            # the same in the tools' printed tables
            "time_us", "select_us", "max/min", "minflt", "majflt", "recorded_ms"}
MASK = "<T>"


def is_timing(name, keep=(), extra=()):
    """Whether a metric or column NAME holds a measured time (or another measured number)."""
    base = name.split(":")[0]
    for suffix in ("_min", "_max"):  # gradreport's csv/json range columns
        if base.endswith(suffix) and is_timing(base[: -len(suffix)], keep, extra):
            return True
    if name in keep or base in keep:
        return False
    if name in extra or base in extra or base in MEASURED:
        return True
    if base.startswith("model_"):
        return False
    return base.startswith("time_") or base.endswith("_s")


NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
DURATION = re.compile(rf"(?<![\w.]){NUM}(\s?)(ns|µs|us|ms|s|min|h)(?![\w/])")
RATE = re.compile(rf"(?<![\w.]){NUM}(\s?)([KMGT]i?B/s|[kKMGT]?B/s|[kMG]bit/s|[KMG]Bps|it/s|steps/s)")
PRODUCER = re.compile(r"\b(grad[a-z]+) \d+\.\d+\.\d+\S* argv=[^\"\n]*")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# gradtrain's summary: `time 2.75 ms = compute 1.58 + select 0 + comm 1.17 + update 0.00759`
TRAIN_SPLIT = re.compile(rf"\b(compute|select|comm|update|wait|overlap) {NUM}")
# gradpartition's `selection speedup, measured top-k time / max worker time (median)` row
MEASURED_LABEL = re.compile(r"measured[^|\",]*time[^|\",]*")


def mask_line(line):
    """Durations, rates and the measured quantities named above, in one line of text."""
    line = DURATION.sub(lambda m: f"{MASK}{m.group(1)}{m.group(2)}", line)
    line = RATE.sub(lambda m: f"{MASK}{m.group(1)}{m.group(2)}", line)
    if re.search(rf"\btime {MASK} ?\w+ =", line):
        line = TRAIN_SPLIT.sub(lambda m: f"{m.group(1)} {MASK}", line)
    m = MEASURED_LABEL.search(line)
    if m:
        line = line[:m.end()] + re.sub(rf"(?<![\w.]){NUM}(?![\w.])", MASK, line[m.end():])
    return line


def md_block(rows, keep, extra):
    """A Markdown table: the cells of timing-named columns masked, and where anything was
    masked, every cell's padding collapsed (column widths follow the masked numbers)."""
    split = [r.strip()[1:-1].split("|") for r in rows]
    timing = [is_timing(c.strip(), keep, extra) for c in split[0]]
    out, changed = [], False
    for i, cells in enumerate(split):
        sep = i == 1 and set("".join(cells)) <= set("-: ")
        new, measured = [], False
        for j, c in enumerate(cells):
            if i > 0 and not sep and (j < len(timing) and timing[j] or measured):
                c2 = f" {MASK} "
            elif sep:
                c2 = c
            else:
                c2 = mask_line(c)
                measured = bool(MEASURED_LABEL.search(c))
            changed |= c2 != c
            new.append(c2)
        out.append(new)
    if not changed:
        return rows
    return ["|" + "|".join(_tight(c, i == 1) for c in cells) + "|" for i, cells in enumerate(out)]


def _tight(cell, separator):
    """A Markdown cell without its padding; a separator cell keeps only its alignment."""
    c = cell.strip()
    if not separator:
        return c
    return (":" if c.startswith(":") else "") + "---" + (":" if c.endswith(":") and len(c) > 1 else "")


def csv_json_line(line, state, keep, extra):
    """CSV rows under a header naming timing columns, and `"key": value` pairs of JSON rows."""
    s = line.strip()
    if state.get("csv") is None and "," in s and re.fullmatch(r"[\w:/.,-]+", s):
        cols = [is_timing(c, keep, extra) for c in s.split(",")]
        if any(cols):
            state["csv"] = cols
            return line
    elif state.get("csv") is not None:
        cols = state["csv"]
        cells = next(csv.reader([s])) if s else []
        if len(cells) == len(cols):
            if '"' not in s:
                return ",".join(MASK if t else c for c, t in zip(cells, cols))
            out = io.StringIO()
            csv.writer(out, lineterminator="").writerow(MASK if t else c for c, t in zip(cells, cols))
            return out.getvalue()
        state["csv"] = None
    return re.sub(r'"([^"]+)": (-?[\w.+-]+|"[^"]*")',
                  lambda m: f'"{m.group(1)}": "{MASK}"' if is_timing(m.group(1), keep, extra)
                  else m.group(0), line)


def mask_lines(lines, keep, extra):
    out, state, i = [], {}, 0
    while i < len(lines):
        if lines[i].strip().startswith("|") and lines[i].strip().endswith("|"):
            j = i
            while j < len(lines) and lines[j].strip().startswith("|") and lines[j].strip().endswith("|"):
                j += 1
            out += md_block(lines[i:j], keep, extra)
            i = j
            continue
        out.append(mask_line(csv_json_line(lines[i], state, keep, extra)))
        i += 1
    return out


def mask_paths(text, ctx):
    for path, name in ctx["paths"]:
        text = text.replace(path, name)
    return text


def mask_text(data, ctx, case):
    """The text of a stream or text file, masked as the module doc says."""
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    text = mask_paths(text, ctx)
    if case.get("mpi"):  # mpirun's job id, and which rank it saw exit first
        text = re.sub(r"\[\[\d+,\d+\],\d+\]", "[[<JOB>],<RANK>]", text)
    if case.get("exact"):
        return text
    text = ANSI.sub("", text)
    text = "\n".join(seg.split("\r")[-1] for seg in text.split("\n"))
    text = PRODUCER.sub(r"\1 <VERSION> argv=<ARGV>", text)
    return "\n".join(mask_lines(text.split("\n"), case.get("keep", ()), case.get("mask", ())))


# ------------------------------------------------------------------------------ digests
def sha(data):
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def canon(v):
    """A JSON-able value of one cell, exact for floats (repr round-trips)."""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return [canon(x) for x in v]
    if isinstance(v, bytes):
        return v.hex()
    return v


def masked_columns(table, kind, case):
    """{column: [canonical cells]} with the timing cells masked."""
    keep, extra = case.get("keep", ()), case.get("mask", ())
    cols = {name: [canon(v) for v in table.column(name).to_pylist()] for name in table.column_names}
    if kind == "metrics/1" and "metric" in cols and "value" in cols:
        cols["value"] = [MASK if is_timing(m, keep, extra) else v
                         for m, v in zip(cols["metric"], cols["value"])]
    for name in cols:
        if is_timing(name, keep, extra) and name not in ("metric", "value"):
            cols[name] = [MASK] * len(cols[name])
    return cols


def brief(cell):
    """A row's cell as the manifest shows it: a long list as its first items, its length and
    a hash (so the first differing row says which list changed, and how long it is)."""
    if isinstance(cell, list) and len(cell) > 4:
        return cell[:3] + [f"... n={len(cell)} #{sha(json.dumps(cell))[:8]}"]
    return cell


def parquet_layout(md):
    """Row groups, codecs and encodings: how the file is written (docs/FORMAT.md)."""
    groups = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        chunks = [[rg.column(c).path_in_schema, rg.column(c).compression,
                   sorted(rg.column(c).encodings)] for c in range(rg.num_columns)]
        groups.append({"rows": rg.num_rows, "columns": chunks})
    return {"created_by": md.created_by, "format_version": md.format_version, "row_groups": groups}


def parquet_meta(md):
    meta = {}
    for k, v in (md.metadata or {}).items():
        k, v = k.decode(), v.decode("utf-8", errors="backslashreplace")
        if k in ("ARROW:schema", "gradkit.crc32"):
            continue
        if k == "gradkit.producer":
            v = v.split(" ")[0] + " <VERSION> argv=<ARGV>"
        meta[k] = v
    return meta


def parquet_digest(path_or_buf, case):
    pf = pq.ParquetFile(path_or_buf)
    table = pf.read()
    md = pf.metadata
    meta = parquet_meta(md)
    schema = [[f.name, str(f.type), f.nullable,
               {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}] for f in table.schema]
    cols = masked_columns(table, meta.get("gradkit.schema"), case)
    names = table.column_names
    col_sha = {n: sha("\n".join(json.dumps(v) for v in cols[n])) for n in names}
    row_hash, row_text = [], []
    for i in range(table.num_rows):
        cells = [cols[n][i] for n in names]
        row_hash.append(sha(json.dumps(cells, ensure_ascii=False))[:16])
        text = json.dumps([brief(c) for c in cells], ensure_ascii=False)
        row_text.append(text if len(text) <= 200 else text[:197] + "...")
    body = {"schema": schema, "meta": meta, "layout": parquet_layout(md),
            "rows": table.num_rows, "columns": col_sha}
    return dict(kind="parquet", sha256=sha(json.dumps(body, sort_keys=True)), **body,
                row_hash=row_hash, row_text=row_text, names=names)


def safetensors_digest(data):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {"kind": "safetensors", "header": json.dumps(header, sort_keys=True),
            "data_sha256": sha(data[8 + n:])}


TEXT_EXT = (".md", ".csv", ".json", ".svg", ".txt", ".tsv", ".xml", ".log")


def file_digest(path, rel, ctx, case):
    if os.path.basename(rel).endswith(".lock"):
        return {"kind": "lock"}  # holds the pid of the run that took it
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] == b"PAR1":
        return guarded(parquet_digest, path, case, raw=data)
    if rel.endswith(".safetensors"):
        return guarded(safetensors_digest, data, raw=data)
    if rel.endswith(TEXT_EXT) or (data and b"\0" not in data[:4096] and _utf8(data)):
        text = mask_text(data, ctx, case)
        return {"kind": "text", "sha256": sha(text), "text": text}
    return {"kind": "bytes", "sha256": sha(data), "size": len(data)}


def guarded(digest, *args, raw):
    """A structured digest, or the raw bytes' when the file cannot be parsed (a truncated
    Parquet file is an output too)."""
    try:
        return digest(*args)
    except Exception as e:  # noqa: BLE001 - any parse failure is recorded, not fatal
        return {"kind": "bytes", "sha256": sha(raw), "size": len(raw),
                "unreadable": f"{type(e).__name__}: {e}"}


def _utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def stream_digest(data, ctx, case):
    if data[:4] == b"PAR1":
        return guarded(parquet_digest, io.BytesIO(data), case, raw=data)
    return mask_text(data, ctx, case)


# ------------------------------------------------------------------------------ inputs
def _npy(values, shape):
    """A little-endian float32 .npy file's bytes (format 1.0), written by hand."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + \
        struct.pack(f"<{len(values)}f", *values)


def _safetensors(tensors):
    header, data = {}, b""
    for name, (values, shape) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def _dump_tensors(step, rank):
    w = [((i * 7 + step * 3 + rank * 5) % 11 - 5) / 4.0 for i in range(12)]
    b = [((i + step + 2 * rank) % 5 - 2) / 8.0 for i in range(3)]
    return {"fc.weight": (w, [3, 4]), "fc.bias": (b, [3])}


def _write_dumps(work):
    """step<S>_rank<R> dumps for gradtrace import: .npz, per-layer .npy and .safetensors."""
    for sub in ("npz", "npy", "st"):
        os.makedirs(os.path.join(work, "dumps", sub))
    for step in range(2):
        for rank in range(2):
            t = _dump_tensors(step, rank)
            stem = f"step{step}_rank{rank}"
            with zipfile.ZipFile(os.path.join(work, "dumps", "npz", stem + ".npz"), "w") as z:
                for name, (v, shape) in t.items():
                    info = zipfile.ZipInfo(name + ".npy", date_time=(2000, 1, 1, 0, 0, 0))
                    z.writestr(info, _npy(v, shape))
            for name, (v, shape) in t.items():
                with open(os.path.join(work, "dumps", "npy", f"{stem}.{name}.npy"), "wb") as f:
                    f.write(_npy(v, shape))
            with open(os.path.join(work, "dumps", "st", stem + ".safetensors"), "wb") as f:
                f.write(_safetensors(t))


TENSOR_SCHEMA = pa.schema([("step", pa.uint32()), ("rank", pa.uint32()), ("layer_id", pa.uint32()),
                           ("layer", pa.string()), ("numel", pa.uint64()),
                           ("shape", pa.list_(pa.uint32())), ("indices", pa.list_(pa.uint32())),
                           ("values", pa.list_(pa.float32()))],
                          metadata={"gradkit.schema": "tensor/1"})


def _embedding_rows(shape, whole_rows):
    """EmbRace's input: a row-sparse 50×8 embedding (2-D shape) and a dense 37-entry layer, 4
    ranks, 2 steps (as tools/gradallreduce/tests/gradallreduce/cli.rs's embedding_trace)."""
    v, d, rows = 50, 8, []
    for step in range(2):
        for rank in range(4):
            ids = [i for i in range(v) if (i * 7 + rank * 3 + step) % 5 == 0]
            idx = [i * d + c for i in ids for c in range(d if whole_rows else d - 1)]
            rows.append(dict(step=step, rank=rank, layer_id=0, layer="embedding.weight", numel=v * d,
                             shape=shape, indices=idx, values=[float((i + rank) % 17 - 8) for i in idx]))
            rows.append(dict(step=step, rank=rank, layer_id=1, layer="fc.weight", numel=37, shape=[37],
                             indices=None, values=[i * (rank + 1) / 7.0 for i in range(37)]))
    return rows


def _fixed_metrics():
    """metrics/1 rows with set times, so the figures and tables of times are compared exactly."""
    rows = []
    for algo, p, comm in (("ring", 2, 0.004), ("ring", 4, 0.006), ("oktopk", 2, 0.002), ("oktopk", 4, 0.0025)):
        for step in range(4):
            for rank in range(p):
                vals = {"time_comm_s": comm * (1 + step / 10), "time_compute_s": 0.01 + rank / 1000,
                        "time_select_s": 0.0 if algo == "ring" else 0.001, "loss": 2.0 / (step + 1) + p / 100,
                        "time_elapsed_s": 0.02 * (step + 1), "bytes_sent": 4000.0 * (p - 1) / p if algo == "ring"
                        else 600.0 + 10 * rank, "model_bytes_sent": 4000.0 * (p - 1) / p if algo == "ring" else 600.0,
                        "model_time_s": comm}
                for m, v in vals.items():
                    rows.append(dict(run=f"{algo}-P{p}", tool="gradtrain", algo=algo, world_size=p, step=step,
                                     rank=rank, metric=m, phase="", value=v, density=None if algo == "ring" else 0.01,
                                     optimizer="sgd", model="mlp", seed=1))
    schema = pa.schema([("run", pa.string(), False), ("tool", pa.string(), False), ("algo", pa.string(), False),
                        ("world_size", pa.uint32(), False), ("step", pa.uint32(), False),
                        ("rank", pa.uint32(), False), ("metric", pa.string(), False),
                        ("phase", pa.string(), False), ("value", pa.float64(), False),
                        ("density", pa.float64()), ("optimizer", pa.string()), ("model", pa.string()),
                        ("seed", pa.uint64())], metadata={"gradkit.schema": "metrics/1"})
    return pa.Table.from_pylist(rows, schema=schema)


def _classification_data():
    """gradtrain --data FILE: 24 examples of 6 features, 3 classes, with a split column."""
    rows = []
    for i in range(24):
        label = i % 3
        rows.append({"features": [((i * (j + 3) + label * 5) % 7 - 3) / 3.0 for j in range(6)],
                     "label": label, "split": "test" if i % 6 == 5 else "train"})
    return pa.Table.from_pylist(rows, schema=pa.schema([("features", pa.list_(pa.float32())),
                                                        ("label", pa.int64()), ("split", pa.string())]))


def setup_inputs(work):
    """The files the cases read that no tool makes, written the same way every time."""
    _write_dumps(work)
    os.makedirs(os.path.join(work, "dumps", "empty"))
    for name, shape, whole in (("emb-py", [50, 8], True), ("emb-noshape", None, True),
                               ("emb-partial", [50, 8], False)):
        pq.write_table(pa.Table.from_pylist(_embedding_rows(shape, whole), schema=TENSOR_SCHEMA),
                       os.path.join(work, name + ".parquet"))
    # as pandas writes integers: Int64 columns and no gradkit.schema key
    t = pa.Table.from_pylist(_embedding_rows([50, 8], True)[:4], schema=TENSOR_SCHEMA)
    t = t.cast(pa.schema([pa.field(f.name, pa.int64()) if f.name in ("step", "rank", "layer_id", "numel")
                          else f for f in TENSOR_SCHEMA]).with_metadata({}))
    pq.write_table(t, os.path.join(work, "int64.parquet"))
    pq.write_table(_fixed_metrics(), os.path.join(work, "fixed-m.parquet"))
    pq.write_table(_classification_data(), os.path.join(work, "data.parquet"))
    with open(os.path.join(work, "notparquet.txt"), "w") as f:
        f.write("not a Parquet file\n")


# ------------------------------------------------------------------------------ the cases
CASES = []


def C(name, cmd, **kw):
    """A case: NAME, the command (its first word a tool of --bin), options: stdin (a file of
    the scratch directory), env, mpi (ranks under mpirun), fail (expected to exit non-zero),
    exact (no timing masks), keep / mask (names not to mask / to mask as timings)."""
    assert all(c["name"] != name for c in CASES), name
    CASES.append(dict(name=name, argv=shlex.split(cmd), **kw))


def E(name, cmd, **kw):
    """An error case: the exit status and the message, compared exactly."""
    C(name, cmd, fail=True, exact=True, **kw)


TOOLS = ("gradtrace", "gradselect", "gradpartition", "gradallreduce", "gradtrain", "gradreport")
SUBCOMMANDS = {"gradtrace": ("synthetic", "import", "inspect", "cat", "model"),
               "gradallreduce": ("bench", "model"),
               "gradreport": ("simulate", "table", "plot", "volume", "tensor")}


def help_cases():
    for tool in TOOLS:
        C(f"help-{tool}", f"{tool} --help", exact=True)
        C(f"help-short-{tool}", f"{tool} -h", exact=True)
        for sub in SUBCOMMANDS.get(tool, ()):
            C(f"help-{tool}-{sub}", f"{tool} {sub} --help", exact=True)


def gradtrace_cases():
    C("trace-mlp", "gradtrace synthetic --shape mlp --scale 0.05 --ranks 4 --steps 3 --seed 1 -q -o t.parquet")
    C("trace-mlp-2ranks", "gradtrace synthetic --shape mlp --scale 0.05 --ranks 2 --steps 3 --seed 2 "
      "--overlap 0.3 -q -o t2.parquet")
    C("trace-vgg16", "gradtrace synthetic --shape vgg16 --scale 0.01 --ranks 2 --steps 2 --seed 1 -q -o vgg.parquet")
    C("trace-lstm", "gradtrace synthetic --shape lstm --scale 0.005 --ranks 2 --steps 2 --seed 1 -q -o lstm.parquet")
    C("trace-bert", "gradtrace synthetic --shape bert-base --scale 0.002 --ranks 2 --steps 1 --seed 1 -q "
      "-o bert.parquet")
    C("trace-layers", "gradtrace synthetic --layers w=60x20,b=20,e=3x4x5 --ranks 3 --steps 4 --seed 5 "
      "--overlap 0.9 --drift 0.5 --tail 0 -q -o custom.parquet")
    C("trace-stdout", "gradtrace synthetic --layers w=300 --ranks 2 --steps 2 --seed 3 -q")
    C("trace-progress", "gradtrace synthetic --shape mlp --scale 0.02 --ranks 2 --steps 2 --seed 1 -o tp.parquet")
    C("trace-inspect", "gradtrace inspect t.parquet")
    C("trace-inspect-csv", "gradtrace inspect custom.parquet --format csv")
    C("trace-inspect-json", "gradtrace inspect vgg.parquet --format json")
    C("trace-inspect-stdin", "gradtrace inspect -", stdin="t.parquet")
    C("trace-cat-emb", "gradtrace cat emb-py.parquet -o emb.parquet")
    C("trace-cat-int64", "gradtrace cat int64.parquet -o int64-cat.parquet")
    E("err-trace-cat-layers", "gradtrace cat t.parquet custom.parquet -o cat2.parquet")
    C("trace-cat-stdout", "gradtrace cat -", stdin="custom.parquet")
    C("trace-import-npz", "gradtrace import dumps/npz -q -o imp-npz.parquet")
    C("trace-import-npy", "gradtrace import dumps/npy -q -o imp-npy.parquet")
    C("trace-import-st-name", "gradtrace import dumps/st --order name -q -o imp-st.parquet")
    C("trace-import-one", "gradtrace import dumps/st/step1_rank1.safetensors --step 7 --rank 0 -q")
    C("trace-inspect-import", "gradtrace inspect imp-npz.parquet")
    C("trace-model", "gradtrace model --model mlp --ranks 2 --steps 2 --batch 8 --seed 1 -q -o gm.parquet")
    C("trace-model-topka", "gradtrace model --model mlp --ranks 2 --steps 2 --batch 8 --exchange topka "
      "--density 0.05 --seed 1 -q -o gm-topka.parquet")
    E("err-trace-shape", "gradtrace synthetic --shape resnet -o x.parquet")
    E("err-trace-scale", "gradtrace synthetic --shape mlp --scale 0 -o x.parquet")
    E("err-trace-overlap", "gradtrace synthetic --shape mlp --overlap 1.5 -o x.parquet")
    E("err-trace-both", "gradtrace synthetic --shape mlp --layers w=10 -o x.parquet")
    E("err-trace-layers", "gradtrace synthetic --layers w=0 -o x.parquet")
    E("err-trace-missing", "gradtrace inspect missing.parquet")
    E("err-trace-notparquet", "gradtrace inspect notparquet.txt")
    E("err-trace-import-none", "gradtrace import dumps/nothing -o x.parquet")
    E("err-trace-import-empty", "gradtrace import dumps/empty -o x.parquet")
    E("err-trace-nocommand", "gradtrace")
    E("err-trace-subcommand", "gradtrace synthesize")
    E("err-trace-model", "gradtrace model --model resnet -o x.parquet")


def gradselect_cases():
    sel = "gradselect -q t.parquet"
    C("sel-topk", f"{sel} --method topk --density 0.01 -o sel-topk.parquet --metrics sel-topk-m.parquet")
    C("sel-topk-k-layer", f"{sel} --method topk --k 20 --scope layer -o sel-k.parquet --metrics sel-k-m.parquet")
    C("sel-topk-noresidual", f"{sel} --method topk --density 0.02 --no-residual -o sel-nores.parquet")
    C("sel-topk-residual-out", f"{sel} --method topk --density 0.02 --residual-out res.parquet -o sel-r.parquet")
    C("sel-threshold", f"{sel} --method threshold --threshold 1.0 -o sel-th.parquet --metrics sel-th-m.parquet")
    C("sel-oktopk", f"{sel} --method oktopk --density 0.01 --reeval 2 -o sel-ok.parquet --metrics sel-ok-m.parquet")
    for adjust in ("paper", "reference", "vgg", "lstm", "bert"):
        C(f"sel-oktopk-{adjust}", f"{sel} --method oktopk --density 0.01 --reeval 2 --adjust {adjust} "
          f"-o sel-ok-{adjust}.parquet --metrics sel-ok-{adjust}-m.parquet")
    C("sel-oktopk-adjust-bare", f"{sel} --method oktopk --density 0.01 --reeval 2 -o sel-ok-bare.parquet --adjust")
    C("sel-oktopk-layer", f"{sel} --method oktopk --k 10 --reeval 1 --scope layer -o sel-ok-layer.parquet")
    C("sel-gaussiank", f"{sel} --method gaussiank --density 0.01 -o sel-gk.parquet --metrics sel-gk-m.parquet")
    C("sel-dgc", f"{sel} --method dgc --density 0.01 --sample 0.1 -o sel-dgc.parquet --metrics sel-dgc-m.parquet")
    C("sel-randomk", f"{sel} --method randomk --density 0.01 --seed 7 -o sel-rk.parquet --metrics sel-rk-m.parquet")
    C("sel-deft", f"{sel} --method deft --density 0.01 -o sel-deft.parquet --metrics sel-deft-m.parquet")
    C("sel-deft-topup", f"{sel} --method deft --density 0.01 --topup -o sel-deft-topup.parquet")
    C("sel-metrics-stdout", f"{sel} --method topk --density 0.01 --run mine -o sel-m.parquet --metrics -")
    C("sel-stdin-stdout", "gradselect --method topk --k 50 -q -", stdin="t.parquet")
    C("sel-summary", "gradselect --method oktopk --density 0.01 --reeval 2 t.parquet -o sel-sum.parquet")
    C("sel-vgg", "gradselect --method topk --density 0.001 -q vgg.parquet -o sel-vgg.parquet")
    C("sel-2ranks", "gradselect --method topk --density 0.01 -q t2.parquet -o sel-t2.parquet")
    C("sel-inspect", "gradtrace inspect sel-topk.parquet")
    for flag, value in (("density", "0"), ("density", "1.5"), ("k", "0"), ("method", "bogus"),
                        ("device", "bogus"), ("device", "cuda"), ("reeval", "0"), ("sample", "0"),
                        ("scope", "bogus"), ("adjust", "bogus"), ("threshold", "-1")):
        method = "oktopk" if flag in ("reeval", "adjust") else "dgc" if flag == "sample" else \
            "threshold" if flag == "threshold" else "topk"
        margs = "" if flag == "method" else f"--method {method} "
        E(f"err-sel-{flag}-{value}", f"gradselect {margs}--{flag}={value} t.parquet -o x.parquet")
    E("err-sel-no-method", "gradselect t.parquet -o x.parquet")
    E("err-sel-threshold-missing", "gradselect --method threshold t.parquet -o x.parquet")
    E("err-sel-threshold-topk", "gradselect --method topk --threshold 1 t.parquet -o x.parquet")
    E("err-sel-plan-topk", "gradselect --method topk --plan plan-deft.parquet t.parquet -o x.parquet")
    E("err-sel-missing", "gradselect --method topk missing.parquet -o x.parquet")
    E("err-sel-same-output", "gradselect --method topk t.parquet -o t.parquet")
    E("err-sel-sparse-input", "gradselect --method topk sel-topk.parquet -o x.parquet")
    E("err-sel-metrics-input", "gradselect --method topk sel-topk-m.parquet -o x.parquet")
    E("err-sel-notparquet", "gradselect --method topk notparquet.txt -o x.parquet")


def gradpartition_cases():
    C("part-deft", "gradpartition --method deft --density 0.01 t.parquet -o plan-deft.parquet "
      "--metrics part-deft-m.parquet")
    C("part-deft-topup", "gradpartition --method deft --density 0.01 --topup -q t.parquet -o plan-deft-topup.parquet")
    C("part-deft-noresidual", "gradpartition --method deft --density 0.02 --no-residual --no-buildup t.parquet "
      "-o plan-deft-nores.parquet --metrics part-deft-nores-m.parquet")
    C("part-deft-csv", "gradpartition --method deft --density 0.01 --format csv t.parquet -o plan-deft-csv.parquet")
    C("part-deft-json", "gradpartition --method deft --density 0.01 --format json --run d1 t.parquet "
      "-o plan-deft-json.parquet")
    C("part-deft-workers", "gradpartition --method deft --density 0.01 --workers 2 -q t.parquet -o plan-deft-w2.parquet")
    C("part-oktopk", "gradpartition --method oktopk --period 2 sel-topk.parquet -o plan-oktopk.parquet "
      "--metrics part-oktopk-m.parquet")
    C("part-oktopk-naive", "gradpartition --method oktopk --naive sel-topk.parquet -o plan-naive.parquet")
    C("part-oktopk-json", "gradpartition --method oktopk --period 1 --format json sel-topk.parquet "
      "-o plan-oktopk-json.parquet")
    C("part-stdin-stdout", "gradpartition --method oktopk -q", stdin="sel-topk.parquet")
    C("sel-deft-plan", "gradselect --method deft --density 0.01 --plan plan-deft.parquet -q t.parquet "
      "-o sel-deft-plan.parquet --metrics sel-deft-plan-m.parquet")
    E("err-part-method", "gradpartition --method bogus t.parquet -o x.parquet")
    E("err-part-deft-sparse", "gradpartition --method deft sel-topk.parquet -o x.parquet")
    E("err-part-oktopk-dense", "gradpartition --method oktopk t.parquet -o x.parquet")
    E("err-part-density", "gradpartition --method deft --density 0 t.parquet -o x.parquet")
    E("err-part-period", "gradpartition --method oktopk --period 0 sel-topk.parquet -o x.parquet")
    E("err-part-topup-oktopk", "gradpartition --method oktopk --topup sel-topk.parquet -o x.parquet")
    E("err-part-naive-deft", "gradpartition --method deft --naive t.parquet -o x.parquet")
    E("err-part-missing", "gradpartition --method deft missing.parquet -o x.parquet")
    E("err-part-format", "gradpartition --method deft --format xml t.parquet -o x.parquet")


ALGOS = ("ring", "ring-fp16", "rabenseifner", "tree", "native", "topka", "topkdsa", "gtopk", "gaussiank",
         "oktopk", "deft", "cltk", "topk-union", "onebit", "onebit-naive")
SELECTION_ALGOS = ("topka", "topkdsa", "gtopk", "gaussiank", "oktopk")


def gradallreduce_cases():
    ar = "gradallreduce --ranks 4 -q"
    for algo in ALGOS:  # embrace: on its embedding trace below
        C(f"ar-{algo}", f"{ar} --algo {algo} --density 0.01 t.parquet -o ar-{algo}.parquet "
          f"--metrics ar-{algo}-m.parquet")
    for algo in SELECTION_ALGOS:
        C(f"ar-sel-{algo}", f"{ar} --algo {algo} sel-topk.parquet -o ar-sel-{algo}.parquet "
          f"--metrics ar-sel-{algo}-m.parquet")
    C("ar-sel-oktopk-threshold", f"{ar} --algo oktopk --period 2 sel-ok.parquet -o ar-sel-ok2.parquet")
    for algo in ("ring", "rabenseifner", "tree", "oktopk", "topkdsa", "onebit"):
        C(f"ar-p3-{algo}", f"gradallreduce --ranks 3 -q --algo {algo} --density 0.05 custom.parquet "
          f"-o ar-p3-{algo}.parquet --metrics ar-p3-{algo}-m.parquet")
    C("ar-ring-mean", f"{ar} --algo ring --op mean t.parquet -o ar-ring-mean.parquet")
    C("ar-rabenseifner-mean", f"{ar} --algo rabenseifner --op mean t.parquet -o ar-rab-mean.parquet")
    C("ar-topka-mean", f"{ar} --algo topka --op mean --density 0.01 t.parquet -o ar-topka-mean.parquet")
    C("ar-ring-wire-fp16", f"{ar} --algo ring --wire fp16 t.parquet -o ar-ring-wire.parquet "
      "--metrics ar-ring-wire-m.parquet")
    C("ar-topka-k", f"{ar} --algo topka --k 300 t.parquet -o ar-topka-k.parquet --metrics ar-topka-k-m.parquet")
    C("ar-topka-noresidual", f"{ar} --algo topka --density 0.02 --no-residual t.parquet -o ar-topka-nores.parquet")
    C("ar-gaussiank-seed", f"{ar} --algo gaussiank --density 0.02 --seed 3 t.parquet -o ar-gk-seed.parquet")
    C("ar-oktopk-k", f"{ar} --algo oktopk --k 200 --period 1 --reeval 1 t.parquet -o ar-ok-k.parquet "
      "--metrics ar-ok-k-m.parquet")
    ok = f"{ar} --algo oktopk --density 0.01 --period 2 --reeval 2"
    for adjust in ("ladder", "paper", "reference", "vgg", "lstm", "bert"):
        C(f"ar-oktopk-adjust-{adjust}", f"{ok} --adjust {adjust} t.parquet -o ar-ok-{adjust}.parquet "
          f"--metrics ar-ok-{adjust}-m.parquet")
    for balance in ("auto", "always", "never"):
        C(f"ar-oktopk-balance-{balance}", f"{ok} --balance {balance} t.parquet -o ar-ok-b{balance}.parquet "
          f"--metrics ar-ok-b{balance}-m.parquet")
    for d in ("skip", "run"):
        C(f"ar-oktopk-step-d-{d}", f"{ok} --reeval-step-d {d} t.parquet -o ar-ok-d{d}.parquet "
          f"--metrics ar-ok-d{d}-m.parquet")
    C("ar-oktopk-plan", f"{ar} --algo oktopk --plan plan-oktopk.parquet --reeval 2 sel-topk.parquet "
      "-o ar-ok-plan.parquet --metrics ar-ok-plan-m.parquet")
    C("ar-oktopk-noresidual", f"{ok} --no-residual t.parquet -o ar-ok-nores.parquet")
    C("ar-deft-plan", f"{ar} --algo deft --density 0.01 --plan plan-deft.parquet t.parquet -o ar-deft-plan.parquet "
      "--metrics ar-deft-plan-m.parquet")
    for algo in ("onebit", "onebit-naive"):
        for i in (1, 2):  # the second run starts from the first's error buffers
            C(f"ar-{algo}-state-{i}", f"{ar} --algo {algo} --state {algo}.state t.parquet "
              f"-o ar-{algo}-state{i}.parquet --metrics ar-{algo}-state{i}-m.parquet")
    for split in ("columns", "rows"):
        C(f"ar-embrace-{split}", f"{ar} --algo embrace --split {split} emb.parquet -o ar-emb-{split}.parquet "
          f"--metrics ar-emb-{split}-m.parquet")
    C("ar-embrace-mean", f"{ar} --algo embrace --op mean emb.parquet -o ar-emb-mean.parquet")
    C("ar-alltoall", f"{ar} --algo alltoall emb.parquet -o ar-alltoall.parquet")
    C("ar-ring-comm-trace", f"{ar} --algo ring t.parquet -o /dev/null --comm-trace ct-ring.parquet")
    C("ar-oktopk-comm-trace", f"{ok} t.parquet -o /dev/null --comm-trace ct-oktopk.parquet")
    C("ar-embrace-comm-trace", f"{ar} --algo embrace emb.parquet -o /dev/null --comm-trace ct-emb.parquet")
    C("ar-metrics-stdout", f"{ar} --algo topka --run mine t.parquet -o ar-topka-2.parquet --metrics -")
    C("ar-stdin", "gradallreduce --algo ring --ranks 4 -q -o ar-stdin.parquet", stdin="t.parquet")
    C("ar-stdout", "gradallreduce --algo tree --ranks 2 -q t2.parquet")
    C("ar-summary", "gradallreduce --algo oktopk --ranks 4 --period 2 t.parquet -o ar-sum.parquet")
    C("ar-device-counting", "gradallreduce --algo topka --ranks 4 --device counting t.parquet -o ar-count.parquet")
    C("ar-ranks-default", "gradallreduce --algo ring -q t2.parquet -o ar-t2-ring.parquet")
    C("ar-inspect", "gradtrace inspect ar-oktopk.parquet --format csv")


def gradallreduce_error_cases():
    ar = "gradallreduce --ranks 4"
    for name, flags in (("unknown-algo", "--algo rign"), ("period-ring", "--algo ring --period 4"),
                        ("reeval-ring", "--algo ring --reeval 4"), ("adjust-topka", "--algo topka --adjust paper"),
                        ("balance-ring", "--algo ring --balance always"),
                        ("step-d-topka", "--algo topka --reeval-step-d run"),
                        ("plan-ring", "--algo ring --plan plan-deft.parquet"),
                        ("state-topka", "--algo topka --state s.bin"),
                        ("split-oktopk", "--algo oktopk --split rows"), ("mean-onebit", "--algo onebit --op mean"),
                        ("wire-topka", "--algo topka --wire fp16"), ("wire-bogus", "--algo ring --wire fp8"),
                        ("op-bogus", "--algo ring --op max"), ("density-0", "--algo topka --density 0"),
                        ("density-1.5", "--algo topka --density 1.5"), ("k-0", "--algo topka --k 0"),
                        ("device-bogus", "--algo topka --device tpu"), ("device-cuda", "--algo topka --device cuda"),
                        ("backend-nccl", "--algo ring --backend nccl"), ("backend-bogus", "--algo ring --backend gloo"),
                        ("ranks-3", "--algo ring --ranks 3"), ("ranks-0", "--algo ring --ranks 0"),
                        ("max-memory", "--algo ring --max-memory 1K"), ("balance-bogus", "--algo oktopk --balance some")):
        ranks = "" if "--ranks" in flags else "--ranks 4 "
        E(f"err-ar-{name}", f"gradallreduce {ranks}{flags} t.parquet -o x.parquet")
    E("err-ar-env-memory", "gradallreduce --algo ring t.parquet -o x.parquet", env={"GRADKIT_MAX_MEMORY": "lots"})
    for algo in ("deft", "cltk", "topk-union"):
        E(f"err-ar-{algo}-sparse", f"{ar} --algo {algo} sel-topk.parquet -o x.parquet")
    E("err-ar-embrace-noshape", f"{ar} --algo embrace emb-noshape.parquet -o x.parquet")
    E("err-ar-embrace-partial", f"{ar} --algo embrace emb-partial.parquet -o x.parquet")
    E("err-ar-missing", f"{ar} --algo ring missing.parquet -o x.parquet")
    E("err-ar-same-output", f"{ar} --algo ring t.parquet -o t.parquet")
    E("err-ar-plan-input", f"{ar} --algo ring plan-deft.parquet -o x.parquet")
    E("err-ar-notparquet", f"{ar} --algo ring notparquet.txt -o x.parquet")
    E("err-ar-state-other", f"{ar} --algo onebit --state onebit-naive.state t.parquet -o x.parquet")
    E("err-ar-plan-deft-for-oktopk", f"{ar} --algo oktopk --plan plan-deft.parquet sel-topk.parquet -o x.parquet")
    E("err-ar-stdin-ranks", "gradallreduce --algo ring -o x.parquet", stdin="t.parquet")


def gradallreduce_bench_model_cases():
    C("model-md", "gradallreduce model --ranks 16 --n 1M", keep=("time_ms",))
    C("model-csv", "gradallreduce model --ranks 1024 --n 110M --density 0.001 --alpha-us 2 --bandwidth-gbps 25 "
      "--format csv", keep=("time_ms",))
    C("model-json", "gradallreduce model --ranks 3 --n 16Mi --format json", keep=("time_ms",))
    b = "gradallreduce bench --ranks 2 --iters 2 --warmup 1"
    C("bench-dense", f"{b} --algo ring,rabenseifner,tree,native --sizes 1K:16K --metrics bench-dense.parquet")
    C("bench-sparse", f"{b} --algo oktopk,topka,topkdsa,gtopk,gaussiank --input dense,topk --sizes 4K:4K "
      "--format csv -q --metrics bench-sparse.parquet")
    C("bench-deft", f"{b} --algo deft,cltk,topk-union --input dense --sizes 8K:8K --density 0.05 --seed 2 "
      "--format json -q --metrics bench-deft.parquet")
    C("bench-onebit", f"{b} --algo onebit,onebit-naive --sizes 1K:4K --factor 2 --alpha-us 1 --bandwidth-gbps 1 -q")
    C("bench-comm-trace", f"{b} --algo ring --sizes 1K:1K -q --comm-trace ct-bench.parquet")
    E("err-model-ranks", "gradallreduce model --ranks 0")
    E("err-model-n", "gradallreduce model --n 12x")
    E("err-model-density", "gradallreduce model --density 0")
    E("err-bench-algo", "gradallreduce bench --algo ring,bogus --ranks 2")
    E("err-bench-sizes", "gradallreduce bench --algo ring --ranks 2 --sizes 1K:lots")
    E("err-bench-metrics-stdout", "gradallreduce bench --algo ring --ranks 2 --metrics -")
    E("err-bench-input", "gradallreduce bench --algo deft --input topk --ranks 2 --sizes 1K:1K")


def mpirun_cases():
    """Under mpirun -np 2 (skipped where mpirun is missing). Not `native`: MPI_Allreduce sums in
    its own order."""
    C("mpi-ar-ring", "gradallreduce --algo ring -q t2.parquet -o mpi-ring.parquet --metrics mpi-ring-m.parquet", mpi=2)
    C("mpi-ar-oktopk", "gradallreduce --algo oktopk --density 0.02 --period 2 -q t2.parquet -o mpi-oktopk.parquet "
      "--metrics mpi-oktopk-m.parquet", mpi=2)
    C("mpi-train-topka", "gradtrain --model mlp --steps 3 --batch 8 --exchange topka --density 0.05 --seed 1 -q "
      "--metrics mpi-train.parquet", mpi=2)
    E("err-mpi-algo", "gradallreduce --algo bogus t2.parquet -o x.parquet", mpi=2)


EXCHANGES = ("ring", "topka", "gaussiank", "topkdsa", "gtopk", "oktopk", "deft", "cltk", "topk-union")
TINY_LM = "--data synthetic-lm --tokens 3000 --vocab 96 --d-model 16 --seq-len 8 --batch 4 --ranks 2 --steps 3"


def gradtrain_cases():
    base = "gradtrain --model mlp --ranks 4 --batch 16 --seed 1 -q"
    tr = f"{base} --steps 5"
    for ex in EXCHANGES:
        density = "" if ex == "ring" else " --density 0.05"
        C(f"train-{ex}", f"{tr} --exchange {ex}{density} --metrics tr-{ex}.parquet")
    C("train-onebit-lamb", f"{tr} --exchange onebit --optimizer onebit-lamb --freeze-step 2 --lr 0.01 "
      "--metrics tr-onebit-lamb.parquet")
    C("train-onebit-adam", f"{tr} --exchange onebit --optimizer onebit-adam --freeze-step 2 --lr 0.01 "
      "--onebit-exact --metrics tr-onebit-adam.parquet")
    C("train-onebit-basic", f"{tr} --exchange onebit --optimizer onebit-lamb --freeze-step 2 --onebit-basic "
      "--onebit-clip off --onebit-mask none --metrics tr-onebit-basic.parquet")
    for old in ("dense", "topk", "ring-fp16"):
        C(f"train-old-{old}", f"{tr} --exchange {old} --metrics tr-old-{old}.parquet")
    C("train-wire-fp16", f"{tr} --wire fp16 --metrics tr-wire.parquet")
    for opt, extra in (("adam", ""), ("adamw", "--weight-decay 0.01"), ("lamb", "--warmup 2 --decay cosine")):
        C(f"train-{opt}", f"{tr} --optimizer {opt} --lr 0.01 {extra} --metrics tr-{opt}.parquet")
    C("train-sgd-momentum", f"{tr} --momentum 0.9 --nesterov --weight-decay 0.0001 --decay linear "
      "--metrics tr-momentum.parquet")
    C("train-oktopk-flags", f"{tr} --exchange oktopk --density 0.02 --period 2 --reeval 2 --adjust paper "
      "--reeval-step-d run --dense-warmup 1 --xi --metrics tr-oktopk-flags.parquet")
    C("train-eval-check", f"{tr} --eval-every 2 --check-every 1 --metrics-every 2 --metrics tr-eval.parquet")
    C("train-rss", f"{tr} --rss --metrics tr-rss.parquet")  # peak_rss_bytes: masked
    C("train-cnn", "gradtrain --model cnn --ranks 2 --steps 2 --batch 8 --seed 1 -q --metrics tr-cnn.parquet")
    C("train-data-file", "gradtrain --model mlp --data data.parquet --hidden 8 --ranks 2 --steps 3 --batch 4 "
      "--seed 1 -q --metrics tr-data.parquet")
    C("train-lstm-lm", f"gradtrain --model lstm-lm {TINY_LM} --hidden 16 --seed 1 -q --metrics tr-lstm.parquet")
    lm = f"gradtrain --model transformer-lm {TINY_LM} --layers 1 --heads 2 --seed 1 -q"
    for sched in ("fifo", "embrace", "2d"):
        C(f"train-embrace-{sched}", f"{lm} --exchange embrace --schedule {sched} --metrics tr-emb-{sched}.parquet")
    C("train-embrace-unique", f"{lm} --exchange embrace --lookup unique --metrics tr-emb-unique.parquet")
    for ex in ("allgather", "allgather-raw"):
        C(f"train-{ex}", f"{lm} --exchange {ex} --optimizer adam --lr 0.01 --metrics tr-{ex}.parquet")
    C("train-comm-trace", f"{base} --exchange oktopk --steps 2 --comm-trace ct-train.parquet")
    C("train-metrics-stdout", f"{base} --steps 2 --run mine --metrics -")
    C("train-summary", "gradtrain --model mlp --ranks 2 --steps 3 --batch 8 --seed 1 --exchange topka --density 0.05")
    C("train-summary-lm", f"gradtrain --model transformer-lm {TINY_LM} --layers 1 --heads 2 --seed 1")
    ck = "gradtrain --model mlp --ranks 2 --batch 8 --seed 1 -q --checkpoint ck --checkpoint-every 2"
    C("train-checkpoint", f"{ck} --steps 4 --metrics tr-ck.parquet")
    C("train-resume", f"{ck} --steps 6 --resume --metrics tr-ck.parquet")
    E("err-train-checkpoint-other", "gradtrain --model mlp --ranks 2 --batch 8 --seed 2 -q --checkpoint ck "
      "--checkpoint-every 2 --steps 2")
    C("train-overwrite-checkpoint", "gradtrain --model mlp --ranks 2 --batch 8 --seed 2 -q --checkpoint ck "
      "--checkpoint-every 2 --steps 2 --overwrite-checkpoint")
    for name, flags in (("exchange", "--exchange bogus"), ("model", "--model resnet"),
                        ("optimizer", "--optimizer rmsprop"), ("data", "--data imagenet"),
                        ("density", "--exchange topka --density 0"), ("onebit-sgd", "--exchange onebit"),
                        ("schedule-ring", "--schedule 2d"), ("lookup-ring", "--lookup unique"),
                        ("resume-nockpt", "--resume"), ("ranks-0", "--ranks 0"), ("device", "--device tpu"),
                        ("wire", "--wire fp8"), ("decay", "--decay step"), ("period-ring", "--period 4"),
                        ("lm-digits", "--model transformer-lm --data digits"),
                        ("missing-data", "--data missing.parquet"), ("backend", "--backend nccl")):
        ranks = "" if "--ranks" in flags else "--ranks 2 "
        E(f"err-train-{name}", f"gradtrain {ranks}--steps 2 {flags}")


def gradreport_cases():
    ms = "ar-ring-m.parquet ar-topka-m.parquet ar-oktopk-m.parquet ar-onebit-m.parquet"
    bytes_ = "--metric bytes_sent,bytes_recv,messages,nnz,model_bytes_sent"
    C("report-table", f"gradreport table {ms} {bytes_}")
    C("report-table-phases-csv", f"gradreport table {ms} --metric bytes_sent:*,messages:* --format csv")
    C("report-table-sum-json", f"gradreport table {ms} --by algo,step,rank --stat sum {bytes_} --format json")
    C("report-table-all", "gradreport table ar-oktopk-m.parquet")
    C("report-table-stats", f"gradreport table {ms} --stat mean --no-range --metric bytes_sent,nnz")
    C("report-table-minmax", f"gradreport table {ms} --stat max --by run --metric bytes_sent,residual_norm")
    C("report-table-train", "gradreport table tr-ring.parquet tr-oktopk.parquet tr-deft.parquet --by run "
      "--metric loss,eval_accuracy,bytes_sent --stat last")
    C("report-table-per-file", "gradreport table ar-onebit-state1-m.parquet ar-onebit-state2-m.parquet --per-file "
      "--metric bytes_sent,worker_error_norm")
    C("report-table-fixed", "gradreport table fixed-m.parquet --by algo,world_size --metric time_comm_s,time_compute_s",
      exact=True)
    C("report-table-stdin", "gradreport table --metric k_target,nnz,threshold --by step", stdin="sel-ok-m.parquet")
    C("report-table-select", "gradreport table sel-topk-m.parquet sel-gk-m.parquet sel-dgc-m.parquet --by run")
    C("report-table-partition", "gradreport table part-deft-m.parquet part-oktopk-m.parquet --by tool")
    C("report-volume", f"gradreport volume {ms} ar-gtopk-m.parquet ar-topkdsa-m.parquet --phases")
    C("report-volume-n", "gradreport volume ar-ring-m.parquet ar-sel-topka-m.parquet bench-dense.parquet "
      "--n 34261 --density 0.01 --format csv")
    C("report-volume-json", "gradreport volume --by run --metric bytes_recv --format json", stdin="ar-deft-m.parquet")
    C("report-plot-volume", f"gradreport plot volume {ms} --n 34261 --density 0.01 -o volume.svg", exact=True)
    C("report-plot-loss", "gradreport plot loss tr-ring.parquet tr-oktopk.parquet tr-onebit-lamb.parquet -o loss.svg "
      "--csv loss.csv", exact=True)
    C("report-plot-loss-bytes", "gradreport plot loss tr-ring.parquet tr-topka.parquet --x bytes --smooth 2 "
      "--title 'loss vs bytes' --size 640x400 -o loss-bytes.svg", exact=True)
    C("report-plot-loss-time", "gradreport plot loss fixed-m.parquet --x time -o loss-time.svg --also pdf,png",
      exact=True)
    C("report-plot-breakdown", "gradreport plot breakdown fixed-m.parquet -o breakdown.svg --csv breakdown.csv",
      exact=True)
    C("report-plot-scaling", "gradreport plot scaling fixed-m.parquet --project-to 64 -o scaling.svg",
      exact=True)
    C("report-plot-scaling-n", f"gradreport plot scaling {ms} --n 34261 --alpha-us 2 --bandwidth-gbps 1 -o -", exact=True)
    C("report-tensor", "gradreport tensor sel-topk.parquet --step 0 --rank 1")
    C("report-tensor-csv", "gradreport tensor ar-topka.parquet --format csv")
    C("report-tensor-json", "gradreport tensor --format json --step 1", stdin="emb.parquet")
    sim = "gradreport simulate ct-ring.parquet --compute none"
    C("report-simulate", f"{sim} --link-rate 1Gbps --latency 50us -o sim.parquet", keep=("sim_time_s",))
    C("report-simulate-oktopk", "gradreport simulate ct-oktopk.parquet --compute 0.001 --format csv -o sim.csv",
      keep=("sim_time_s",))
    C("report-simulate-fat-tree", f"{sim} --topology fat-tree --no-phases --steps 0,2 --scale-bytes 100 --format json")
    C("report-simulate-dragonfly", f"{sim} --topology dragonfly --hosts-per-node 2 --link-rate 100Gbps")
    C("report-simulate-factors", "gradreport simulate ct-emb.parquet --compute none --bw-factor '65472:0.94;0:0.8' "
      "--lat-factor 0:1.5 --smpi-cfg network/crosstraffic:1 --latency 1ms")
    C("report-simulate-bench", "gradreport simulate ct-bench.parquet --compute none --link-rate 12.5MBps")
    C("report-simulate-train", "gradreport simulate ct-train.parquet --compute none --intra-rate 10GBps --nodes 4")
    E("err-report-table-tensor", "gradreport table t.parquet")
    E("err-report-table-missing", "gradreport table missing.parquet")
    E("err-report-table-by", "gradreport table ar-ring-m.parquet --by colour")
    E("err-report-table-stat", "gradreport table ar-ring-m.parquet --stat mode")
    E("err-report-table-metric", "gradreport table ar-ring-m.parquet --metric no_such_metric")
    E("err-report-plot-kind", "gradreport plot pie ar-ring-m.parquet -o x.svg")
    E("err-report-plot-output", "gradreport plot loss tr-ring.parquet")
    E("err-report-plot-ext", "gradreport plot loss tr-ring.parquet -o x.gif")
    E("err-report-volume-n", "gradreport volume ar-ring-m.parquet --n 12x")
    E("err-report-tensor-metrics", "gradreport tensor ar-ring-m.parquet")
    E("err-report-simulate-metrics", "gradreport simulate ar-ring-m.parquet")
    E("err-report-simulate-topology", "gradreport simulate ct-ring.parquet --topology torus")
    E("err-report-simulate-rate", "gradreport simulate ct-ring.parquet --link-rate fast")
    E("err-report-nocommand", "gradreport")


for _group in (help_cases, gradtrace_cases, gradselect_cases, gradpartition_cases, gradallreduce_cases,
               gradallreduce_error_cases, gradallreduce_bench_model_cases, mpirun_cases, gradtrain_cases,
               gradreport_cases):
    _group()


# ------------------------------------------------------------------------------ running
def snapshot(root):
    """{relative path: (size, mtime_ns, inode)} of every file under ROOT."""
    out = {}
    for dp, dn, fn in os.walk(root):
        for f in fn:
            p = os.path.join(dp, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def environment(work):
    """A fixed environment: nothing of the caller's leaks into the tools (mpirun's and the
    memory limit's variables, terminal width, a GRADKIT_* setting)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "LC_ALL": "C.UTF-8",
           "TMPDIR": os.path.join(work, ".tmp"), "GRADKIT_MAX_MEMORY": "8G",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "GRADKIT_COMM_TIMEOUT": "120"}
    return env


def argv_of(case, bin_dir):
    argv = list(case["argv"])
    tool = os.path.join(bin_dir, argv[0])
    if case.get("mpi"):
        return ["mpirun", "-np", str(case["mpi"]), "--oversubscribe", tool] + argv[1:]
    return [tool] + argv[1:]


def run_case(case, ctx):
    work = ctx["work"]
    before = snapshot(work)
    env = environment(work)
    env.update(case.get("env", {}))
    stdin = open(os.path.join(work, case["stdin"]), "rb") if case.get("stdin") else subprocess.DEVNULL
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv_of(case, ctx["bin"]), cwd=work, env=env, stdin=stdin,
                           capture_output=True, timeout=TIMEOUT_S)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", e.stdout or b"", e.stderr or b""
    finally:
        if stdin is not subprocess.DEVNULL:
            stdin.close()
    elapsed = time.monotonic() - t0
    after = snapshot(work)
    files = {}
    for rel in sorted(after):
        if before.get(rel) != after[rel]:
            files[rel] = file_digest(os.path.join(work, rel), rel, ctx, case)
    for rel in sorted(set(before) - set(after)):
        files[rel] = {"kind": "deleted"}
    shown = ["<BIN>/" + case["argv"][0]] + list(case["argv"][1:])
    if case.get("mpi"):
        shown = ["mpirun", "-np", str(case["mpi"]), "--oversubscribe"] + shown
    rec = {"name": case["name"], "argv": shown, "exit": code,
           "stdout": stream_digest(out, ctx, case), "stderr": mask_text(err, ctx, case),
           "files": files}
    if case.get("stdin"):
        rec["stdin"] = case["stdin"]
    return rec, elapsed


def expectation(case, rec):
    """A warning when a case meant to pass fails, or one meant to fail passes (a broken case
    list records nothing useful)."""
    want_fail = case.get("fail", False)
    if (rec["exit"] != 0) != want_fail:
        err = rec["stderr"].strip().splitlines()
        note = " (a failure was expected)" if want_fail else ""
        return f"warning: {case['name']}: exit {rec['exit']}{note}: {err[-1] if err else ''}"
    return None


def run_all(bin_dir, verbose):
    bin_dir = os.path.abspath(bin_dir)
    for tool in {c["argv"][0] for c in CASES}:
        if not os.access(os.path.join(bin_dir, tool), os.X_OK):
            sys.exit(f"error: {os.path.join(bin_dir, tool)} is not an executable (give --bin DIR)")
    mpirun = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="gradkit-golden-")
    os.makedirs(os.path.join(work, ".tmp"))
    real = os.path.realpath(work)
    paths = sorted({(work, "<TMP>"), (real, "<TMP>"), (bin_dir, "<BIN>"),
                    (os.path.realpath(bin_dir), "<BIN>")}, key=lambda p: -len(p[0]))
    ctx = {"work": work, "bin": bin_dir, "paths": paths}
    setup_inputs(work)
    records, warnings, t_all = [], [], time.monotonic()
    try:
        for case in CASES:
            if case.get("mpi") and not mpirun:
                records.append({"name": case["name"], "skipped": "mpirun not found"})
                continue
            rec, dt = run_case(case, ctx)
            records.append(rec)
            w = expectation(case, rec)
            if w:
                warnings.append(w)
            if verbose:
                print(f"{dt:6.2f}s  exit {rec['exit']:<3} {case['name']}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for w in warnings:
        print(w, file=sys.stderr)
    return records, time.monotonic() - t_all


# ------------------------------------------------------------------------------ compare
def first_line_diff(old, new):
    a, b = old.split("\n"), new.split("\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}:\n      was: {x!r}\n      now: {y!r}"
    if len(a) != len(b):
        i = min(len(a), len(b))
        extra = (a if len(a) > len(b) else b)[i]
        which = "was" if len(a) > len(b) else "now"
        return f"{len(a)} lines, now {len(b)}; line {i + 1} only {which}: {extra!r}"
    return "differs (no line differs: line endings?)"


def parquet_diffs(old, new):
    out = []
    if old["schema"] != new["schema"]:
        for i, (x, y) in enumerate(zip(old["schema"], new["schema"])):
            if x != y:
                out.append(f"schema field {i}: was {x}, now {y}")
                break
        else:
            out.append(f"schema: {len(old['schema'])} fields, now {len(new['schema'])}")
    for k in sorted(set(old["meta"]) | set(new["meta"])):
        if old["meta"].get(k) != new["meta"].get(k):
            out.append(f"metadata {k}: was {old['meta'].get(k)!r}, now {new['meta'].get(k)!r}")
    if old["layout"] != new["layout"]:
        out.append(f"layout (row groups, codecs, encodings): was {json.dumps(old['layout'])[:300]}, "
                   f"now {json.dumps(new['layout'])[:300]}")
    if old["rows"] != new["rows"]:
        out.append(f"rows: was {old['rows']}, now {new['rows']}")
    cols = [c for c in old["columns"] if old["columns"][c] != new["columns"].get(c)]
    if cols:
        out.append(f"columns that differ: {', '.join(cols)}")
    for i, (x, y) in enumerate(zip(old["row_hash"], new["row_hash"])):
        if x != y:
            out.append(f"first differing row {i} (columns {', '.join(old.get('names', []))}):\n"
                       f"      was: {old['row_text'][i]}\n      now: {new['row_text'][i]}")
            break
    if not out:
        out.append("digest differs")
    return out


def value_diffs(what, old, new):
    if old == new:
        return []
    if isinstance(old, str) and isinstance(new, str):
        return [f"{what}: {first_line_diff(old, new)}"]
    ko = old.get("kind") if isinstance(old, dict) else "text"
    kn = new.get("kind") if isinstance(new, dict) else "text"
    if ko != kn:
        return [f"{what}: was {ko}, now {kn}"]
    if ko == "parquet":
        return [f"{what}: {d}" for d in parquet_diffs(old, new)]
    if ko == "text":
        return [f"{what}: {first_line_diff(old['text'], new['text'])}"]
    if ko == "safetensors" and old["header"] != new["header"]:
        return [f"{what}: safetensors header: {first_line_diff(old['header'], new['header'])}"]
    return [f"{what}: content differs ({ko})"]


def case_diffs(old, new):
    if old.get("skipped") or new.get("skipped"):
        return [] if old.get("skipped") == new.get("skipped") else [
            f"skipped: was {old.get('skipped')!r}, now {new.get('skipped')!r}"]
    out = []
    if old["argv"] != new["argv"]:
        out.append(f"argv: was {old['argv']}, now {new['argv']} (the case list changed)")
    if old["exit"] != new["exit"]:
        out.append(f"exit: was {old['exit']}, now {new['exit']}")
    out += value_diffs("stdout", old["stdout"], new["stdout"])
    out += value_diffs("stderr", old["stderr"], new["stderr"])
    for rel in sorted(set(old["files"]) | set(new["files"])):
        if rel not in new["files"]:
            out.append(f"file {rel}: written before, not now")
        elif rel not in old["files"]:
            out.append(f"file {rel}: written now, not before")
        else:
            out += value_diffs(f"file {rel}", old["files"][rel], new["files"][rel])
    return out


def compare(manifest, records):
    old = {c["name"]: c for c in manifest["cases"]}
    new = {c["name"]: c for c in records}
    n_diff, n_files = 0, 0
    for name in [c["name"] for c in manifest["cases"]] + [n for n in new if n not in old]:
        if name not in new:
            print(f"{name}: in the manifest, not in the case list")
            n_diff += 1
            continue
        if name not in old:
            print(f"{name}: a new case, not in the manifest")
            n_diff += 1
            continue
        n_files += len(new[name].get("files", {}))
        d = case_diffs(old[name], new[name])
        if d:
            n_diff += 1
            print(f"== {name}: {' '.join(new[name].get('argv', []))}")
            for line in d:
                print(f"   {line}")
    return n_diff, len(new), n_files


# ------------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode, what in (("record", "run the cases, write the manifest"),
                       ("compare", "run the cases, print every difference from the manifest")):
        p = sub.add_parser(mode, help=what)
        p.add_argument("manifest", help="the manifest (JSON)")
        p.add_argument("--bin", default="target/release", help="directory of the six binaries")
        p.add_argument("-v", "--verbose", action="store_true", help="one line per case on stderr")
    sub.add_parser("list", help="the cases, one a line")
    a = ap.parse_args()
    if a.mode == "list":
        for c in CASES:
            print(c["name"], " ".join(c["argv"]))
        return 0
    if a.mode == "compare":
        with open(a.manifest, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            sys.exit(f"error: {a.manifest} is not a {FORMAT} manifest")
    records, secs = run_all(a.bin, a.verbose)
    n_files = sum(len(r.get("files", {})) for r in records)
    if a.mode == "record":
        os.makedirs(os.path.dirname(os.path.abspath(a.manifest)), exist_ok=True)
        with open(a.manifest, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "cases": records}, f, indent=1, ensure_ascii=False)
            f.write("\n")
        skipped = sum(1 for r in records if r.get("skipped"))
        print(f"golden: recorded {len(records)} cases ({skipped} skipped), {n_files} files "
              f"in {secs:.0f} s to {a.manifest}")
        return 0
    n_diff, n_cases, n_files = compare(manifest, records)
    if n_diff:
        print(f"golden: {n_diff} of {n_cases} cases differ from {a.manifest}")
        return 1
    print(f"golden: {n_cases} cases, {n_files} files, all identical ({secs:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
