"""Shared by the tests: where the gradkit binaries are, and running them."""

import os
import subprocess
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def bin_dir():
    """GRADKIT_BIN (make test sets it: a missing binary there fails the test), else the
    workspace's release build; tests that need the tools are skipped when neither exists."""
    explicit = os.environ.get("GRADKIT_BIN")
    if explicit:
        return os.path.abspath(explicit)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release")


def tool(name):
    path = os.path.join(bin_dir(), name)
    if not os.path.isfile(path):
        if os.environ.get("GRADKIT_BIN"):
            raise AssertionError(f"{path} is missing (GRADKIT_BIN is set): build the tools first")
        raise unittest.SkipTest(f"{path} is missing: cargo build --release first")
    return path


def run_tool(name, *args, cwd=None):
    p = subprocess.run([tool(name), *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def have_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def column_chunks(path):
    """[(row group, column path, first byte, length)] of every column chunk of a Parquet
    file, from its footer: a chunk starts at its dictionary page when it has one."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    out = []
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            start = col.data_page_offset
            if col.has_dictionary_page and 0 < col.dictionary_page_offset < start:
                start = col.dictionary_page_offset
            out.append((g, col.path_in_schema, start, col.total_compressed_size))
    return out


def flipped(src, dst, at, n=4):
    """A copy of `src` at `dst` with the `n` bytes from offset `at` inverted."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    for i in range(at, at + n):
        data[i] ^= 0xFF
    with open(dst, "wb") as f:
        f.write(data)
    return dst


def launch(cmd, what, *, env=None, timeout=600, check=True):
    """Runs `cmd` (mpirun or torchrun and a script of the tests) with the tests' directory and
    the package on PYTHONPATH, as root where containers run as root; `check`: a failure raises
    with the end of its output, named `what`."""
    here = os.path.dirname(os.path.abspath(__file__))
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([here, os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")])
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        full.setdefault(k, "1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{what} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p
