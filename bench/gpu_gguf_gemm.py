"""The fused GGUF GEMM (``backends/triton/gguf_gemm.py``) beside dequant + cuBLAS (the path large
batches took before it) and cuBLAS bf16, on this GPU, with a sweep of its tiles.

    python3 bench/gpu_gguf_gemm.py --out FILE.json [--types q4_k,q6_k,q8_0] [--shapes ...] [--ms 16,64,256,1024]

Weights are random llama.cpp blocks (every code and scale byte random, finite fp16 block scales).
Each cell first checks every tile against the Triton dequantizer's weight in fp32 (relative
Frobenius error of the output), then times every candidate tile, the dequant + cuBLAS path of
``cuda.triton_gguf`` and ``F.linear`` on a dense bf16 weight (medians, L2 flushed,
``quantrt.bench.median_us``). ``best`` is the fastest tile per cell; ``--table FILE`` writes the
per-type tiles per M bucket and the largest batch where the GEMM still beats dequant + cuBLAS, as
``tunings/gguf_<arch>.json`` takes them. The JSON is rewritten after every cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

from quantrt.backends.triton import gguf_kernel as triton_gguf
from quantrt.backends.triton import tile_table
from quantrt.backends.triton.gguf import gguf_dequant, gguf_planes
from quantrt.backends.triton.gguf_gemm import gemm_candidates, gguf_gemm
from quantrt.bench import git_sha, median_us, random_weight, versions
from quantrt.env import Overrides
from quantrt.layers import QuantLinear


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def bucket(m: int) -> str:
    return next(k for b, k in zip(tile_table.BUCKETS, tile_table.KEYS) if m <= b)


def table_section(rows: list[dict], types: list[str]) -> dict:
    """Per type: the tile with the best geometric-mean time over shapes per M bucket, and the
    largest measured M at which the GEMM beat dequant + cuBLAS on every shape."""
    out: dict = {"gemm_types": {}, "gemm_max_m": {}}
    for t in types:
        mine = [r for r in rows if r["type"] == t]
        tiles: dict = {}
        for key in tile_table.KEYS:
            cells = [r for r in mine if bucket(r["M"]) == key]
            if not cells:
                continue
            names = set.intersection(*(set(r["tiles_us"]) for r in cells))
            score = {n: sum(torch.log(torch.tensor(r["tiles_us"][n])).item() for r in cells) for n in names}
            tiles[key] = json.loads(min(score, key=score.get))
        out["gemm_types"][t] = tiles
        wins = sorted({r["M"] for r in mine})
        best = 0
        for m in wins:
            if all(r["best_us"] < r["dense_us"] for r in mine if r["M"] == m):
                best = m
            else:
                break
        out["gemm_max_m"][t] = best
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--types", default="q4_k,q6_k,q8_0")
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672")
    ap.add_argument("--ms", default="16,64,256,1024")
    ap.add_argument("--table", default=None, help="write the tuning section here")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    types = args.types.split(",")
    doc = {
        "what": "fused GGUF GEMM tiles vs dequant+cuBLAS vs cuBLAS bf16 (bench/gpu_gguf_gemm.py)",
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(),
        "git": git_sha(),
        "versions": versions(),
        "command": "python3 bench/gpu_gguf_gemm.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "rows": [],
    }

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        if args.table:
            with open(args.table, "w") as f:
                json.dump(table_section(doc["rows"], types), f, indent=1)

    dt = torch.bfloat16
    for t in types:
        for K, N in shapes:
            canon = random_weight(f"gguf-{t}", N, K)
            planes = gguf_planes(canon["qweight"], t, N, K)
            dense = QuantLinear.from_canonical(
                canon, device="cuda", act_dtype=dt, overrides=Overrides(kernel="cuda.triton_gguf")
            )
            # the path the GEMM replaces: every batch past the GEMV on dequant + cuBLAS, whatever
            # the committed table gives the fused GEMM
            lay = dataclasses.replace(dense._state.layout, gemm_configs=(), gemm_max_m=0, gemv_max_m=0)
            dense._state = triton_gguf.build(dense._kernel, lay, dense.layer_spec())
            w = gguf_dequant(planes, t, N, K, dt, 0, N)
            dense_w = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
            for m in ms:
                x = torch.randn(m, K, device="cuda", dtype=dt)
                ref = x.float() @ w.float().T
                row = {"type": t, "K": K, "N": N, "M": m, "tiles_us": {}, "tiles_err": {}}
                row["cublas_us"] = round(median_us(lambda x=x, w=dense_w: F.linear(x, w)), 2)
                row["dense_strategy"] = dense._kernel.strategy(dense._state, m)
                row["dense_us"] = round(median_us(lambda f=dense, x=x: f(x)), 2)
                for c in gemm_candidates(t, m):
                    name = json.dumps(dataclasses.asdict(c), sort_keys=True)
                    try:
                        err = rel(gguf_gemm(x, planes, t, N, K, config=c), ref)
                    except Exception as e:  # a tile this GPU cannot hold (shared memory): recorded, skipped
                        row["tiles_err"][name] = f"{type(e).__name__}: {str(e)[:120]}"
                        continue
                    row["tiles_err"][name] = round(err, 6)
                    if err > 1e-2:
                        continue
                    run = lambda x=x, c=c, p=planes, t=t, N=N, K=K: gguf_gemm(x, p, t, N, K, config=c)  # noqa: E731
                    row["tiles_us"][name] = round(median_us(run), 2)
                if not row["tiles_us"]:
                    raise SystemExit(f"no tile ran correctly: {row['tiles_err']}")
                best = min(row["tiles_us"], key=row["tiles_us"].get)
                row["best"] = json.loads(best)
                row["best_us"] = row["tiles_us"][best]
                row["best_vs_cublas"] = round(row["cublas_us"] / row["best_us"], 3)
                row["dense_vs_cublas"] = round(row["cublas_us"] / row["dense_us"], 3)
                doc["rows"].append(row)
                print(
                    json.dumps({k: v for k, v in row.items() if k not in ("tiles_us", "tiles_err")}),
                    flush=True,
                )
                save()
            dense = planes = w = dense_w = canon = None  # free before the next shape
            torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
