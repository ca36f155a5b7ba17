"""Sweep the launch shapes of the CUDA GGUF GEMV (backends/cuda/gguf_gemv.py) on this GPU (run on
the GPU machine) and write tunings/gguf_gemv_<arch>.json.

    python3 ci/tune_gguf_gemv.py --out $OUT/gguf_gemv_sm_90.json [--shapes 8192x57344,...] [--ms 1,2,4]

For q4_k and q6_k and each batch size, every candidate (weight rows and x rows per block, warps
splitting K) runs through the layer's own call path (``QuantLinear.__call__``, the layer rebuilt
on its layout with the shapes replaced); medians with the L2 flushed, geometric mean over the
shapes. The CUDA bound is the largest swept M (in order) where the best shape beats the Triton GEMV
the layer falls back to. Each type's instances compile in one NVRTC run. The layers are
``cuda.gemv_gguf``'s by name (dispatch gives q4_k to the tensor-core kernel).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantrt import reference
from quantrt.backends.cuda import gguf_gemv
from quantrt.backends.cuda.cupy_kernels import Launch, compile_all, function
from quantrt.backends.triton import tile_table
from quantrt.bench import median_us
from quantrt.env import Overrides
from quantrt.layers import QuantLinear

SHAPES = "8192x57344,28672x8192,4096x28672"
TYPES = tuple(gguf_gemv.TYPE_ID)


def geomean(v: list[float]) -> float:
    return math.exp(sum(math.log(t) for t in v) / len(v))


def timed(built: list[tuple[QuantLinear, int]], m: int, patch: Callable[[int], dict[str, Any]]) -> float:
    """Geometric-mean microseconds of the layers at batch m, each rebuilt for the run on its layout
    with the fields ``patch(K)`` replaced."""
    times = []
    for layer, K in built:
        saved = layer._state
        lay = dataclasses.replace(saved.layout, **patch(K))
        layer._state = gguf_gemv.build(layer._kernel, lay, layer.layer_spec())
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        try:
            times.append(median_us(lambda layer=layer, x=x: layer(x)))
        finally:
            layer._state = saved
    return geomean(times)


def candidates(m: int) -> list[gguf_gemv.GemvShape]:
    out = []
    xms = (1,) if m == 1 else (1, 2) if m == 2 else (2, 4)
    for xm, rows, warps in itertools.product(xms, (1, 2, 4, 8), (1, 2, 4, 8)):
        if xm * rows <= 16 and not (m > 1 and warps == 1):
            out.append(gguf_gemv.GemvShape(m, rows, xm, warps))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--ms", default="1,2,4")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    dev = torch.cuda.current_device()
    start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", flush=True)

    doc = tile_table.load("quantrt.backends.cuda", "gguf_gemv", "default")
    types: dict[str, Any] = {}
    sweep: dict[str, Any] = {}
    for t in TYPES:
        built = []
        for K, N in shapes:
            canon = reference.quantize(torch.randn(N, K, device="cuda") * 0.02, f"gguf-{t}")
            layer = QuantLinear.from_canonical(
                canon, device="cuda", act_dtype=torch.bfloat16, overrides=Overrides(kernel="cuda.gemv_gguf")
            )
            assert layer.kernel_name == "cuda.gemv_gguf", layer.selection.explain()
            built.append((layer, K))
            del canon
        cands = {m: candidates(m) for m in ms}
        compile_all(
            gguf_gemv.SOURCE, sorted({c.expr(torch.bfloat16, t) for cs in cands.values() for c in cs}), dev
        )
        rows: dict[str, Any] = {}
        step = gguf_gemv.STEP_WEIGHTS[t]
        for m in ms:
            best, best_t = None, math.inf
            for c in cands[m]:
                fn = Launch(function(gguf_gemv.SOURCE, c.expr(torch.bfloat16, t), dev), gguf_gemv.ARGS)

                def patch(
                    K: int, c: gguf_gemv.GemvShape = c, fn: Launch = fn, step: int = step
                ) -> dict[str, Any]:
                    shape = dataclasses.replace(c, warps=min(c.warps, -(-K // step)))
                    return {"shapes": (shape,), "launches": (fn,)}

                us = timed(built, m, patch)
                log(f"{t} M={m} rows={c.rows} xm={c.xm} warps={c.warps}: {us:.1f} us")
                if us < best_t:
                    best, best_t = c, us
            # the layer with no CUDA bound: its Triton GEMV
            triton_us = timed(built, m, lambda K: {"shapes": (), "launches": ()})
            log(f"{t} M={m}: best {best} {best_t:.1f} us, Triton GEMV {triton_us:.1f} us")
            sweep[f"{t}_{m}"] = {"cuda_us": round(best_t, 2), "triton_us": round(triton_us, 2)}
            if best is None or best_t >= triton_us:
                break  # the Triton GEMV from here on
            rows[str(m)] = {"rows": best.rows, "xm": best.xm, "warps": best.warps}
        if rows:
            types[t] = rows
        del built
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    out = {
        **doc,
        "types": {**doc.get("types", {}), **types},
        "_sweep_us": sweep,
        "_note": f"swept by ci/tune_gguf_gemv.py on {name} ({arch}) on {time.strftime('%Y-%m-%d')}, shapes "
        f"{args.shapes}, M {args.ms}, bf16 activations; " + doc["_note"],
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
