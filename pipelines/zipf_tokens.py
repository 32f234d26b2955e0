"""A Zipf(1.1) token stream over V ids as a `tokens` file for gradtrain (data/README.md):
i.i.d. draws (gradtrain's synthetic-lm builds a V×V Markov matrix, which does not fit in
memory at V = 50k), seed 1, rows of 1000 tokens; token V−1 appears once so vocab = V.

    python3 pipelines/zipf_tokens.py V N OUT.parquet
"""
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

v, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(1)
p = 1.0 / np.arange(1, v + 1) ** 1.1
p /= p.sum()
t = rng.choice(v, size=n, p=p).astype(np.int32)
t[0] = v - 1
rows = [t[i:i + 1000].tolist() for i in range(0, n, 1000)]
pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}), out)
