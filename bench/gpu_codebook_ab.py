"""The two code-book decodes of ``cuda.mma_bnb4`` side by side on this GPU: the book in registers
(``LUT4``, byte permutes) and in shared memory with one copy per bank (``LUT4S``), against cuBLAS
bf16, for bitsandbytes NF4/FP4 at small M.

    python3 bench/gpu_codebook_ab.py --out FILE.json [--schemes w4a16-nf4-g64] [--shapes ...] [--ms 1,16]

Each cell first checks both decodes against the reference dequantizer's weight (relative Frobenius
error of the output), then times both layers and ``F.linear`` in one round (medians, L2 flushed,
``quantrt.bench.median_us``). "stored TB/s" divides the codes and absmax bytes (0.5 + 4/64 bytes
per weight) by the time; "% copy" relates it to this GPU's copy bandwidth in the same run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from quantrt import reference
from quantrt.backends.cuda.mma_codebook import CudaMmaBnb4
from quantrt.backends.cuda.mma_wna16 import LUT4, LUT4S
from quantrt.bench import copy_bandwidth_tbps, git_sha, median_us, versions
from quantrt.layers import QuantLinear

VARIANTS = {"lut4": LUT4, "lut4s": LUT4S}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="w4a16-nf4-g64")
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672")
    ap.add_argument("--ms", default="1,16")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    copy = copy_bandwidth_tbps()
    doc = {
        "what": "cuda.mma_bnb4: code book in registers (lut4) vs shared memory (lut4s) vs cuBLAS bf16",
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(),
        "git": git_sha(),
        "versions": versions(),
        "command": "python3 bench/gpu_codebook_ab.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "copy_tbps": round(copy, 3),
        "rows": [],
    }
    dt = torch.bfloat16
    for scheme in args.schemes.split(","):
        for K, N in shapes:
            canon = reference.quantize(torch.randn(N, K, device="cuda") * 0.02, scheme)
            w = reference.dequantize(canon).to(dt)
            nbytes = N * K // 2 + N * K // canon.scheme.group_size * 4
            lin = QuantLinear.from_canonical(canon, device="cuda", act_dtype=dt)
            assert lin.kernel_name == CudaMmaBnb4.name, lin.selection.explain()
            spec = lin.layer_spec()
            layers = {}
            for name, code in VARIANTS.items():
                kern = type(f"Bnb4_{name}", (CudaMmaBnb4,), {"code": code})()
                layers[name] = (kern, kern.prepare(canon.to("cuda"), spec))
            dense_w = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
            for m in ms:
                x = torch.randn(m, K, device="cuda", dtype=dt)
                ref = x.float() @ w.float().T
                row = {"scheme": scheme, "K": K, "N": N, "M": m}
                us_blas = median_us(lambda x=x, w=dense_w: F.linear(x, w))
                row["cublas_us"] = round(us_blas, 2)
                for name, (kern, state) in layers.items():
                    y = kern.apply(state, x)
                    row[f"{name}_err"] = round(float((y.float() - ref).norm() / ref.norm()), 6)
                    us = median_us(lambda k=kern, s=state, x=x: k.apply(s, x))
                    row[f"{name}_us"] = round(us, 2)
                    row[f"{name}_vs_cublas"] = round(us_blas / us, 3)
                    row[f"{name}_pct_copy"] = round(100 * nbytes / us / 1e6 / copy, 1)
                row["strategy"] = layers["lut4"][0].strategy(layers["lut4"][1], m)
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
            lin = layers = w = dense_w = canon = None  # free before the next shape
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
