"""Sweep the tensor-core W4A16/W8A16 kernel's launch shapes on this GPU (run on the GPU machine).

For each M bucket, times every launch geometry (swap, mt, nt, wn), ring depth, fold and
warps per SM on the benchmark's large shapes with
the L2 flushed, and writes the best per bucket (geometric mean over shapes) as
tunings/wna16_mma_<arch>.json (to --out). The committed file is what users get: nothing tunes
while they wait.

  python3 ci/tune_wna16_mma.py --out $OUT/wna16_mma_sm_90.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math

import torch
import triton.testing as tt

from quantrt.backends.cuda import mma_wna16 as mk
from quantrt.layers import QuantLinear
from quantrt.reference import quantize

SHAPES = ((4096, 28672), (8192, 57344), (28672, 8192), (14336, 4096))
BUCKETS = (1, 8, 16, 32, 64)
# (swap, mt, nt, wn) per bucket: swapped shapes cover the bucket's rows as n8 parts; wn warps side
# by side share x, so blocks of 8*nt*wn columns read it once.
GEOMETRY = {
    1: [(True, 1, nt, wn) for nt in (4, 8) for wn in (1, 2, 4)],
    8: [(True, 1, nt, wn) for nt in (4, 8) for wn in (1, 2, 4)],
    16: [(True, 1, nt, wn) for nt, wns in ((4, (1, 2, 4, 8)), (8, (1, 2, 4))) for wn in wns],
    32: [(True, 1, 4, wn) for wn in (2, 4, 8)]
    + [(True, 1, 8, wn) for wn in (1, 2, 4)]
    + [(False, 2, nt, wn) for nt in (2, 4) for wn in (2, 4, 8)],
    64: [(True, 1, nt, wn) for nt in (2, 4) for wn in (2, 4, 8)]
    + [(False, mt, nt, wn) for mt, nt in ((4, 2), (4, 4), (2, 4)) for wn in (2, 4, 8)],
}
STAGES = {1: (2, 3, 4), 8: (2, 3, 4), 16: (2, 3, 4), 32: (2, 3), 64: (2, 3)}
FOLD = {1: (True,), 8: (True,), 16: (True,), 32: (True, False), 64: (True, False)}
# K groups per block follow from this, per layer shape (mk.pick_warps)
WARPS_PER_SM = {
    1: (16, 32, 64, 128),
    8: (16, 32, 64, 128),
    16: (8, 16, 32, 64),
    32: (8, 16, 32),
    64: (8, 16, 32),
}


def bench(fn) -> float:
    return float(tt.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scheme", default="w4a16-int-g128-asym")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--buckets", default=",".join(map(str, BUCKETS)))
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    buckets = tuple(int(v) for v in args.buckets.split(","))
    dev = torch.cuda.current_device()
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(dev))
    times: dict[tuple[int, ...], list[float]] = {}
    cublas: dict[tuple[int, int, int], float] = {}
    for K, N in shapes:
        canon = quantize(torch.randn(N, K, device="cuda") * 0.02, args.scheme)
        layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
        state = layer._state
        dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        limit = mk.smem_limit(dev)
        szb = mk.sz_bytes(torch.bfloat16, state.bits)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for bucket in buckets:
            x = torch.randn(bucket, K, device="cuda", dtype=torch.bfloat16)
            cublas[(K, N, bucket)] = bench(lambda x=x, dense=dense: torch.nn.functional.linear(x, dense))
            cands = []
            for (swap, mt, nt, wn), stages, fold, wps in itertools.product(
                GEOMETRY[bucket], STAGES[bucket], FOLD[bucket], WARPS_PER_SM[bucket]
            ):
                acc_tiles = nt // 2 * -(-bucket // 8) if swap else mt * nt  # 4 fp32 each per lane
                if fold and acc_tiles > 8:  # the fold keeps a second set for the chunk's sums
                    continue
                row = {"max_m": bucket, "mt": mt, "nt": nt, "wn": wn, "swap": swap}
                row |= {"stages": stages, "fold": fold, "warps_per_sm": wps}
                shape = mk.Shape.of(row, state.bits, torch.bfloat16, state.gpc)
                wk = mk.pick_warps(
                    shape, row, state.n_pad, state.chunks, sms, limit, state.gpc, szb, state.bits
                )
                if shape.smem(wk, state.gpc, szb, state.bits) <= limit:
                    cands.append((row, shape, wk))
            exprs = [mk.tile_expr(torch.bfloat16, state.bits, state.gpc, shape) for _, shape, _ in cands]
            mk.compile_all(mk.SOURCE, exprs, dev)  # one NVRTC run per bucket
            for (row, shape, wk), expr in zip(cands, exprs, strict=True):
                if mk.function(mk.SOURCE, expr, dev).local_size_bytes:  # spills: never a winner
                    continue
                swap, mt, nt, wn, stages, fold, wps = (
                    row[k] for k in ("swap", "mt", "nt", "wn", "stages", "fold", "warps_per_sm")
                )
                key = (bucket, mt, nt, wn, int(swap), stages, int(fold), wps)
                tile = mk.make_tile(shape, torch.bfloat16, state.bits, state.gpc, dev, wk)
                st = dataclasses.replace(state, tiles=(dataclasses.replace(tile, max_m=1 << 30),))
                t = bench(lambda st=st, x=x: mk.run(st, x, None, None))
                times.setdefault(key, []).append(t)
                print(
                    f"{K}x{N} M={bucket} {'swap' if swap else f'mt{mt}'} nt{nt} wn{wn} wk{tile.wk} st{stages} "
                    f"fold{int(fold)} wps{wps}: {t * 1e3:.1f} us ({cublas[(K, N, bucket)] / t:.2f}x cuBLAS)",
                    flush=True,
                )
        del layer, dense, canon
        torch.cuda.empty_cache()
        write(args.out, args.scheme, args.shapes, dev, arch, times, cublas, shapes.index((K, N)) + 1)


def write(
    out: str, scheme: str, shape_arg: str, dev: int, arch: str, times: dict, cublas: dict, done: int
) -> None:
    """The table from the shapes swept so far (written after each shape: a cut-off run keeps them)."""
    rows = []
    for bucket in sorted({k[0] for k in times}):
        cands = {k: v for k, v in times.items() if k[0] == bucket and len(v) == done}
        if not cands:
            continue
        best = min(cands, key=lambda k: math.exp(sum(math.log(t) for t in cands[k]) / len(cands[k])))
        _, mt, nt, wn, swap, stages, fold, wps = best
        rows.append(
            {"max_m": bucket, "mt": mt, "nt": nt, "wn": wn, "swap": bool(swap), "stages": stages}
            | {"fold": bool(fold), "warps_per_sm": wps}
        )
    doc = {
        "_note": f"swept by ci/tune_wna16_mma.py on {torch.cuda.get_device_name(dev)} ({scheme}, shapes "
        f"{shape_arg}; best geometric mean per bucket); wn: warps side by side over N sharing x, "
        "warps_per_sm: sets the K groups per block per layer, stages: copy ring depth, fold: zero/scale "
        "per group on the sums",
        "small_m": rows,
        "dense_workspace_mb": 256,
        "sweep_ms": {
            "{}/mt{}/nt{}/wn{}/swap{}/st{}/fold{}/wps{}".format(*k): [round(t, 5) for t in v]
            for k, v in times.items()
        },
        "cublas_ms": {f"{k}x{n}/M{m}": round(t, 5) for (k, n, m), t in cublas.items()},
        "arch": arch,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
