"""Checks a trace made by `gradtrace import` against expected.npz from make_dumps.py: every
tensor present with its shape, values equal bit for bit, layer ids in the documented order."""
import sys

import numpy as np
import pyarrow.parquet as pq

trace, expected_path, kind, order = sys.argv[1:5]
expected = dict(np.load(expected_path))
want = {k.split("/", 1)[1]: v for k, v in expected.items() if k.startswith(kind + "/")}
rows = pq.read_table(trace).to_pylist()
assert len(rows) == len(want), (len(rows), len(want))
for r in rows:
    key = f'{r["step"]}/{r["rank"]}/{r["layer"]}'
    e = want.pop(key)
    assert r["indices"] is None, key
    assert r["shape"] == list(e.shape), (key, r["shape"], e.shape)
    assert r["numel"] == e.size, key
    got = np.asarray(r["values"], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), e.reshape(-1).view(np.uint32)), key
assert not want, want
names = [r["layer"] for r in rows if r["step"] == 0 and r["rank"] == 0]
ids = [r["layer_id"] for r in rows if r["step"] == 0 and r["rank"] == 0]
assert ids == sorted(ids) == list(range(len(ids))), ids
assert names == order.split(","), names
print("ok", kind, len(rows))
