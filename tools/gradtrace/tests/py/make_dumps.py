"""Writes gradient dumps with numpy into DIR: .npz, per-layer .npy (one big-endian) and
.safetensors built by hand (8-byte header length, JSON header, raw little-endian data), then
records the float32 each value must become in DIR/expected.npz for check_import.py."""
import json
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(5)
expected = {}


def layers(step, rank):
    # Parameter order on purpose not alphabetical.
    return {
        "fc2.weight": (rng.standard_normal((3, 4)) * 10 ** rng.uniform(-3, 1)).astype(np.float32),
        "fc1.bias": rng.standard_normal(5).astype(np.float32),
        "emb.weight": rng.standard_normal((2, 3)),  # float64: gradtrace rounds to float32
        "ln.weight": rng.standard_normal(4).astype(np.float16),
    }


def remember(kind, step, rank, arrays):
    for name, a in arrays.items():
        expected[f"{kind}/{step}/{rank}/{name}"] = a.astype(np.float32)


os.makedirs(f"{out}/npz")
os.makedirs(f"{out}/npy")
os.makedirs(f"{out}/st")
for step in range(2):
    for rank in range(2):
        a = layers(step, rank)
        np.savez(f"{out}/npz/step{step}_rank{rank}.npz", **a)
        remember("npz", step, rank, a)
        a = layers(step, rank)
        for name, arr in a.items():
            if name == "fc1.bias":
                arr = arr.astype(">f4")  # big-endian on disk
            np.save(f"{out}/npy/step{step}_rank{rank}.{name}.npy", arr)
        remember("npy", step, rank, a)
        # safetensors by hand: F32, F64, F16 and BF16 (numpy has no bfloat16: keep the top
        # 16 bits of a float32, which is exactly what the BF16 value is).
        a = layers(step, rank)
        bf = rng.standard_normal(3).astype(np.float32)
        bf16 = (bf.view(np.uint32) >> 16).astype("<u2")
        tensors = [(n, {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
                        np.dtype(np.float16): "F16"}[arr.dtype], arr.shape,
                    arr.astype(arr.dtype.newbyteorder("<")).tobytes()) for n, arr in a.items()]
        tensors.append(("attn.bf16", "BF16", (3,), bf16.tobytes()))
        header, data = {"__metadata__": {"format": "pt"}}, b""
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": list(shape),
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        with open(f"{out}/st/step{step}_rank{rank}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)
        remember("st", step, rank, a)
        expected[f"st/{step}/{rank}/attn.bf16"] = (bf16.astype(np.uint32) << 16).view(np.float32)
np.savez(f"{out}/expected.npz", **expected)
