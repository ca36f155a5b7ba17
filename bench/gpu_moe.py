"""Whole MoE expert layers on this GPU: quantrt's fused grouped GEMMs (``QuantExperts`` on the
``cuda.triton_moe_*`` kernels) beside the dense bf16 grouped baseline and dequant + that baseline.

    python3 bench/gpu_moe.py --out FILE.json [--budget-s 180] [--shapes mixtral,qwen3]
        [--ms 1,16,64,256,1024] [--schemes w4a16-int-g128,w8a8-fp8-ch,...]
    python3 bench/gpu_moe.py --out FILE.json --sweep [--sweep-shape mixtral] [--sweep-scheme ...]
        [--table moe_sm_90.json]
    python3 bench/gpu_moe.py --out FILE.json --profile [--sweep-shape qwen3] [--sweep-scheme ...] [--ms 1,16]

Layer shapes: Mixtral-8x7B (E=8, H=4096, I=14336, top_k=2) and Qwen3-30B-A3B (E=128, H=2048, I=768,
top_k=8); M tokens routed by softmax top-k of random logits (fixed seed, renormalised). Timed: the
whole expert computation, both projections, the SwiGLU and the weighted sum over top_k, routing
excluded on every side (ids and weights are inputs):

- ``quantrt``: ``QuantExperts.__call__`` (activation quantization included);
- ``baseline``: dense bf16 experts, tokens sorted by expert, ``torch._grouped_mm`` where this torch
  has it and it runs (``grouped_mm``), and a loop of cuBLAS ``F.linear`` per expert over its tokens
  (``loop``, one host sync for the counts, so eager only); the faster per cell is the baseline;
- ``dequant``: every expert dequantized to bf16 by torch ops each call, then the baseline.

Medians with the L2 flushed (``triton.testing.do_bench``, median), eager and CUDA-graph replay
(``do_bench`` over ``graph.replay()``). Quantized weights are synthetic canonical tensors (random
codes, scales near the values RTN gives N(0, 0.02) weights): timing does not depend on the values,
and the reference quantizer would take minutes at these sizes. One cell per (shape, M, scheme) also
checks quantrt's output against dequant + baseline (relative Frobenius error, ``rel_vs_dequant``).
The whole run keeps to ``--budget-s`` seconds from start-up (180: one cell past it still finishes,
so the run ends inside 4 minutes): cells past it are recorded as skipped, and the order (every
shape's baseline, then scheme by scheme, both shapes each) spreads a cut-off over the table. The JSON is
rewritten after every cell; a compact table and the targets' verdicts are printed last.

``--sweep`` times tile candidates instead (every bucket forced to one tile, CUDA-graph replay of the
whole layer; the K split off, or as the table sets it with ``--sweep-split``: a small batch's second
projection of a long K wants it) and ``--table`` writes the best per rows-per-expert bucket as
``backends/cuda/tunings/moe_<arch>.json`` takes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton.testing as tt

from quantrt.backends.cuda import triton_moe
from quantrt.backends.triton.moe import MoeTile
from quantrt.bench import graph_replay_us
from quantrt.moe import CanonicalExperts, QuantExperts
from quantrt.moe.activation import Activation
from quantrt.schemes import parse_scheme

SHAPES = {
    "mixtral": dict(E=8, H=4096, I=14336, top_k=2),
    "qwen3": dict(E=128, H=2048, I=768, top_k=8),
}
SCHEMES = {  # bench name -> catalog scheme
    "w4a16-int-g128": "w4a16-int-g128-sym",
    "w8a8-fp8-ch": "w8a8-fp8-ch",
    "w8a8-fp8-block128": "w8a8-fp8-block128",
    "w4a16-mxfp4": "w4a16-mxfp4",
    "w4a16-nvfp4": "w4a16-nvfp4",
}
MS = (1, 16, 64, 256, 1024)
BF16 = torch.bfloat16
ACT = Activation("silu")
WARMUP_MS, REP_MS = 10, 50
#: the run's clock starts at import (CUDA and Triton start-up count towards --budget-s)
T_START = time.monotonic()


# -- timing ----------------------------------------------------------------------------------------


def launch_shape(lay: Any, M: int, k: int) -> dict[str, Any] | None:
    """What a projection launches for M tokens: the CUDA mma grouped kernel's shape where it takes
    the batch, else the Triton tile."""
    mma = getattr(lay, "mma", None)
    if mma is not None and M <= mma.max_tokens():
        t = mma.tile(M, M * k)
        return {"cuda_mma": True, "xr": t.xr, "nt": t.nt, "wn": t.wn, "wk": t.wk, "stages": t.stages}
    return dataclasses.asdict(lay.tile(M * k)) if hasattr(lay, "tile") else None


def eager_us(fn: Any) -> float:
    return float(tt.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")) * 1e3


def graph_us(fn: Any) -> tuple[float | None, str]:
    return graph_replay_us(fn, WARMUP_MS, REP_MS)


# -- routing and the dense baselines ---------------------------------------------------------------


def routing(M: int, E: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(M, E, device="cuda", generator=g)
    w, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def _sort(ids: torch.Tensor, E: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Assignments by expert and the int32 cumulative counts, without a host sync."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = (flat[:, None] == torch.arange(E, device=flat.device)).sum(0)
    return order, torch.cumsum(counts, 0).to(torch.int32)


def grouped_mm_baseline(x, ids, w, w13, w2):
    """Dense experts through torch._grouped_mm (tokens sorted by expert; capturable)."""
    M, k = ids.shape
    order, offs = _sort(ids, w13.shape[0])
    tok = order // k
    h = torch._grouped_mm(x.index_select(0, tok), w13.transpose(1, 2), offs=offs)
    y = torch._grouped_mm(ACT(h), w2.transpose(1, 2), offs=offs)
    y = y.float() * w.reshape(-1).index_select(0, order)[:, None]
    out = torch.zeros(M, w2.shape[1], dtype=torch.float32, device=x.device)
    return out.index_add_(0, tok, y).to(BF16)


def loop_baseline(x, ids, w, w13, w2):
    """Dense experts, one cuBLAS F.linear pair per expert over its tokens (one host sync)."""
    M, k = ids.shape
    E = w13.shape[0]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E).tolist()
    wf = w.reshape(-1)
    out = torch.zeros(M, w2.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e, c in enumerate(counts):
        if not c:
            continue
        a = order[start : start + c]
        start += c
        t = a // k
        y = F.linear(ACT(F.linear(x.index_select(0, t), w13[e])), w2[e])
        out.index_add_(0, t, y.float() * wf.index_select(0, a)[:, None])
    return out.to(BF16)


def grouped_mm_works(x, ids, w, w13, w2) -> str:
    if not hasattr(torch, "_grouped_mm"):
        return "torch._grouped_mm is missing from this torch"
    try:
        y = grouped_mm_baseline(x, ids, w, w13, w2)
        ref = loop_baseline(x, ids, w, w13, w2)
        err = rel(y, ref)
        return "" if err < 1e-2 else f"torch._grouped_mm disagrees with the loop (rel {err:.3g})"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# -- synthetic canonical experts and their torch dequantization ------------------------------------

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def synth(scheme: str, E: int, N: int, K: int, sizes: tuple[int, ...], seed: int) -> CanonicalExperts:
    """Random canonical tensors of a layer: codes uniform, scales near RTN's for N(0, 0.02)."""
    s = parse_scheme(scheme)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"

    def u8(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, device=dev, generator=g, dtype=torch.uint8)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, device=dev, generator=g) * 0.5 + 0.75

    t: dict[str, torch.Tensor] = {}
    if s.family == "int":
        G = s.group_size
        t["qweight"] = u8(E, N, K // 2)
        t["scales"] = (rand(E, N, K // G) * 0.02 * 3 / 8).half().float()
    elif s.family == "fp8":
        t["qweight"] = (
            (torch.randn(E, N, K, device=dev, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        )
        if s.granularity == "block":
            bn, bk = s.block
            t["scales"] = rand(E, -(-N // bn), -(-K // bk)) * 0.02 * 3 / 448
        else:
            t["scales"] = rand(E, N, 1) * 0.02 * 3 / 448
    elif s.family == "mxfp4":
        t["qweight"] = u8(E, N, K // 2)
        t["scales"] = torch.randint(118, 122, (E, N, K // 32), device=dev, generator=g, dtype=torch.uint8)
    elif s.family == "nvfp4":
        t["qweight"] = u8(E, N, K // 2)
        t["scales"] = (rand(E, N, K // 16) * 64).to(torch.float8_e4m3fn)
        t["global_scale"] = torch.full((E, len(sizes)), 0.02 * 3 / 6 / 64, device=dev)
    else:
        raise ValueError(f"no synthetic weights for {scheme}")
    return CanonicalExperts(s, E, N, K, t, sizes)


def dequant(c: CanonicalExperts) -> torch.Tensor:
    """bf16 [E, N, K] by torch ops (the naive path: a few elementwise passes over the weights)."""
    s, E, N, K = c.scheme, c.E, c.N, c.K
    q = c["qweight"]
    if s.family == "int":
        G = s.group_size
        codes = torch.stack((q & 0xF, q >> 4), dim=-1).view(E, N, K // G, G)
        w = (codes.to(BF16) - 8) * c["scales"].to(BF16)[..., None]
        return w.view(E, N, K)
    if s.family == "fp8":
        if s.granularity == "block":
            bn, bk = s.block
            w = q.to(BF16).view(E, N // bn, bn, K // bk, bk) * c["scales"].to(BF16)[:, :, None, :, None]
            return w.view(E, N, K)
        return q.to(BF16) * c["scales"].to(BF16)
    lut = torch.tensor(FP4_VALUES, device=q.device, dtype=BF16)
    vals = torch.stack((lut[(q & 0xF).long()], lut[(q >> 4).long()]), dim=-1)
    if s.family == "mxfp4":
        sc = torch.exp2(c["scales"].float() - 127).to(BF16)
        return (vals.view(E, N, K // 32, 32) * sc[..., None]).view(E, N, K)
    sizes = torch.tensor(c.output_sizes, device=q.device)
    gs = c["global_scale"][
        :, torch.repeat_interleave(torch.arange(len(c.output_sizes), device=q.device), sizes)
    ]
    sc = (c["scales"].float() * gs[..., None]).to(BF16)
    return (vals.view(E, N, K // 16, 16) * sc[..., None]).view(E, N, K)


def dequant_baseline(basefn, x, ids, w, c13, c2):
    """Every expert dequantized to bf16, then the dense baseline."""
    return basefn(x, ids, w, dequant(c13), dequant(c2))


# -- the run ---------------------------------------------------------------------------------------


def git_sha() -> str:
    """QUANTRT_TREE where given (the device's copy of the tree reports a stale HEAD), else git's."""
    if os.environ.get("QUANTRT_TREE"):
        return os.environ["QUANTRT_TREE"]
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def header(args: argparse.Namespace) -> dict[str, Any]:
    import triton

    return {
        "what": "MoE expert layers: quantrt fused grouped GEMMs vs dense bf16 grouped baseline vs dequant + baseline",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": str(torch.version.cuda),
        },
        "git": git_sha(),
        "command": "python3 " + " ".join(sys.argv),
        "ptx_decode": triton_moe.ptx_decode_enabled(),  # QUANTRT_MOE_PTX_DECODE=1
        "timing": f"triton.testing.do_bench median, L2 flushed, warmup {WARMUP_MS} ms, rep {REP_MS} ms; "
        "graph: do_bench over CUDAGraph.replay()",
        "rows": [],
    }


def layer(c13: CanonicalExperts, c2: CanonicalExperts, shape: dict) -> QuantExperts:
    return QuantExperts.from_canonical(c13, c2, act_dtype=BF16, device="cuda")


def save(doc: dict, path: str) -> None:
    Path(path).write_text(json.dumps(doc, indent=1))


def dense_setup(shape_name: str, ms: list[int], over: Any) -> dict:
    """One shape's dense bf16 experts, inputs per M and the baseline's times per M."""
    sh = SHAPES[shape_name]
    E, H, Inter, k = sh["E"], sh["H"], sh["I"], sh["top_k"]
    g = torch.Generator(device="cuda").manual_seed(1)
    w13 = (torch.randn(E, 2 * Inter, H, device="cuda", generator=g) * 0.02).to(BF16)
    w2 = (torch.randn(E, H, Inter, device="cuda", generator=g) * 0.02).to(BF16)
    inputs = {}
    for M in ms:
        ids, w = routing(M, E, k, seed=M)
        inputs[M] = (torch.randn(M, H, device="cuda", generator=g).to(BF16), ids, w)
    gm_err = grouped_mm_works(*inputs[min(ms, key=lambda m: abs(m - 16))], w13, w2)
    base: dict[int, dict] = {}
    for M in ms:
        if over():
            break
        b: dict[str, Any] = {"loop_us": eager_us(partial(loop_baseline, *inputs[M], w13, w2))}
        if not gm_err:
            grouped = partial(grouped_mm_baseline, *inputs[M], w13, w2)
            b["grouped_mm_us"] = eager_us(grouped)
            b["grouped_mm_graph_us"], b["grouped_mm_graph_error"] = graph_us(grouped)
        kind = "grouped_mm" if b.get("grouped_mm_us", math.inf) < b["loop_us"] else "loop"
        b["kind"] = kind
        b["eager_us"] = b[f"{kind}_us"]
        b["graph_us"] = b.get("grouped_mm_graph_us")  # the loop synchronises: no graph
        base[M] = b
    return dict(sh=sh, w13=w13, w2=w2, inputs=inputs, base=base, grouped_mm=gm_err or "ok",
                basefn=loop_baseline if gm_err else grouped_mm_baseline)  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    over = lambda: time.monotonic() - T_START > args.budget_s  # noqa: E731
    doc = header(args)
    doc["budget_s"] = args.budget_s
    ms = [int(v) for v in args.ms.split(",")]
    shapes = {}
    for shape_name in args.shapes.split(","):  # every shape's baseline first, then schemes x shapes
        if over():
            doc["rows"].append({"shape": shape_name, "skipped": "budget"})
            continue
        shapes[shape_name] = dense_setup(shape_name, ms, over)
        doc.setdefault("grouped_mm", {})[shape_name] = shapes[shape_name]["grouped_mm"]
    graph_error = ""  # once quantrt's forward fails to capture, later cells do not try again
    for bench_name in args.schemes.split(","):
        scheme = SCHEMES[bench_name]
        for shape_name, st in shapes.items():
            sh, base, basefn = st["sh"], st["base"], st["basefn"]
            E, H, Inter, k = sh["E"], sh["H"], sh["I"], sh["top_k"]
            if over():
                doc["rows"].append({"shape": shape_name, "scheme": bench_name, "skipped": "budget"})
                save(doc, args.out)
                continue
            t_load = time.monotonic()
            c13 = synth(scheme, E, 2 * Inter, H, (Inter, Inter), seed=2)
            c2 = synth(scheme, E, H, Inter, (H,), seed=3)
            m = layer(c13, c2, sh)
            load_s = time.monotonic() - t_load
            for M in ms:
                row: dict[str, Any] = {"shape": shape_name, "E": E, "H": H, "I": Inter, "top_k": k, "M": M,
                                       "scheme": bench_name, "catalog_scheme": scheme}  # fmt: skip
                if over() or M not in base:
                    row["skipped"] = "budget"
                    doc["rows"].append(row)
                    continue
                x, ids, w = st["inputs"][M]
                row["kernels"] = m.kernel_names
                row["tiles"] = {
                    name: launch_shape(p.state.layout, M, k)
                    for name, p in zip(("gate_up", "down"), (m._gate_up[0], m._down))
                }
                y = m(x, ids, w)
                row["rel_vs_dequant"] = rel(y, dequant_baseline(basefn, x, ids, w, c13, c2))
                row["quantrt_us"] = eager_us(partial(m, x, ids, w))
                if graph_error:
                    row["quantrt_graph_us"], row["quantrt_graph_error"] = None, graph_error
                else:
                    row["quantrt_graph_us"], graph_error = graph_us(partial(m, x, ids, w))
                    row["quantrt_graph_error"] = graph_error
                row["dequant_us"] = eager_us(partial(dequant_baseline, basefn, x, ids, w, c13, c2))
                b = base[M]
                row["baseline"] = b
                row["speedup_eager"] = b["eager_us"] / row["quantrt_us"]
                if b["graph_us"] and row["quantrt_graph_us"]:
                    row["speedup_graph"] = b["graph_us"] / row["quantrt_graph_us"]
                row["vs_dequant"] = row["dequant_us"] / row["quantrt_us"]
                row["load_s"] = round(load_s, 2)
                doc["rows"].append(row)
                save(doc, args.out)
            m = c13 = c2 = None
            torch.cuda.empty_cache()
    doc["elapsed_s"] = round(time.monotonic() - T_START, 1)
    doc["targets"] = targets(doc["rows"])
    save(doc, args.out)
    return doc


def targets(rows: list[dict]) -> list[dict]:
    """The lead's targets per cell: int4/fp4 >= 2.5x the bf16 baseline at M <= 16; fp8 >= 1.5x at
    M >= 256; never slower than dequant + baseline. Graph replay where both sides have it."""
    out = []
    for r in rows:
        if "quantrt_us" not in r:
            continue
        sp = r.get("speedup_graph") or r["speedup_eager"]
        if r["scheme"].startswith(("w4a16-int", "w4a16-mxfp4", "w4a16-nvfp4")) and r["M"] <= 16:
            out.append(
                {"cell": _cell(r), "target": ">= 2.5x baseline", "value": round(sp, 2), "ok": sp >= 2.5}
            )
        if r["scheme"].startswith("w8a8-fp8") and r["M"] >= 256:
            out.append(
                {"cell": _cell(r), "target": ">= 1.5x baseline", "value": round(sp, 2), "ok": sp >= 1.5}
            )
        out.append(
            {
                "cell": _cell(r),
                "target": ">= 1x dequant",
                "value": round(r["vs_dequant"], 2),
                "ok": r["vs_dequant"] >= 1,
            }
        )
    return out


def _cell(r: dict) -> str:
    return f"{r['shape']} M={r['M']} {r['scheme']}"


def table(doc: dict) -> str:
    lines = [
        f"{doc['device']}  torch {doc['versions']['torch']}  triton {doc['versions']['triton']}  git {doc['git']}",
        f"{'shape':8} {'M':>5} {'scheme':18} {'quantrt':>9} {'q graph':>9} {'base':>9} {'b graph':>9} "
        f"{'kind':>10} {'deq':>9} {'x base':>7} {'x deq':>6} {'err':>8}",
    ]
    f = lambda v: f"{v:9.1f}" if isinstance(v, (int, float)) else f"{'-':>9}"  # noqa: E731
    for r in doc["rows"]:
        if "quantrt_us" not in r:
            lines.append(
                f"{r.get('shape', ''):8} {r.get('M', ''):>5} {r.get('scheme', ''):18} skipped ({r.get('skipped')})"
            )
            continue
        b = r["baseline"]
        sp = r.get("speedup_graph") or r["speedup_eager"]
        lines.append(
            f"{r['shape']:8} {r['M']:>5} {r['scheme']:18} {f(r['quantrt_us'])} {f(r['quantrt_graph_us'])} "
            f"{f(b['eager_us'])} {f(b['graph_us'])} {b['kind']:>10} {f(r['dequant_us'])} {sp:7.2f} "
            f"{r['vs_dequant']:6.2f} {r['rel_vs_dequant']:8.1e}"
        )
    t = doc.get("targets", [])
    bad = [x for x in t if not x["ok"]]
    lines.append(f"targets: {len(t) - len(bad)}/{len(t)} met" + ("" if not bad else "; missed:"))
    lines += [f"  {x['cell']}: {x['target']} (got {x['value']})" for x in bad]
    lines.append(
        "times in us (median, L2 flushed); x base: baseline/quantrt (graph replay where both have it)"
    )
    return "\n".join(lines)


# -- tile sweep ------------------------------------------------------------------------------------

SWEEP_SMALL = [
    MoeTile(16, bn, bk, 1, 1, w, st, swap)
    for bn in (64, 128, 256)
    for bk in (128, 256)
    for w, st in ((4, 3), (4, 4), (8, 3), (8, 4))
    for swap in (False, True)
    if not (swap and w == 8)
]
SWEEP_LARGE = [
    MoeTile(bm, bn, bk, 8, 1, w, st)
    for bm in (32, 64, 128)
    for bn in (64, 128, 256)
    for bk in (64, 128)
    for w, st in ((4, 3), (8, 3), (4, 4))
    if bm * bn <= 128 * 128 or w == 8
]


def one_layer(args: argparse.Namespace) -> tuple[QuantExperts, str, tuple[int, int, int]]:
    """The ``--sweep-shape`` layer in ``--sweep-scheme`` (synthetic experts), its catalog scheme and
    (E, H, top_k)."""
    sh = SHAPES[args.sweep_shape]
    E, H, Inter = sh["E"], sh["H"], sh["I"]
    scheme = SCHEMES[args.sweep_scheme]
    m = layer(synth(scheme, E, 2 * Inter, H, (Inter, Inter), 2), synth(scheme, E, H, Inter, (H,), 3), sh)
    return m, scheme, (E, H, sh["top_k"])


def sweep(args: argparse.Namespace) -> dict:
    t0 = T_START
    doc = header(args)
    doc["what"] = "MoE grouped GEMM tile sweep (every bucket forced to one tile; graph replay of the layer)"
    m, scheme, (E, H, k) = one_layer(args)
    projections = [*m._gate_up, m._down]
    saved = [p.state.layout for p in projections]
    for M in [int(v) for v in args.ms.split(",")]:
        ids, w = routing(M, E, k, seed=M)
        x = torch.randn(M, H, device="cuda").to(BF16)
        cands = SWEEP_SMALL if M * k <= 16 * E else SWEEP_LARGE
        res = {}
        for tile in cands:
            if time.monotonic() - t0 > args.budget_s:
                break
            try:
                for p, lay in zip(projections, saved):
                    t = _fit(tile, lay.weights)
                    targets = lay.targets if args.sweep_split else (0,) * 5
                    p.state.layout = dataclasses.replace(lay, tiles=(t,) * 5, targets=targets, _split={})
                us, err = graph_us(partial(m, x, ids, w))
                res[json.dumps(dataclasses.asdict(tile))] = us if us is not None else err
            except Exception as e:
                res[json.dumps(dataclasses.asdict(tile))] = f"{type(e).__name__}: {str(e)[:120]}"
        for p, lay in zip(projections, saved):
            p.state.layout = lay
        timed = {t: v for t, v in res.items() if isinstance(v, float)}
        best = min(timed, key=timed.get) if timed else None
        doc["rows"].append({"M": M, "rows_per_expert": M * k / E, "tiles_us": res, "best": best})
        save(doc, args.out)
    if args.table:
        if "fp4" in scheme:
            section = "weight_only_fp4"
        else:
            section = (
                "weight_only" if scheme.startswith("w4") else "fp8_block" if "block" in scheme else "w8a8"
            )
        tab: dict = {
            "_note": f"bench/gpu_moe.py --sweep on {doc['device']}, {args.sweep_shape} {scheme}",
            section: {},
        }
        for r in doc["rows"]:
            if r["best"]:
                key = next(
                    key
                    for b, key in zip(triton_moe.ROWS_PER_EXPERT, triton_moe.KEYS)
                    if r["rows_per_expert"] <= b
                )
                tab[section][key] = json.loads(r["best"])
        Path(args.table).write_text(json.dumps(tab, indent=1))
    save(doc, args.out)
    return doc


def profile(args: argparse.Namespace) -> dict:
    """Where one layer call's device time goes: every kernel of ``--profile-reps`` eager calls
    (torch.profiler), per launch, beside the graph replay of the whole call."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    doc = header(args)
    doc["what"] = "MoE layer kernel breakdown (torch.profiler over eager calls; graph replay of the call)"
    m, scheme, (E, H, k) = one_layer(args)
    reps = args.profile_reps
    for M in [int(v) for v in args.ms.split(",")]:
        ids, w = routing(M, E, k, seed=M)
        x = torch.randn(M, H, device="cuda").to(BF16)
        for _ in range(3):
            m(x, ids, w)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                m(x, ids, w)
            torch.cuda.synchronize()
        kernels = []
        for ev in prof.key_averages():
            dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if dev_us:
                kernels.append({"name": ev.key[:90], "calls_per_layer": ev.count / reps, "us": dev_us / reps})
        kernels.sort(key=lambda r: -r["us"])
        graph, err = graph_us(partial(m, x, ids, w))
        row = {"M": M, "graph_us": graph, "graph_error": err, "kernels": kernels,
               "kernel_sum_us": sum(r["us"] for r in kernels)}  # fmt: skip
        doc["rows"].append(row)
        print(
            f"{args.sweep_shape} {scheme} M={M}: graph {graph} us, kernels sum {row['kernel_sum_us']:.1f} us"
        )
        for r in kernels:
            print(f"  {r['us']:8.1f} us  x{r['calls_per_layer']:.0f}  {r['name']}")
        save(doc, args.out)
    return doc


def _fit(tile: MoeTile, weights: Any) -> MoeTile:
    """The tile inside a weight's scale groups and blocks (as prepare fits the table's tiles)."""
    bn, bk = tile.block_n, tile.block_k
    if weights.kind == "int" and weights.group:
        while weights.group % bk:
            bk //= 2
    if weights.kind == "block":
        while weights.block[0] % bn:
            bn //= 2
        while weights.block[1] % bk:
            bk //= 2
    return dataclasses.replace(tile, block_n=bn, block_k=bk)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--budget-s", type=float, default=180.0, help="start no cell after this many seconds from start-up"
    )
    ap.add_argument("--shapes", default="mixtral,qwen3")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-shape", default="mixtral")
    ap.add_argument("--sweep-scheme", default="w4a16-int-g128")
    ap.add_argument(
        "--sweep-split",
        action="store_true",
        help="keep each projection's K-split targets from the table (default: the split off)",
    )
    ap.add_argument("--table", default=None)
    ap.add_argument("--profile", action="store_true", help="kernel breakdown of --sweep-shape/--sweep-scheme")
    ap.add_argument("--profile-reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_moe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.profile:
        profile(args)
        return 0
    doc = sweep(args) if args.sweep else run(args)
    if args.sweep:
        for r in doc["rows"]:
            print(f"M={r['M']:>5} best {r['best']} ({r['tiles_us'].get(r['best']) if r['best'] else '-'} us)")
    else:
        print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
