"""Micro-benchmark of the native integer CPU kernels against dense bf16 and torch's packed ops.

Every method of one (shape, M) row runs in the same process, interleaved repeat by repeat so that
noise from other work on the machine hits them alike; the table shows medians in ms and the ratio
dense / method (above 1 is faster than dense bf16 ``F.linear``).

    python bench/cpu_wint.py [--threads 2] [--repeats 15] [--rounds 3] [--shapes 4096x4096,...] [--m 1,8,64]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from cpu_timing import time_row  # bench/ is on sys.path when a script here runs

from quantrt import reference
from quantrt.backends.cpu.torch_packed import CpuInt4Pack, CpuInt8Pack, CpuIntMM
from quantrt.backends.cpu.wint_native import NativeW8A8Int8, NativeWint
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

#: (label, scheme, kernel classes compared on it)
METHODS = (
    ("int4 g128 sym", "w4a16-int-g128-sym", (NativeWint, CpuInt4Pack)),
    ("int4 g128 asym", "w4a16-int-g128-asym", (NativeWint, CpuInt4Pack)),
    ("int8 ch", "w8a16-int-ch-sym", (NativeWint, CpuInt8Pack)),
    ("w8a8 int8", "w8a8-int-ch-sym", (NativeW8A8Int8, CpuIntMM)),
)


def prepared(kernel: type, weight: reference.CanonicalWeight, spec: LayerSpec) -> tuple[object, object]:
    k = kernel()
    return k, k.prepare(weight, spec)


def build_methods(K: int, N: int) -> dict[str, tuple[object, object]]:
    """Every method's prepared state for one weight shape (K = in_features, N = out_features)."""
    torch.manual_seed(0)
    w = torch.randn(N, K) * 0.02
    layers: dict[str, tuple[object, object]] = {"dense bf16": (None, w.to(torch.bfloat16))}
    for label, scheme, kernels in METHODS:
        canon = reference.quantize(w, scheme, calib=torch.randn(8, K))
        spec = LayerSpec(parse_scheme(scheme), K, N, act_dtype=torch.bfloat16)
        for kernel in kernels:
            layers[f"{label} {kernel.name}"] = prepared(kernel, canon, spec)
    return layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=1, help="sweeps over every row; the median over them")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096", help="KxN list")
    ap.add_argument("--m", default="1,8,64")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ms = [int(m) for m in args.m.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    layers = {shape: build_methods(*shape) for shape in shapes}
    samples: dict[tuple[int, int, int], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for K, N in shapes:
            for M in ms:
                samples.setdefault((K, N, M), []).append(time_row(layers[(K, N)], K, M, args.repeats))
    rows = []
    for (K, N, M), runs in samples.items():
        times = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
        for name, t in times.items():
            r = {"K": K, "N": N, "M": M, "method": name, "ms": t, "vs_dense": times["dense bf16"] / t}
            rows.append(r)
            print(f"{K:>6}x{N:<6} M={M:<3} {name:<40} {t:8.3f} ms  x{r['vs_dense']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
