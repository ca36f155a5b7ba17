"""GGUF types on the tensor-core kernel (``cuda.mma_gguf``: q4_k, ``cuda.mma_gguf_q8``: q8_0,
``cuda.mma_gguf_blocks``: q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q5_k, q6_k) beside the kernels they displace:
the CUDA GEMV on the native planes (``cuda.gemv_gguf``, q4_k and q6_k), the
Triton GEMV / fused GEMM / dequant + cuBLAS (``cuda.triton_gguf``), and cuBLAS bf16 on a dense
weight, in one run on this GPU.

    python3 bench/gpu_mma_gguf.py --out FILE.json [--types q4_k,q8_0] [--shapes 8192x57344,...] [--ms 1,2,8,16,64,256]

Weights are random llama.cpp blocks (``random_blocks``: every code and scale byte random,
weight-sized f16 fields). Each cell first checks every kernel against the Triton dequantizer's
weight in fp32 (relative Frobenius error), then times ``QuantLinear.__call__`` (medians, L2
flushed, ``quantrt.bench.median_us``; eager). "% copy" divides the stored block bytes by the time
and this GPU's copy bandwidth measured in the same run. The JSON is rewritten after every cell.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantrt.bench import copy_bandwidth_tbps, median_us, random_weight, run_header
from quantrt.env import Overrides
from quantrt.layers import QuantLinear

#: per type, the tensor-core kernel first, then what it displaces
KERNELS = {
    "q4_k": ("cuda.mma_gguf", "cuda.gemv_gguf", "cuda.triton_gguf"),
    "q8_0": ("cuda.mma_gguf_q8", "cuda.triton_gguf"),
    **{
        t: ("cuda.mma_gguf_blocks", "cuda.triton_gguf")
        for t in ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k")
    },
    "q6_k": ("cuda.mma_gguf_blocks", "cuda.gemv_gguf", "cuda.triton_gguf"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672")
    ap.add_argument("--ms", default="1,2,4,8,16,64,256")
    ap.add_argument("--types", default="q4_k,q8_0")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    copy = copy_bandwidth_tbps()
    doc = {
        **run_header(
            "cuda.mma_gguf vs cuda.gemv_gguf vs cuda.triton_gguf vs cuBLAS bf16 (bench/gpu_mma_gguf.py)",
            "bench/gpu_mma_gguf.py",
            args,
        ),
        "copy_TBps": round(copy, 3),
        "rows": [],
    }
    dt = torch.bfloat16
    for t, K, N in ((t, K, N) for t in args.types.split(",") for K, N in shapes):
        canon = random_weight(f"gguf-{t}", N, K)
        nbytes = canon["qweight"].numel()
        layers = {}
        for name in KERNELS[t]:
            try:
                layers[name] = QuantLinear.from_canonical(
                    canon, device="cuda", act_dtype=dt, overrides=Overrides(kernel=name)
                )
            except Exception as e:  # a kernel that does not take this type is left out, and said so
                print(f"{name}: {e}", flush=True)
        tri = layers["cuda.triton_gguf"]
        w = tri.dequant_rows(0, N)  # the Triton dequantizer's fp32 weight
        dense = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
        for m in ms:
            x = torch.randn(m, K, device="cuda", dtype=dt)
            ref = x.float() @ w.T
            blas = median_us(lambda x=x, w=dense: F.linear(x, w))
            row = {"type": t, "K": K, "N": N, "M": m, "cublas_us": round(blas, 2)}
            for name, layer in layers.items():
                err = float((layer(x).float() - ref).norm() / ref.norm())
                us = median_us(lambda f=layer, x=x: f(x))
                short = name.split(".")[1]
                row[f"{short}_strategy"] = layer._kernel.strategy(layer._state, m)
                row[f"{short}_err"] = round(err, 6)
                row[f"{short}_us"] = round(us, 2)
                row[f"{short}_vs_cublas"] = round(blas / us, 3)
                row[f"{short}_pct_copy"] = round(100 * nbytes / us / 1e6 / copy, 1)
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
        layers = tri = w = dense = canon = None
        torch.cuda.empty_cache()
    for r in doc["rows"]:
        cells = [
            f"{k.split('.')[1]} {r[k.split('.')[1] + '_us']:.1f} us {r[k.split('.')[1] + '_vs_cublas']:.2f}x "
            f"{r[k.split('.')[1] + '_pct_copy']:.1f}%"
            for k in KERNELS[r["type"]]
            if k.split(".")[1] + "_us" in r
        ]
        print(
            f"{r['type']} {r['K']}x{r['N']} M={r['M']}: "
            + " | ".join(cells)
            + f" | cuBLAS {r['cublas_us']:.1f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
