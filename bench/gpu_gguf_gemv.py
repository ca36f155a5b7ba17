"""The CUDA GGUF GEMV (``cuda.gemv_gguf``) beside the Triton GEMV of the same planes
(``cuda.triton_gguf``) and cuBLAS bf16, on this GPU, for q4_k and q6_k at small M.

    python3 bench/gpu_gguf_gemv.py --out FILE.json [--shapes 8192x57344,...] [--ms 1,4,8] [--sweep]

Weights are random llama.cpp blocks (every code and scale byte random, finite fp16 block scales),
so no quantization runs here. Each cell first checks both kernels against the Triton dequantizer's
weight in fp32 (relative Frobenius error), then times ``QuantLinear.__call__`` and ``F.linear``
(medians, L2 flushed, ``quantrt.bench.median_us``). "stored TB/s" divides the blocks' bytes by
the time, "% copy" relates it to this GPU's copy bandwidth (read + write) measured in the same run.
``--sweep`` also times the GEMV's launch shapes at M=1 (weight rows and warps per block).
The JSON is rewritten after every cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.nn.functional as F

from quantrt.backends.cuda import gguf_gemv
from quantrt.backends.cuda.cupy_kernels import Launch, compile_all, function
from quantrt.bench import copy_bandwidth_tbps, median_us, random_weight, run_header
from quantrt.env import Overrides
from quantrt.layers import QuantLinear


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672")
    ap.add_argument("--ms", default="1,4,8")
    ap.add_argument("--types", default="q4_k,q6_k")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    copy = copy_bandwidth_tbps()
    doc = {
        **run_header(
            "cuda.gemv_gguf vs cuda.triton_gguf vs cuBLAS bf16 (bench/gpu_gguf_gemv.py)",
            "bench/gpu_gguf_gemv.py",
            args,
        ),
        "copy_tbps": round(copy, 3),
        "rows": [],
        "sweep": [],
    }

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    dt = torch.bfloat16
    for t in args.types.split(","):
        for K, N in shapes:
            canon = random_weight(f"gguf-{t}", N, K)
            nbytes = canon["qweight"].numel()
            cuda = QuantLinear.from_canonical(canon, device="cuda", act_dtype=dt)  # CUDA at M=1, Triton after
            tri = QuantLinear.from_canonical(
                canon, device="cuda", act_dtype=dt, overrides=Overrides(kernel="cuda.triton_gguf")
            )
            assert cuda.kernel_name == "cuda.gemv_gguf", cuda.selection.explain()
            w = tri.dequant_rows(0, N)  # the Triton dequantizer's fp32 weight
            dense_w = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
            for m in ms:
                x = torch.randn(m, K, device="cuda", dtype=dt)
                ref = x.float() @ w.float().T
                err_cuda, err_tri = rel(cuda(x), ref), rel(tri(x), ref)
                us_cuda = median_us(lambda f=cuda, x=x: f(x))
                us_tri = median_us(lambda f=tri, x=x: f(x))
                us_blas = median_us(lambda x=x, w=dense_w: F.linear(x, w))
                row = {
                    "type": t, "K": K, "N": N, "M": m,
                    "strategy": cuda._kernel.strategy(cuda._state, m),
                    "err_cuda": round(err_cuda, 6), "err_triton": round(err_tri, 6),
                    "cuda_us": round(us_cuda, 2), "triton_us": round(us_tri, 2), "cublas_us": round(us_blas, 2),
                    "vs_cublas": round(us_blas / us_cuda, 3), "triton_vs_cublas": round(us_blas / us_tri, 3),
                    "stored_tbps": round(nbytes / us_cuda / 1e6, 3),
                    "pct_copy": round(100 * nbytes / us_cuda / 1e6 / copy, 1),
                }  # fmt: skip
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
                save()
            if args.sweep:
                dev = torch.cuda.current_device()
                cands = [gguf_gemv.GemvShape(1, r, 1, wp) for r in (1, 2, 4, 8) for wp in (1, 2, 4, 8)]
                compile_all(gguf_gemv.SOURCE, [c.expr(dt, t) for c in cands], dev)
                x = torch.randn(1, K, device="cuda", dtype=dt)
                saved = cuda._state
                for c in cands:
                    steps = -(-K // gguf_gemv.STEP_WEIGHTS[t])
                    if c.warps > steps:
                        continue
                    fn = Launch(function(gguf_gemv.SOURCE, c.expr(dt, t), dev), gguf_gemv.ARGS)
                    lay = dataclasses.replace(saved.layout, shapes=(c,), launches=(fn,))
                    cuda._state = gguf_gemv.build(cuda._kernel, lay, cuda.layer_spec())
                    us = median_us(lambda f=cuda, x=x: f(x))
                    s = {"type": t, "K": K, "N": N, "rows": c.rows, "warps": c.warps, "us": round(us, 2),
                         "pct_copy": round(100 * nbytes / us / 1e6 / copy, 1)}  # fmt: skip
                    doc["sweep"].append(s)
                    print(json.dumps(s), flush=True)
                cuda._state = saved
                save()
            cuda = tri = w = dense_w = canon = None  # free before the next shape
            torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
