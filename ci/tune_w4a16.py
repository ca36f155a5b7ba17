"""Sweep cuda.triton_w4a16 tile configurations per M bucket on this GPU and write the winners.

    python ci/tune_w4a16.py OUT.json [--bits 4]

Run on the target GPU (ci/gpu.sh does); commit the result as
backends/cuda/tunings/w4a16_<arch>.json. Medians with the L2 flushed, over the large shapes
of the benchmark; a config's score is its geometric-mean time across those shapes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys

import torch

from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.tile_table import KEYS, tile_configs
from quantrt.backends.triton.w4a16 import w4a16_matmul
from quantrt.bench import median_us
from quantrt.reference import quantize

SHAPES = ((4096, 4096), (8192, 57344), (28672, 8192))
BUCKETS = {"1": 1, "16": 16, "64": 64, "256": 256, "large": 4096}


def candidates(m: int) -> list[dict[str, int]]:
    out = []
    bms = (16,) if m <= 16 else ((16, 32, 64) if m <= 64 else (64, 128))
    for bm, bn, bk, warps, stages in itertools.product(bms, (32, 64, 128), (64, 128), (4, 8), (2, 3, 4)):
        if bm * bn > 128 * 128:
            continue
        split = (132, 264, 528, 1056) if m <= 256 else (0,)
        for s in split:
            c = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
            if s:
                c["split_k_target"] = s
            out.append(c)
    return out


def concrete(c: dict[str, int], N: int, K: int) -> TileConfig:
    """The table row as prepare resolves it for this layer (split K from split_k_target)."""
    return tile_configs(dict.fromkeys(KEYS, c), N, K, TileConfig, block=(None, 128))[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--budget", type=int, default=60, help="configs tried per bucket (random subset)")
    args = ap.parse_args()
    dev = "cuda"
    layers = []
    for K, N in SHAPES:
        c = quantize(torch.randn(N, K, device=dev) * 0.02, f"w{args.bits}a16-int-g128-asym")
        layers.append((K, N, c["qweight"], c["scales"].bfloat16(), c["zeros"].bfloat16()))
    gen = torch.Generator().manual_seed(0)
    result: dict[str, object] = {"_note": f"swept by ci/tune_w4a16.py on {torch.cuda.get_device_name()}"}
    for key, m in BUCKETS.items():
        cands = candidates(m)
        pick = torch.randperm(len(cands), generator=gen)[: args.budget].tolist()
        best = (math.inf, None)
        for i in pick:
            cfg = cands[i]
            logs = []
            try:
                for K, N, q, s, z in layers:
                    x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
                    tc = concrete(cfg, N, K)
                    logs.append(
                        math.log(
                            median_us(
                                lambda x=x, q=q, s=s, z=z, tc=tc: w4a16_matmul(
                                    x, q, s, z, None, 128, None, tc, bits=args.bits
                                )
                            )
                        )
                    )
            except Exception as e:  # a config the compiler rejects (shared memory, registers)
                print(f"{key} {cfg}: {type(e).__name__}", file=sys.stderr)
                continue
            score = math.exp(sum(logs) / len(logs))
            if score < best[0]:
                best = (score, cfg)
                print(f"{key}: {score:.1f} us {cfg}", file=sys.stderr, flush=True)
        result[key] = best[1]
        result[f"_{key}_us"] = round(best[0], 2)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
