"""Where one decode step's time goes: quantrt's split-K decode attention taken apart on this GPU.

    python3 bench/gpu_kv_anatomy.py --out FILE.json [--schemes kv-fp8,kv-tq-4bit-nc]
        [--contexts 1024,2048,4096,8192,16384,32768] [--batch 1] [--splits-at 32768] [--flush write]

Heads of Llama-3-8B as ``bench/gpu_kv.py``. For each scheme the launch shape is the rule's at
``--splits-at`` tokens, held fixed while the context grows, so each program's share of the tiles
grows with it: the time against tiles per program is a line whose slope is a tile's cost in the
steady loop and whose intercept is the step's fixed cost. Each point is timed, under CUDA-graph
replay with the L2 flushed (medians):

- ``step_us``: the whole call (the decode kernel and the split combine);
- ``decode_us``: the decode kernel alone (the combine launch skipped);
- ``combine_us``: the combine kernel alone, on the partial results of a real call;
- ``empty_us`` (once): a graph of one empty kernel over as many programs (the launch floor).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import gpu_kv as g
import torch
import triton
import triton.language as tl

from quantrt.bench import FLUSH_MODES, graph_replay_us, l2_flush


@triton.jit
def _empty_kernel(X):
    if tl.program_id(0) < 0:
        tl.store(X, 0)


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares line y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"intercept_us": round(my - b * mx, 2), "per_tile_us": round(b, 3)}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def time_point(scheme_name: str, T: int, batch: int, block_n: int, splits: int) -> dict[str, Any]:
    """One context's step, decode kernel and combine kernel (the launch shape already fixed)."""
    import quantrt.backends.triton.kv as tkv

    gen = torch.Generator(device=g.DEVICE).manual_seed(T)
    k = torch.randn(batch, g.HKV, T, g.D, device=g.DEVICE, generator=gen, dtype=g.BF16)
    v = torch.randn_like(k)
    q = torch.randn(batch, g.HQ, g.D, device=g.DEVICE, generator=gen, dtype=g.BF16)
    pages, table, lens, _ = g.build_pages(scheme_name, k, v, 16)
    del k, v
    combine = tkv._combine_launch
    calls: list[tuple] = []

    def fn() -> torch.Tensor:
        return g.decode_fn(q, pages, table, lens, T)

    def record(grid: Any, *a: Any, **kw: Any) -> None:
        calls.append((grid, a, kw))

    point: dict[str, Any] = {"context": T, "tiles_per_program": _ceil(_ceil(T, block_n), splits)}
    point["step_us"] = round(graph_replay_us(fn)[0], 2)
    try:
        tkv._combine_launch = record
        point["decode_us"] = round(graph_replay_us(fn)[0], 2)
    finally:
        tkv._combine_launch = combine
    if calls:
        grid, a, kw = calls[-1]
        point["combine_us"] = round(graph_replay_us(lambda: combine(grid, *a, **kw))[0], 2)
    return point


def anatomy(scheme_name: str, contexts: list[int], batch: int, splits_at: int) -> dict[str, Any]:
    """The points of one scheme under the launch shape of ``splits_at`` tokens, and their lines."""
    import quantrt.backends.triton.kv as tkv
    from quantrt.schemes import parse_kv_scheme

    s = parse_kv_scheme(g.SCHEMES[scheme_name]) if g.SCHEMES[scheme_name] else None
    sms = tkv.device_sms(torch.device(g.DEVICE))
    cfg = tkv.decode_config(batch, g.HKV, splits_at, g.D, sms, tkv.kv_format(s, g.D))
    rule = tkv.decode_config
    out: dict[str, Any] = {"scheme": scheme_name, "batch": batch, "config": cfg.__dict__, "points": []}
    try:
        tkv.decode_config = lambda *a, **kw: cfg
        for T in contexts:
            out["points"].append(time_point(scheme_name, T, batch, cfg.block_n, cfg.num_splits))
            print(scheme_name, out["points"][-1], flush=True)
            torch.cuda.empty_cache()
    finally:
        tkv.decode_config = rule
    pts = out["points"]
    if len(pts) > 1:
        xs = [float(p["tiles_per_program"]) for p in pts]
        out["step_fit"] = fit(xs, [p["step_us"] for p in pts])
        out["decode_fit"] = fit(xs, [p["decode_us"] for p in pts])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default="kv-fp8,kv-tq-4bit-nc")
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--flush", choices=FLUSH_MODES, default="write", help="L2 flush (quantrt.bench.l2_flush)")
    ap.add_argument("--splits-at", type=int, default=32768, help="the context whose launch shape is kept")
    args = ap.parse_args()
    with l2_flush(args.flush):
        doc = measure(args)
    for r in doc["rows"]:
        print(r["scheme"], r.get("step_fit"), r.get("decode_fit"))
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every scheme's points, the JSON rewritten after each."""
    doc = g.header()
    doc["flush"] = args.flush
    doc["what"] = (
        "decode attention taken apart: step, decode kernel, combine kernel against tiles per program"
    )
    x = torch.zeros(1, device=g.DEVICE)
    import quantrt.backends.triton.kv as tkv

    sms = tkv.device_sms(torch.device(g.DEVICE))
    programs = g.HKV * args.batch * tkv.decode_config(args.batch, g.HKV, args.splits_at, g.D, sms).num_splits
    doc["empty_us"] = round(graph_replay_us(lambda: _empty_kernel[(programs,)](x))[0], 2)
    contexts = [int(c) for c in args.contexts.split(",")]
    for name in args.schemes.split(","):
        doc["rows"].append(anatomy(name, contexts, args.batch, args.splits_at))
        Path(args.out).write_text(json.dumps(doc, indent=1))
    doc["elapsed_s"] = round(time.monotonic() - g.T_START, 1)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    sys.exit(main())
