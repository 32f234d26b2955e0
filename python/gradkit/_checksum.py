"""Checksums of the column chunks of a Parquet file, checked before its rows are used.

Two kinds, both optional in a file:

- `gradkit.crc32` (docs/FORMAT.md § How files are written): the Rust writer stores in the
  footer one CRC-32 (IEEE, `zlib.crc32`) per column chunk, 8 lower-case hex digits each, row
  group by row group, column by column in schema order (leaf columns), over the chunk's bytes:
  from its dictionary page if it has one, else its first data page, `total_compressed_size`
  bytes. A damaged chunk is found even where it still decodes (a flipped bit inside a float).
- Parquet's own page CRCs, which pyarrow writes with `write_page_checksum=True` (the Python
  writers, `WRITE_OPTIONS`) and checks with `page_checksum_verification=True`
  (`READ_OPTIONS`); both are left out on a pyarrow too old to have them.
"""

import inspect
import zlib

import pyarrow.parquet as pq

KEY = "gradkit.crc32"

# A chunk is hashed in pieces of this size: memory stays bounded for a chunk of gigabytes.
_BLOCK = 1 << 20


def _has_parameter(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# Passed only where pyarrow names the parameter (14 and later): an older ParquetWriter would
# hand an unknown keyword on to the C++ writer properties and fail.
WRITE_OPTIONS = (
    {"write_page_checksum": True}
    if _has_parameter(pq.ParquetWriter.__init__, "write_page_checksum")
    else {}
)
READ_OPTIONS = (
    {"page_checksum_verification": True}
    if _has_parameter(pq.ParquetFile.__init__, "page_checksum_verification")
    else {}
)


def open_file(path, metadata=None):
    """`pq.ParquetFile` of `path` that checks page CRCs where the file has them."""
    return pq.ParquetFile(path, metadata=metadata, **READ_OPTIONS)


def chunk_range(col):
    """(first byte, length) of a column chunk (`ColumnChunkMetaData::byte_range` in Rust)."""
    start = col.data_page_offset
    d = col.dictionary_page_offset if col.has_dictionary_page else None
    if d is not None and 0 < d < start:
        start = d
    return start, col.total_compressed_size


class Checksums:
    """The `gradkit.crc32` of one file, and the chunks already found intact. `verify` reads
    each chunk once however often it is asked for: the cost is the bytes read, once."""

    def __init__(self, path, metadata, value):
        self.path = path
        self.metadata = metadata
        self._hex = value
        self._first = []  # per row group: the index of its first chunk among all
        n = 0
        for g in range(metadata.num_row_groups):
            self._first.append(n)
            n += metadata.row_group(g).num_columns
        self._ok = set()

    def columns_of(self, names):
        """Indices of the leaf columns under the top-level columns `names`."""
        schema = self.metadata.schema
        return [c for c in range(len(schema)) if schema.column(c).path.split(".")[0] in names]

    def verify(self, groups, columns=None):
        """Checks the chunks of `groups` (all columns, or the leaf columns `columns`), each
        the first time it is asked for; a mismatch raises a ValueError naming the file, the
        row group and the column."""
        todo = []
        for g in groups:
            rg = self.metadata.row_group(g)
            for c in range(rg.num_columns) if columns is None else columns:
                if (g, c) not in self._ok:
                    todo.append((g, c))
        if not todo:
            return
        with open(self.path, "rb") as fh:
            for g, c in todo:
                self._verify_chunk(fh, g, c)
                self._ok.add((g, c))

    def _verify_chunk(self, fh, g, c):
        col = self.metadata.row_group(g).column(c)
        start, length = chunk_range(col)
        fh.seek(start)
        crc, left = 0, length
        while left > 0:
            block = fh.read(min(left, _BLOCK))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            left -= len(block)
        i = 8 * (self._first[g] + c)
        want = int(self._hex[i:i + 8], 16)
        if left or crc != want:
            got = "the file ends inside it" if left else f"CRC-32 {crc:08x}"
            raise ValueError(
                f"{self.path}: row group {g} of {self.metadata.num_row_groups}, column "
                f"`{col.path_in_schema}`: checksum mismatch (bytes {start}–{start + length}: "
                f"{got}, the footer says {want:08x}): the file is damaged"
            )


def of(path, metadata):
    """The checksums in the footer of `path` (`metadata`: its `FileMetaData`); None without
    the key. A key that does not hold one checksum per column chunk is a damaged footer."""
    kv = metadata.metadata or {}
    raw = kv.get(KEY.encode())
    if raw is None:
        return None
    chunks = sum(metadata.row_group(g).num_columns for g in range(metadata.num_row_groups))
    try:
        value = raw.decode("ascii")
    except UnicodeDecodeError:
        value = None
    if value is None or len(value) != 8 * chunks or not all(
            ch in "0123456789abcdefABCDEF" for ch in value):
        raise ValueError(
            f"{path}: metadata `{KEY}` does not hold one checksum for each of the file's "
            f"{chunks} column chunks: the footer is damaged"
        )
    return Checksums(path, metadata, value)
