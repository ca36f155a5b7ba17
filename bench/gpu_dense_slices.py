"""Slice height of the dequant + cuBLAS path (``backends/cuda/dense_slices.py``) on the GPU.

A slice of the dequantized weight that fits in L2 is read back by cuBLAS from L2 rather than
HBM; a taller one keeps cuBLAS more efficient. This times ``QuantLinear.__call__`` at large M
for several slice heights beside cuBLAS bf16 on the dense weight (medians, L2 flushed before
each call), one process, and writes JSON:

    python3 bench/gpu_dense_slices.py --out $OUT/dense-slices.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json

import torch
import torch.nn.functional as F

from quantrt.backends.triton import gguf_kernel as triton_gguf
from quantrt.backends.triton import lut4_kernel as triton_lut4
from quantrt.bench import git_sha, median_us, versions
from quantrt.env import Overrides
from quantrt.layers import QuantLinear
from quantrt.reference import quantize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="gguf-q4_k,gguf-q6_k,gguf-q8_0")
    ap.add_argument("--shapes", default="8192x57344,28672x8192")
    ap.add_argument("--ms", default="256,1024")
    ap.add_argument("--rows", default="0,4096,2048,1024,512", help="slice heights; 0 = the table's")
    args = ap.parse_args()
    doc = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "git_sha": git_sha(),
        "versions": versions(),
        "command": "python3 bench/gpu_dense_slices.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "rows": [],
    }
    for scheme in args.schemes.split(","):
        for shape in args.shapes.split(","):
            K, N = (int(v) for v in shape.split("x"))
            w = torch.randn(N, K, device="cuda") * 0.02
            # by name: the kernels whose large batches take dequant + cuBLAS slices
            kernel = "cuda.triton_gguf" if scheme.startswith("gguf") else "cuda.triton_bnb4"
            layer = QuantLinear.from_canonical(
                quantize(w, scheme),
                device="cuda",
                act_dtype=torch.bfloat16,
                overrides=Overrides(kernel=kernel),
            )
            dense = w.to(torch.bfloat16)
            del w
            base = layer._state
            module = triton_gguf if layer.kernel_name == "cuda.triton_gguf" else triton_lut4
            for m in (int(v) for v in args.ms.split(",")):
                x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
                cublas = median_us(lambda x=x, d=dense: F.linear(x, d))
                for rows in (int(v) for v in args.rows.split(",")):
                    layout = base.layout if rows == 0 else dataclasses.replace(base.layout, slice_rows=rows)
                    layer._state = module.build(layer._kernel, layout, layer.layer_spec())
                    t = median_us(lambda x=x, lay=layer: lay(x))
                    row = {"scheme": scheme, "K": K, "N": N, "M": m, "slice_rows": layer._state.layout.slice_rows,
                           "quantrt_us": round(t, 1), "cublas_bf16_us": round(cublas, 1),
                           "vs_cublas": round(cublas / t, 3)}  # fmt: skip
                    doc["rows"].append(row)
                    print(json.dumps(row), flush=True)
                layer._state = base
            del layer, dense
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
