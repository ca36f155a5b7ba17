"""Sweep the one-launch W8A8 GEMV (backends/triton/w8a8_gemv.py) on this GPU against the committed
small-batch path, and write the ``gemv`` row each W8A8 section of tunings/w8a8_<arch>.json should
take (run on the GPU machine).

    python3 ci/tune_w8a8_gemv.py --out $OUT/w8a8-gemv.json [--table backends/cuda/tunings/w8a8_sm_90.json]

Per section (fp8_rowwise: w8a8-fp8-ch; int8: w8a8-int-ch-sym) and batch size M (1, 2, 4), times
whole prepared-layer calls, activation quantization included, eager with the L2 flushed (medians,
``quantrt.bench.median_us``): the layer as the committed table prepares it (the baseline: the
quantization launch, then the split-K GEMM) and the GEMV in every candidate configuration, on the
benchmark's large shapes and a 4096x4096 layer (where host time shows). A section takes the
configuration with the best geometric mean over shapes and M up to the largest M at which it beats
the baseline's geometric mean; none where it does not win at M=1. With --table the rows are merged
into that file (commit it only with the run's JSON under bench/results). The baseline is the table
as installed: run it where the section has no ``gemv`` row yet.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import CudaTritonFp8, CudaTritonInt8
from quantrt.backends.triton.tile_table import GemvConfig
from quantrt.backends.triton.w8a8_kernel import with_gemv
from quantrt.bench import median_us
from quantrt.plans import layer_spec

SHAPES = ((8192, 57344), (28672, 8192), (4096, 28672), (4096, 4096))
MS = (1, 2, 4)
SECTIONS = {"fp8_rowwise": (CudaTritonFp8, "w8a8-fp8-ch"), "int8": (CudaTritonInt8, "w8a8-int-ch-sym")}


def candidates() -> list[dict[str, int]]:
    """Columns and inputs per step, warps, load stages, with 16 or 32 weight codes per thread and
    step (more holds too many registers: tests/triton/test_w8a8_gemv_compiles.py): 30
    configurations, each compiled once per power-of-two batch (about a second each). Three stages
    first, so a run cut short by --seconds has tried every tile shape."""
    grid = itertools.product((4, 8, 16, 32, 64), (128, 256, 512, 1024), (4, 8), (2, 3))
    out = [
        {"block_n": bn, "block_k": bk, "num_warps": w, "num_stages": s}
        for bn, bk, w, s in grid
        if bn * bk // (32 * w) in (16, 32)
    ]
    return sorted(out, key=lambda c: c["num_stages"] != 3)


def label(c: dict[str, int]) -> str:
    return "BN{block_n} BK{block_k} W{num_warps} S{num_stages}".format(**c)


def make_of(kernel):  # type: ignore[no-untyped-def]
    """The GEMV strategy builder of a section's kernel."""
    from quantrt.backends.triton import w8a8_ops

    return w8a8_ops.int8_gemv if kernel is CudaTritonInt8 else w8a8_ops.fp8_gemv


def geomean(v: list[float]) -> float:
    return math.exp(sum(math.log(t) for t in v) / len(v))


def time_section(kernel, scheme: str, cands: list[dict[str, int]], deadline: float) -> dict:  # type: ignore[no-untyped-def]
    """label ("base": the committed path) -> "KxN/M" -> us. Every layer is prepared first, then
    each configuration is timed on all of them (a run cut short keeps whole configurations)."""
    layers = []
    for K, N in SHAPES:
        canon = reference.quantize(torch.randn(N, K) * 0.05, scheme).to("cuda")
        k = kernel()
        state = k.prepare(canon, layer_spec(scheme, K, N, act_dtype=torch.bfloat16))
        xs = {m: torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m in MS}
        layers.append((f"{K}x{N}", k, state, xs))
    out = {
        "base": {
            f"{s}/{m}": median_us(lambda x=xs[m], k=k, st=st: k.apply(st, x))
            for s, k, st, xs in layers
            for m in MS
        }
    }
    for c in cands:
        if time.monotonic() > deadline:
            break
        t = {}
        for s, _, st, xs in layers:
            fn = with_gemv([], GemvConfig(max_m=MS[-1], **c), make_of(kernel), st.layout)[0].fn
            for m in MS:
                t[f"{s}/{m}"] = median_us(lambda x=xs[m], fn=fn, lay=st.layout: fn(lay, x, None, None, None))
        out[label(c)] = t
        print(f"{kernel.__name__} {label(c)}: " + " ".join(f"{v:.1f}" for v in t.values()), flush=True)
    return out


def ratio(t: dict[str, float], base: dict[str, float], m: int) -> float:
    """Geometric mean over the shapes of the GEMV's time over the baseline's, at batch m."""
    return geomean([t[f"{k}x{n}/{m}"] / base[f"{k}x{n}/{m}"] for k, n in SHAPES])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--table", help="merge the chosen rows into this tuning table")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument(
        "--seconds",
        type=float,
        default=math.inf,
        help="sweep for at most this long (split over the sections)",
    )
    args = ap.parse_args()
    sections = args.sections.split(",")
    cands = candidates()
    result: dict = {
        "device": torch.cuda.get_device_name(),
        "shapes": [f"{k}x{n}" for k, n in SHAPES],
        "ms": MS,
    }
    chosen: dict[str, dict] = {}
    for section in sections:
        kernel, scheme = SECTIONS[section]
        deadline = time.monotonic() + args.seconds / len(sections)  # each section its share
        times = time_section(kernel, scheme, cands, deadline)
        torch.cuda.empty_cache()
        full = dict(times)
        base = full.pop("base")
        result[section] = {"times_us": times, "chosen": None}
        best = min(full, key=lambda lab: ratio(full[lab], base, 1), default=None)  # decode first
        if best is not None and ratio(full[best], base, 1) < 1:
            top = max(m for m in MS if all(ratio(full[best], base, j) < 1 for j in MS if j <= m))
            c = next(c for c in cands if label(c) == best)
            chosen[section] = {"max_m": top, **c}
            result[section]["chosen"] = {
                **chosen[section],
                "ratio_to_base": {m: round(ratio(full[best], base, m), 4) for m in MS},
            }
        print(f"{section}: {result[section]['chosen']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.table:
        table = json.loads(Path(args.table).read_text())
        for section, row in chosen.items():
            table[section]["gemv"] = row
        Path(args.table).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
