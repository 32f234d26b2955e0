"""The `tensor/1` table of docs/FORMAT.md, as pyarrow types."""

import pyarrow as pa

SCHEMA_KEY = "gradkit.schema"
TENSOR = "tensor/1"


def _list(item):
    # Items are never null (the Rust writer declares them so); nullability of list items is
    # not compared by the readers, but matching it keeps the files identical in shape.
    return pa.list_(pa.field("item", item, nullable=False))


TENSOR_FIELDS = [
    pa.field("step", pa.uint32(), nullable=False),
    pa.field("rank", pa.uint32(), nullable=False),
    pa.field("layer_id", pa.uint32(), nullable=False),
    pa.field("layer", pa.string(), nullable=False),
    pa.field("numel", pa.uint64(), nullable=False),
    pa.field("shape", _list(pa.uint32()), nullable=True),
    pa.field("indices", _list(pa.uint32()), nullable=True),
    pa.field("values", _list(pa.float32()), nullable=False),
]


def tensor_schema(metadata):
    """The tensor/1 schema with `metadata` (str → str) plus the schema key."""
    meta = {SCHEMA_KEY: TENSOR}
    meta.update({str(k): str(v) for k, v in metadata.items()})
    return pa.schema(TENSOR_FIELDS, metadata=meta)
