"""Sweep the tensor-core W4A16/W8A16 kernel's launch shapes on this GPU (run on the GPU machine).

For each M bucket, times every (mt, nt, warps per block) on the benchmark's large shapes with
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
BUCKETS = {1: (1,), 8: (8,), 16: (16,), 32: (32,), 64: (64,)}
MT = {1: (1,), 8: (1,), 16: (1,), 32: (1, 2), 64: (1, 2, 4)}
NT = {1: (2, 4, 8), 8: (2, 4, 8), 16: (2, 4, 8), 32: (2, 4, 8), 64: (2, 4, 8)}
WK = (4, 8, 16)
STAGES = {1: (2, 3, 4), 8: (2, 3, 4), 16: (2, 3, 4), 32: (2, 3), 64: (2, 3)}
FOLD = {1: (True,), 8: (True,), 16: (True, False), 32: (True, False), 64: (True, False)}


def bench(fn) -> float:
    return float(tt.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scheme", default="w4a16-int-g128-asym")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
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
        for bucket, ms in BUCKETS.items():
            for m in ms:
                x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
                cublas[(K, N, m)] = bench(lambda x=x, dense=dense: torch.nn.functional.linear(x, dense))
                for mt, nt, wk, stages, fold in itertools.product(
                    MT[bucket], NT[bucket], WK, STAGES[bucket], FOLD[bucket]
                ):
                    if mt * nt > 16:  # past this the accumulators spill
                        continue
                    row = {"max_m": bucket, "mt": mt, "nt": nt, "stages": stages, "fold": fold}
                    shape = mk.Shape.of(row, state.bits, torch.bfloat16, state.gpc)
                    if shape.smem(wk, state.gpc, 4, state.bits) > limit or wk > state.chunks:
                        continue
                    try:
                        tile = mk.make_tile(shape, torch.bfloat16, state.bits, state.gpc, dev, wk)
                    except Exception as exc:
                        print(f"{row}: {exc}", flush=True)
                        continue
                    if tile.wk != wk:
                        continue
                    st = dataclasses.replace(state, tiles=(dataclasses.replace(tile, max_m=1 << 30),))
                    t = bench(lambda st=st, x=x: mk.run(st, x, None, None))
                    times.setdefault((bucket, mt, nt, wk, stages, fold), []).append(t)
                    print(
                        f"{K}x{N} M={m} mt{mt} nt{nt} wk{wk} st{stages} fold{int(fold)}: {t * 1e3:.1f} us "
                        f"({cublas[(K, N, m)] / t:.2f}x cuBLAS)",
                        flush=True,
                    )
        del layer, dense, canon
        torch.cuda.empty_cache()
    rows = []
    for bucket in BUCKETS:
        cands = {k: v for k, v in times.items() if k[0] == bucket and len(v) == len(shapes)}
        best = min(cands, key=lambda k: math.exp(sum(math.log(t) for t in cands[k]) / len(cands[k])))
        _, mt, nt, wk, stages, fold = best
        rows.append({"max_m": bucket, "mt": mt, "nt": nt, "wk": wk, "stages": stages, "fold": fold})
    doc = {
        "_note": f"swept by ci/tune_wna16_mma.py on {torch.cuda.get_device_name(dev)} ({args.scheme}, shapes "
        f"{args.shapes}); wk: warps per block, stages: copy ring depth, fold: zero/scale per group on the sums",
        "small_m": rows,
        "dense_workspace_mb": 256,
        "sweep_ms": {
            f"{k[0]}/mt{k[1]}/nt{k[2]}/wk{k[3]}/st{k[4]}/fold{int(k[5])}": [round(t, 5) for t in v]
            for k, v in times.items()
        },
        "cublas_ms": {f"{k}x{n}/M{m}": round(t, 5) for (k, n, m), t in cublas.items()},
        "arch": arch,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
