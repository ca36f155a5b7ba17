"""Sweep the launch shapes of the Triton 4-bit code-book kernels (NVFP4/MXFP4/NF4) and the GGUF
GEMV on this GPU (run on the GPU machine) and write tunings/lut4_<arch>.json and gguf_<arch>.json.

    python3 ci/tune_lut_gguf.py --out-dir $OUT [--seconds 240] [--shapes 8192x57344,...]

Each candidate runs through the layer's own call path (``QuantLinear.__call__`` with the state's
configurations replaced), so what is timed is what users get; medians with the L2 flushed,
geometric mean over the shapes. lut4: GEMV shapes for M=1, tiles for M=16 and 64, and the batch
size from which dequant + cuBLAS wins (``dense_from_m``). GGUF: GEMV shapes per batch bound for
q4_k, q6_k and q8_0 (the other types use the q4_k row), and ``gemv_max_m``. Triton compiles each
new configuration once (about a second): ``--seconds`` stops the sweep and keeps what was found.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from quantrt import reference
from quantrt.backends.triton import tile_table
from quantrt.bench import median_us
from quantrt.env import Overrides
from quantrt.layers import QuantLinear

SHAPES = ((8192, 57344), (28672, 8192), (4096, 28672))
TUNINGS = Path(__file__).resolve().parents[1] / "backends" / "cuda" / "tunings"
START = time.monotonic()


def geomean(v: list[float]) -> float:
    return math.exp(sum(math.log(t) for t in v) / len(v))


def layers(
    scheme: str, shapes: list[tuple[int, int]], kernel: str | None = None
) -> list[tuple[QuantLinear, int]]:
    """A layer per shape, dispatched (or of ``kernel`` by name)."""
    ov = Overrides(kernel=kernel) if kernel else None
    out = []
    for K, N in shapes:
        w = torch.randn(N, K, device="cuda") * 0.02
        canon = reference.quantize(w, scheme)
        del w
        out.append(
            (QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16, overrides=ov), K)
        )
        del canon
    return out


def timed(built: list[tuple[QuantLinear, int]], m: int, patch: dict[str, Any], module: Any = None) -> float:
    """Geometric-mean microseconds of the layers at batch m, each rebuilt over its layout with
    ``patch`` applied (launch shapes, bounds) by ``module.build`` (the lut4 kernels' by default;
    ``triton_gguf`` for the GGUF ones)."""
    from quantrt.backends.triton import lut4_kernel as triton_lut4

    module = module or triton_lut4
    times = []
    for layer, K in built:
        saved = layer._state
        layout = dataclasses.replace(saved.layout, **patch)
        layer._state = module.build(layer._kernel, layout, layer.layer_spec())
        try:
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            times.append(median_us(lambda layer=layer, x=x: layer(x)))
        finally:
            layer._state = saved
    return geomean(times)


def lut4_candidates(m: int) -> list[dict[str, int]]:
    out = []
    if m == 1:
        for bn, bk, warps, target in itertools.product(
            (8, 16, 32), (256, 512, 1024), (4, 8), (264, 528, 1056)
        ):
            if bn * bk <= 16384:
                out.append({"block_m": 1, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": 3,
                            "split_k_target": target})  # fmt: skip
    else:
        bms = (16,) if m <= 16 else (16, 32, 64)
        for bm, bn, bk, warps, stages in itertools.product(
            bms, (32, 64, 128), (64, 128, 256), (4, 8), (3, 4)
        ):
            if bm * bn * bk > 64 * 128 * 128 or (bm * bn <= 16 * 64 and warps == 8):
                continue
            out.append({"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages,
                        "split_k_target": 264})  # fmt: skip
    return out


def tune_lut4(shapes: list[tuple[int, int]], budget: float, log: Any) -> dict[str, Any]:
    from quantrt.backends.triton.common import TileConfig

    doc = tile_table.load("quantrt.backends.cuda", "lut4", "default")
    table = {k: dict(v) for k, v in doc["lut4"].items()}
    sweep: dict[str, Any] = {}
    # by name: dispatch gives these schemes to the tensor-core kernels where CuPy is importable
    built = {
        s: layers(s, shapes, k)
        for s, k in (("w4a16-nvfp4", "cuda.triton_fp4"), ("w4a16-nf4-g64", "cuda.triton_bnb4"))
    }
    for i, (key, m) in enumerate((("1", 1), ("16", 16), ("64", 64))):
        best, best_t = table[key], math.inf
        cands = lut4_candidates(m)
        random.Random(0).shuffle(cands)  # an even sample of the space when the budget stops the sweep
        for c in [table[key], *cands]:
            if time.monotonic() - START > budget * (i + 1) / 3:
                log(f"lut4 {key}: budget spent")
                break
            try:
                ts = []
                for layer_set in built.values():
                    configs = tuple(tile_table.tile_configs({k: c for k in tile_table.KEYS}, lay._state.N,
                                                            lay._state.K, TileConfig) for lay, _ in layer_set)  # fmt: skip
                    per = []
                    for (lay, K), cfg in zip(layer_set, configs):
                        per.append(timed([(lay, K)], m, {"configs": cfg, "dense_from": 1 << 30}))
                    ts.append(geomean(per))
                t = geomean(ts)
            except Exception as e:  # a tile that does not compile or fit is skipped, not fatal
                log(f"lut4 {key} {c}: {type(e).__name__}: {e}")
                continue
            log(f"lut4 {key} {c}: {t:.1f} us")
            if t < best_t:
                best, best_t = c, t
        table[key] = best
        sweep[f"_{key}_us"] = round(best_t, 2)
        if key != "1":
            dense = geomean([timed(ls, m, {"dense_from": 1}) for ls in built.values()])
            sweep[f"_{key}_dense_us"] = round(dense, 2)
            log(f"lut4 {key}: dequant+cuBLAS {dense:.1f} us")
    dense_from = 65
    if sweep.get("_16_dense_us", math.inf) < sweep.get("_16_us", math.inf):
        dense_from = 2
    elif sweep.get("_64_dense_us", math.inf) < sweep.get("_64_us", math.inf):
        dense_from = 17
    return {**doc, "lut4": table, "dense_from_m": dense_from, **sweep}


def gguf_candidates(m: int) -> list[dict[str, int]]:
    out = []
    for bn, split, warps in itertools.product((4, 8, 16, 32), (1, 2, 4, 8), (2, 4, 8)):
        if bn >= 32 and warps == 2:
            continue
        out.append({"block_m": m, "block_n": bn, "split_k": split, "num_warps": warps, "num_stages": 3})
    return out


def tune_gguf(shapes: list[tuple[int, int]], budget: float, log: Any) -> dict[str, Any]:
    from quantrt.backends.triton import gguf_kernel as triton_gguf
    from quantrt.backends.triton.gguf import GGUFConfig

    doc = tile_table.load("quantrt.backends.cuda", "gguf", "default")
    types: dict[str, Any] = dict(doc.get("types", {}))
    times: dict[str, Any] = {}
    for ti, t in enumerate(("q4_k", "q6_k", "q8_0")):
        # by name: dispatch gives q4_k and q8_0 to the tensor-core kernels
        built = layers(f"gguf-{t}", shapes, kernel="cuda.triton_gguf")
        rows: dict[str, Any] = {}
        for j, bound in enumerate(("1", "4")):
            m = int(bound)
            best, best_t = None, math.inf
            cands = gguf_candidates(m)
            random.Random(0).shuffle(cands)
            for c in [doc["gemv"][bound], *cands]:
                if time.monotonic() - START > budget * (2 * ti + j + 1) / 6:
                    log(f"gguf {t} {bound}: budget spent")
                    break
                try:
                    patch = {"configs": ((1 << 30, GGUFConfig(**c)),), "gemv_max_m": 1 << 30}
                    t_us = timed(built, m, patch, triton_gguf)
                except Exception as e:  # a shape that does not compile is skipped, not fatal
                    log(f"gguf {t} {c}: {type(e).__name__}: {e}")
                    continue
                log(f"gguf {t} M={m} {c}: {t_us:.1f} us")
                if t_us < best_t:
                    best, best_t = c, t_us
            if best is not None:
                rows[bound] = best
                times[f"{t}_{bound}"] = round(best_t, 2)
        if rows:
            types[t] = {**{k: v for k, v in doc["gemv"].items() if k not in rows}, **rows}
        del built
        torch.cuda.empty_cache()
    return {**doc, "types": types, "_sweep_us": times}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seconds", type=float, default=240.0, help="stop sweeping after this long (each part)")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--parts", default="lut4,gguf")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    name = torch.cuda.get_device_name()
    date = time.strftime("%Y-%m-%d")

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - START:7.1f}s] {msg}", flush=True)

    global START
    for part in args.parts.split(","):
        START = time.monotonic()
        doc = tune_lut4(shapes, args.seconds, log) if part == "lut4" else tune_gguf(shapes, args.seconds, log)
        doc["_note"] = (
            f"swept by ci/tune_lut_gguf.py on {name} ({arch}) on {date}, shapes {args.shapes}, bf16 activations, "
            f"{args.seconds:.0f} s budget; " + doc["_note"]
        )
        path = Path(args.out_dir) / f"{part}_{arch}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
