"""Opening reads only headers; one layer's dequantization stays within twice its dense size,
even beside a tensor larger than this machine's memory (a sparse file)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

HUGE = (1 << 20, 1 << 15)  # fp16: 64 GiB declared, more than this machine's RAM
K, N, G = 4096, 4096, 128
PREFIX = "model.layers.0.mlp.down_proj"


def write_sparse_checkpoint(path: Path) -> None:
    """A GPTQ checkpoint written with numpy and the safetensors byte layout; the huge tensor's
    bytes are a hole in the file (truncate extends it without writing)."""
    rng = np.random.default_rng(0)
    small = {
        f"{PREFIX}.qweight": ("I32", rng.integers(-(2**31), 2**31 - 1, size=(K // 8, N), dtype=np.int32)),
        f"{PREFIX}.qzeros": ("I32", np.full((K // G, N // 8), 0x77777777, dtype=np.int32)),
        f"{PREFIX}.scales": ("F16", (rng.random((K // G, N)) * 0.01 + 0.001).astype(np.float16)),
        f"{PREFIX}.g_idx": ("I32", (np.arange(K) // G).astype(np.int32)),
    }
    header, blobs, offset = {}, [], 0
    for name, (dt, arr) in small.items():
        data = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    huge_bytes = HUGE[0] * HUGE[1] * 2
    header["model.embed_tokens.weight"] = {
        "dtype": "F16",
        "shape": list(HUGE),
        "data_offsets": [offset, offset + huge_bytes],
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
        f.truncate(8 + len(raw) + offset + huge_bytes)


SCRIPT = r"""
import json, sys, threading, time
import torch, quantrt

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

ck = quantrt.open_checkpoint(sys.argv[1])
layers = {p: (str(e.scheme), e.N, e.K) for p, e in ck.layers.items()}
base = rss()
peak = [base]
stop = False
def sample():
    while not stop:
        peak[0] = max(peak[0], rss())
        time.sleep(0.0005)
t = threading.Thread(target=sample)
t.start()
qw = dict(ck.weights())[sys.argv[2]]
w = qw.dequantize()
stop = True
t.join()
peak[0] = max(peak[0], rss())
print(json.dumps({"layers": layers, "base": base, "peak": peak[0], "shape": list(w.shape),
                  "finite": bool(torch.isfinite(w).all())}))
"""


def test_huge_sparse_checkpoint_opens_and_one_layer_stays_small(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "gptq",
                    "bits": 4,
                    "group_size": G,
                    "sym": True,
                    "desc_act": False,
                }
            }
        )
    )
    st = tmp_path / "model.safetensors"
    write_sparse_checkpoint(st)
    assert st.stat().st_size > 60 * 2**30 and st.stat().st_blocks * 512 < 100 * 2**20  # sparse: a hole
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), PREFIX],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["layers"]["model.embed_tokens.weight".removesuffix(".weight")] == ["None", HUGE[0], HUGE[1]]
    assert doc["layers"][PREFIX] == ["w4a16-int-g128-sym", N, K]
    assert doc["shape"] == [N, K] and doc["finite"]
    dense = N * K * 4
    grown = doc["peak"] - doc["base"]
    assert grown < 2 * dense, (
        f"resident memory grew {grown / 2**20:.0f} MiB for a {dense / 2**20:.0f} MiB layer"
    )
