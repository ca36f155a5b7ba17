"""Sweep the tensor-core W4A16/W8A16 kernel's launch shapes on this GPU (run on the GPU machine).

For each M bucket, times every launch geometry (mma.sync: swap, mt, nt, wn; wgmma on Hopper:
xr, wgn), ring depth, fold and warps per SM, and the dequant + cuBLAS path, on the benchmark's large shapes with
the L2 flushed, and writes the best per bucket (geometric mean over shapes) as
tunings/wna16_mma_<arch>.json (to --out). The committed file is what users get: nothing tunes
while they wait.

  python3 ci/tune_wna16_mma.py --out $OUT/wna16_mma_sm_90.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import triton.testing as tt

from quantrt.backends.cuda import mma_wna16 as mk
from quantrt.bench import random_weight
from quantrt.layers import QuantLinear

SHAPES = ((4096, 28672), (8192, 57344), (28672, 8192), (14336, 4096))
BUCKETS = (1, 8, 16, 32, 64, 128, 256)


def mma(swap: bool, mt: int, nt: int, wn: int) -> dict:
    return {"mt": mt, "nt": nt, "wn": wn, "swap": swap}


def wg(xr: int, wgn: int) -> dict:
    return {"wgmma": True, "xr": xr, "wgn": wgn}


# Launch geometries per bucket. mma.sync: swapped shapes cover the bucket's rows as n8 parts; wn
# warps side by side share x, so blocks of 8*nt*wn columns read it once. wgmma (sm_90a only): xr
# rows of x per block as the instruction's n, wgn warpgroups of 64 columns side by side. Past 64
# rows, swapped mma.sync shapes keep 64 rows per block (xr) and launch more row blocks.
GEOMETRY = {
    1: [mma(True, 1, nt, wn) for nt in (4, 8) for wn in (1, 2, 4)],
    8: [mma(True, 1, nt, wn) for nt in (4, 8) for wn in (1, 2, 4)],
    16: [mma(True, 1, nt, wn) for nt, wns in ((4, (1, 2, 4, 8)), (8, (1, 2, 4))) for wn in wns]
    + [wg(16, wgn) for wgn in (1, 2)],
    32: [mma(True, 1, 4, wn) for wn in (2, 4)] + [wg(32, wgn) for wgn in (1, 2)],
    64: [mma(True, 1, 2, wn) for wn in (4, 8)] + [wg(64, wgn) for wgn in (1, 2)],
    128: [wg(128, wgn) for wgn in (1, 2)] + [wg(64, 1)] + [mma(True, 1, 2, wn) | {"xr": 64} for wn in (4, 8)],
    256: [wg(256, 1), wg(128, 1), wg(128, 2)] + [mma(True, 1, 2, wn) | {"xr": 64} for wn in (4, 8)],
}
STAGES = dict.fromkeys(BUCKETS, (2, 3, 4))
FOLD = (True, False)  # mma.sync only; wgmma is unfolded
# K groups per block follow from this, per layer shape (mk.pick_warps)
WARPS_PER_SM = {
    1: (16, 32, 64, 128),
    8: (16, 32, 64, 128),
    16: (8, 16, 32, 64),
    32: (8, 16, 32),
    64: (8, 16, 32),
    128: (4, 8, 16),
    256: (4, 8, 16),
}


def candidates(bucket: int, hopper: bool, foldable: bool = True) -> list[dict]:
    """Launch rows for one bucket; ``foldable`` False (groups shorter than a chunk, fp4) sweeps
    the unfolded kernel alone."""
    rows = []
    for geo, stages, fold, wps in itertools.product(
        GEOMETRY[bucket], STAGES[bucket], FOLD if foldable else (False,), WARPS_PER_SM[bucket]
    ):
        if geo.get("wgmma"):
            if not hopper or fold:
                continue
        else:
            xr = geo.get("xr", bucket)  # a swapped shape's rows per block
            acc_tiles = geo["nt"] // 2 * -(-xr // 8) if geo["swap"] else geo["mt"] * geo["nt"]
            if fold and acc_tiles > 8:  # 4 fp32 per tile and lane; the fold keeps a second set
                continue
            if foldable and not fold and bucket <= 16:  # measured slower at every shape (earlier sweeps)
                continue
            geo = geo | {"fold": fold}
        rows.append({"max_m": bucket} | geo | {"stages": stages, "warps_per_sm": wps})
    return rows


def label(row: dict) -> str:
    return "/".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in row.items())


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
    hopper = torch.cuda.get_device_capability(dev) == (9, 0)
    times: dict[str, list[float]] = {}
    rows_of: dict[str, dict] = {}
    cublas: dict[tuple[int, int, int], float] = {}
    for K, N in shapes:
        canon = random_weight(args.scheme, N, K)
        layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
        lay = layer._state.layout
        dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        limit = mk.smem_limit(dev) - mk.BOOK_SMEM.get(lay.code, 0)  # as prepare(): the code book's copies
        szb = mk.sz_bytes(torch.bfloat16, lay.code)
        dequant_cublas = mk.dense_strategy(lay).fn
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for bucket in buckets:
            x = torch.randn(bucket, K, device="cuda", dtype=torch.bfloat16)
            cublas[(K, N, bucket)] = bench(lambda x=x, dense=dense: torch.nn.functional.linear(x, dense))
            cands = []
            ints = lay.code == lay.bits  # wgmma: integer codes only
            fold = mk.folds(lay.code, lay.bits)  # folding: integer and fp8 codes
            for row in candidates(bucket, hopper and ints, lay.gpc == 1 and fold):
                shape = mk.Shape.of(row, lay.bits, torch.bfloat16, lay.gpc, foldable=fold)
                wk = mk.pick_warps(shape, row, lay.n_pad, lay.chunks, sms, limit, lay.gpc, szb, lay.bits)
                if shape.smem(wk, lay.gpc, szb, lay.bits) <= limit and mk.params_fit(shape.nt, szb):
                    cands.append((row, shape, wk, mk.tile_expr(torch.bfloat16, lay.code, lay.gpc, shape)))
            for src, wgmma in ((mk.SOURCE, False), (mk.WG_SOURCE, True)):  # one NVRTC run per source
                exprs = [e for _, sh, _, e in cands if sh.wgmma == wgmma]
                if exprs:
                    mk.compile_all(src, exprs, dev)
            dense_row = {"max_m": bucket, "dense": True}  # dequant + cuBLAS: what M past the table runs
            key = label(dense_row)
            rows_of[key] = dense_row
            t = bench(lambda f=dequant_cublas, lay=lay, x=x: f(lay, x, None, None, None))
            times.setdefault(key, []).append(t)
            print(f"{K}x{N} M={bucket} {key}: {t * 1e3:.1f} us ({cublas[(K, N, bucket)] / t:.2f}x cuBLAS)")
            for row, shape, wk, expr in cands:
                if mk.function(mk.WG_SOURCE if shape.wgmma else mk.SOURCE, expr, dev).local_size_bytes:
                    continue  # spills: never a winner
                key = label(row)
                rows_of[key] = row
                tile = mk.make_tile(shape, torch.bfloat16, lay.code, lay.gpc, dev, wk)
                run = mk.tile_strategy(tile).fn  # this launch shape for every batch size
                t = bench(lambda run=run, lay=lay, x=x: run(lay, x, None, None, None))
                times.setdefault(key, []).append(t)
                print(
                    f"{K}x{N} M={bucket} {key} wk{tile.wk}: {t * 1e3:.1f} us "
                    f"({cublas[(K, N, bucket)] / t:.2f}x cuBLAS)",
                    flush=True,
                )
        del layer, dense, canon
        torch.cuda.empty_cache()
        write(args.out, args.scheme, args.shapes, dev, arch, times, rows_of, cublas, shapes.index((K, N)) + 1)


def write(
    out: str,
    scheme: str,
    shape_arg: str,
    dev: int,
    arch: str,
    times: dict,
    rows_of: dict,
    cublas: dict,
    done: int,
) -> None:
    """The table from the shapes swept so far (written after each shape: a cut-off run keeps them)."""
    rows = []
    for bucket in sorted({r["max_m"] for r in rows_of.values()}):
        cands = {k: v for k, v in times.items() if rows_of[k]["max_m"] == bucket and len(v) == done}
        if cands:
            best = min(cands, key=lambda k: math.exp(sum(math.log(t) for t in cands[k]) / len(cands[k])))
            rows.append(rows_of[best])
            if rows_of[best].get("dense"):
                break  # the rows end here: this M and every larger one run dequant + cuBLAS
    doc = {
        "_note": f"swept by ci/tune_wna16_mma.py on {torch.cuda.get_device_name(dev)} ({scheme}, shapes "
        f"{shape_arg}; best geometric mean per bucket); wn: warps side by side over N sharing x, "
        "wgmma: the warpgroup-MMA kernel (xr rows, wgn warpgroups of 64 columns), warps_per_sm: sets "
        "the K groups per block per layer, stages: copy ring depth, fold: zero/scale per group on the sums",
        "small_m": rows,
        "dense_workspace_mb": 256,
        "sweep_ms": {k: [round(t, 5) for t in v] for k, v in times.items()},
        "cublas_ms": {f"{k}x{n}/M{m}": round(t, 5) for (k, n, m), t in cublas.items()},
        "arch": arch,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
