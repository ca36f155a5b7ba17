"""W8A8 at small batches: the one-launch fused kernel (``backends/triton/w8a8_fused.py``) beside the
two-pass path it replaces (activation quantization, then the split-K GEMM), and cuBLAS bf16, in one
run on this GPU.

    python3 bench/gpu_w8a8_fused.py --out FILE.json [--schemes w8a8-fp8-ch,w8a8-int-ch-sym]
        [--shapes 8192x57344,28672x8192,4096x28672,4096x4096] [--ms 1,16]

Both paths are the same ``QuantLinear`` built twice from one random weight (the second with the
fused strategy left out of ``prepare``). Each cell checks both against the fp32 reference first,
then times ``QuantLinear.__call__`` (medians, L2 flushed, ``quantrt.bench.median_us``) and the
host cost per call on a 1024x1024 layer (``host_us``), F.linear beside it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from quantrt import reference
from quantrt.backends.triton import w8a8_ops
from quantrt.bench import copy_bandwidth_tbps, host_us, median_us, random_weight, run_header
from quantrt.layers import QuantLinear


def layers(scheme: str, N: int, K: int) -> tuple[Any, QuantLinear, QuantLinear]:
    canon = random_weight(scheme, N, K)
    fused = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
    keep: Callable = w8a8_ops.with_fused
    w8a8_ops.with_fused = lambda strategies, kind: strategies  # the two-pass strategies only
    try:
        two_pass = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
    finally:
        w8a8_ops.with_fused = keep
    return canon, fused, two_pass


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float().cpu() - ref).norm() / ref.norm())


def host_row(scheme: str, m: int) -> dict[str, Any]:
    """Host time per call of both paths and F.linear on a 1024x1024 layer."""
    _, fused, two = layers(scheme, 1024, 1024)
    dense = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    row = {"scheme": scheme, "M": m, "fused_us": host_us(lambda: fused(x)), "two_pass_us": host_us(lambda: two(x)),
           "F_linear_us": host_us(lambda: F.linear(x, dense))}  # fmt: skip
    row["fused_ratio"] = round(row["fused_us"] / row["F_linear_us"], 3)
    return row


def time_cell(scheme: str, K: int, N: int, m: int, copy_tbps: float) -> dict[str, Any]:
    """One shape and batch: both paths checked (where the CPU reference is quick), then timed."""
    canon, fused, two = layers(scheme, N, K)
    dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    cell: dict[str, Any] = {"scheme": scheme, "K": K, "N": N, "M": m,
                            "fused_strategy": fused._state.strategy(m).name,
                            "two_pass_strategy": two._state.strategy(m).name}  # fmt: skip
    if N * K <= 1 << 25:
        ref = reference.linear(x.cpu(), canon.to("cpu"), out_dtype=torch.float32)
        cell["fused_err"], cell["two_pass_err"] = rel(fused(x), ref), rel(two(x), ref)
    cell["cublas_us"] = median_us(lambda: F.linear(x, dense))
    cell["fused_us"] = median_us(lambda: fused(x))
    cell["two_pass_us"] = median_us(lambda: two(x))
    cell["speedup"] = round(cell["two_pass_us"] / cell["fused_us"], 3)
    cell["fused_vs_cublas"] = round(cell["cublas_us"] / cell["fused_us"], 3)
    cell["fused_pct_copy"] = round(N * K / (cell["fused_us"] * 1e-6) / (copy_tbps * 1e12) * 100, 1)
    return cell


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="w8a8-fp8-ch,w8a8-int-ch-sym")
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672,4096x4096")
    ap.add_argument("--ms", default="1,16")
    args = ap.parse_args()
    doc = {
        **run_header("W8A8 small batches: fused kernel vs two-pass", "bench/gpu_w8a8_fused.py", args),
        "copy_TBps": copy_bandwidth_tbps(),
        "rows": [],
        "host": [],
    }
    for scheme in args.schemes.split(","):
        for m in map(int, args.ms.split(",")):
            row = host_row(scheme, m)
            doc["host"].append(row)
            print(f"host {scheme} M={m}: fused {row['fused_us']:.1f} us, two-pass {row['two_pass_us']:.1f} us, "
                  f"F.linear {row['F_linear_us']:.1f} us ({row['fused_ratio']}x)", flush=True)  # fmt: skip
        for shape in args.shapes.split(","):
            K, N = map(int, shape.split("x"))
            for m in map(int, args.ms.split(",")):
                cell = time_cell(scheme, K, N, m, doc["copy_TBps"])
                doc["rows"].append(cell)
                print(f"{scheme} {K}x{N} M={m}: fused {cell['fused_us']:.1f} us ({cell['fused_vs_cublas']}x cuBLAS, "
                      f"{cell['fused_pct_copy']}% copy), two-pass {cell['two_pass_us']:.1f} us, x{cell['speedup']}",
                      flush=True)  # fmt: skip
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
