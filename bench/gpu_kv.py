"""Decode attention over a quantized KV cache on this GPU: quantrt's Triton split-K decode reading
each scheme's pages, beside torch SDPA / FlashAttention on a contiguous bf16 cache.

    python3 bench/gpu_kv.py --out FILE.json [--budget-s 240] [--contexts 1024,8192,32768]
        [--batches 1,16,64] [--schemes bf16,kv-fp8,kv-int8-token,...] [--block-size 16]

Heads of Llama-3-8B (Hq = 32, Hkv = 8, head_dim 128), one query token per sequence, every sequence
at the full context, bf16 queries and caches. Timed, per (context, batch):

- ``quantrt``: ``quantrt.kv.decode_attention`` on a ``KVPages`` of the scheme (``bf16``: the
  unquantized pages through the same kernel), pages of ``--block-size`` slots through a block table,
  the cache written by the scheme's quantize-on-write kernel;
- the baseline, the fastest of: ``F.scaled_dot_product_attention`` with q [B, Hq, 1, D] on K/V
  [B, Hkv, T, D] (``enable_gqa=True`` where this torch has it), the same forced onto the flash
  backend (``sdpa_kernel(FLASH_ATTENTION)``), SDPA on K/V expanded to Hq heads (where memory
  allows), and ``flash_attn.flash_attn_with_kvcache`` when ``flash_attn`` is importable. Each row
  names the baseline it was measured against; every candidate's times are kept per (context,
  batch) under ``baselines``.

Medians with the L2 flushed (``triton.testing.do_bench``; ``--flush read`` leaves it clean, see
``quantrt.bench.l2_flush``), eager and CUDA-graph replay; the speedup
uses graph replay where both sides have it (launch overhead out of the way), eager otherwise.
``bytes_per_token`` is one layer's cache per token (keys and values, every KV head). Each quantrt
cell also records its relative error against fp32 attention over the bf16 cache (the scheme's
quantization error, a sanity check; left out where that fp32 copy would not fit). Cells that would
not fit in free GPU memory are skipped with a note; the run starts no cell after ``--budget-s``
seconds (remaining cells recorded as skipped; the 32k context runs first). The JSON is rewritten
after every cell; a compact table and the targets' verdicts are printed last: fp8 (``kv-fp8``)
>= 1.6x and 4-bit TurboQuant (``kv-tq-4bit-nc``) >= 2.5x the baseline at 32k.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton.testing as tt

from quantrt.bench import FLUSH_MODES, graph_replay_us, l2_flush

HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5  # the softmax scale of every side
CONTEXTS = (1024, 8192, 32768)
BATCHES = (1, 16, 64)
#: bench name -> quantrt KV scheme (None: the unquantized bf16 pages)
SCHEMES = {
    "bf16": None,
    "kv-fp8": "kv-fp8",
    "kv-int8-token": "kv-int8-token",
    "kv-tq-k8v4": "kv-tq-k8v4",
    "kv-tq-4bit-nc": "kv-tq-4bit-nc",
    "kv-tq-k3v4-nc": "kv-tq-k3v4-nc",
    "kv-tq-3bit-nc": "kv-tq-3bit-nc",
}
TARGETS = {"kv-fp8": 1.6, "kv-tq-4bit-nc": 2.5}
TARGET_CONTEXT = 32768
BF16 = torch.bfloat16
DEVICE = "cuda"
WARMUP_MS, REP_MS = 10, 50
#: free memory kept in reserve when deciding whether a cell fits
MEMORY_MARGIN = 2 << 30
#: the run's clock starts at import (CUDA and Triton start-up count towards --budget-s)
T_START = time.monotonic()


# -- timing ----------------------------------------------------------------------------------------


def eager_us(fn: Any) -> float:
    return float(tt.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")) * 1e3


def graph_us(fn: Any) -> tuple[float | None, str]:
    return graph_replay_us(fn, WARMUP_MS, REP_MS)


def timed(fn: Any) -> dict[str, Any]:
    """Eager and graph-replay medians of ``fn`` (and why the graph failed, if it did)."""
    eager = eager_us(fn)
    graph, err = graph_us(fn)
    out: dict[str, Any] = {
        "eager_us": round(eager, 2),
        "graph_us": None if graph is None else round(graph, 2),
    }
    if err:
        out["graph_error"] = err
    return out


def best_us(t: dict[str, Any]) -> float:
    return t["graph_us"] if t.get("graph_us") is not None else t["eager_us"]


def free_bytes() -> int:
    return torch.cuda.mem_get_info()[0]


# -- the baselines ---------------------------------------------------------------------------------


def sdpa_supports_gqa() -> bool:
    return "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def baselines(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> dict[str, dict]:
    """Every baseline candidate that runs here: name -> timings (or an error)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B = q.shape[0]
    q4 = q.view(B, HQ, 1, D)
    gqa = sdpa_supports_gqa()
    cands: dict[str, Any] = {}
    if gqa:
        cands["sdpa_gqa"] = lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

        def flash() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

        cands["sdpa_gqa_flash"] = flash
    out: dict[str, dict] = {}
    for name, fn in cands.items():
        out[name] = _try(fn)
    expanded_bytes = 2 * k.numel() * k.element_size() * (HQ // HKV)
    if expanded_bytes + MEMORY_MARGIN < free_bytes():
        ke = k.repeat_interleave(HQ // HKV, dim=1)
        ve = v.repeat_interleave(HQ // HKV, dim=1)
        out["sdpa_expanded"] = _try(lambda: F.scaled_dot_product_attention(q4, ke, ve, scale=scale))

        def flash_expanded() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q4, ke, ve, scale=scale)

        out["sdpa_expanded_flash"] = _try(flash_expanded)
        del ke, ve
    else:
        out["sdpa_expanded"] = {"skipped": f"expanded K/V need {expanded_bytes >> 20} MiB"}
    if importlib.util.find_spec("flash_attn") is not None:
        nhd_bytes = 2 * k.numel() * k.element_size()
        if nhd_bytes + MEMORY_MARGIN < free_bytes():
            from flash_attn import flash_attn_with_kvcache

            kc, vc = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            lens = torch.full((B,), k.shape[2], dtype=torch.int32, device=DEVICE)
            qn = q.view(B, 1, HQ, D)
            out["flash_attn_with_kvcache"] = _try(
                lambda: flash_attn_with_kvcache(qn, kc, vc, cache_seqlens=lens, softmax_scale=scale)
            )
            del kc, vc
        else:
            out["flash_attn_with_kvcache"] = {"skipped": f"an NHD copy needs {nhd_bytes >> 20} MiB"}
    torch.cuda.empty_cache()
    return out


def _try(fn: Any) -> dict[str, Any]:
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as e:  # this backend does not run here
        torch.cuda.synchronize()
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return timed(fn)


# -- quantrt ---------------------------------------------------------------------------------------


def build_pages(
    scheme_name: str, k: torch.Tensor, v: torch.Tensor, block_size: int
) -> tuple[Any, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Pages of the scheme filled from the bf16 K/V [B, Hkv, T, D] by its quantize-on-write kernel,
    their block table (pages in order) and lengths; (None, ...) with a note where they would not fit."""
    from quantrt.kv import KVPages, bytes_per_token
    from quantrt.schemes import parse_kv_scheme

    scheme = SCHEMES[scheme_name]
    s = parse_kv_scheme(scheme) if scheme else None
    B, _, T, _ = k.shape
    per = -(-T // block_size)
    need = B * per * block_size * bytes_per_token(s, HKV, D)
    row: dict[str, Any] = {"bytes_per_token": bytes_per_token(s, HKV, D)}
    table = torch.arange(B * per, dtype=torch.int32, device=DEVICE).view(B, per)
    lens = torch.full((B,), T, dtype=torch.int32, device=DEVICE)
    if need + MEMORY_MARGIN > free_bytes():
        row["skipped"] = f"pages need {need >> 20} MiB, {free_bytes() >> 20} MiB free"
        return None, table, lens, row
    pages = KVPages(s, B * per, block_size, HKV, D, dtype=BF16, device=DEVICE)
    row["kernels"] = pages.kernels.name
    t = torch.arange(T, device=DEVICE)
    for b in range(B):  # sequence by sequence: no token-major copy of the whole cache
        slots = table[b].long()[t // block_size] * block_size + t % block_size
        pages.write(k[b].transpose(0, 1), v[b].transpose(0, 1), slots)
    return pages, table, lens, row


def decode_fn(q: torch.Tensor, pages: Any, table: torch.Tensor, lens: torch.Tensor, T: int) -> torch.Tensor:
    """One decode step over the pages, as timed."""
    from quantrt.kv import decode_attention

    return decode_attention(q, pages, table, lens, T, scale=SCALE)


def quantrt_cell(
    scheme_name: str,
    k: torch.Tensor,
    v: torch.Tensor,
    q: torch.Tensor,
    block_size: int,
    sweep: bool = False,
) -> dict[str, Any]:
    """Pages of the scheme filled from the bf16 K/V [B, Hkv, T, D], then decode timed (``sweep``:
    also every launch shape of :func:`sweep_configs` on the same pages, best time per shape)."""
    from quantrt.backends.triton.kv import decode_config, device_sms, kv_format

    pages, table, lens, row = build_pages(scheme_name, k, v, block_size)
    if pages is None:
        return row
    B, _, T, _ = k.shape
    cfg = decode_config(B, HKV, T, D, device_sms(q.device), kv_format(pages.scheme, D))
    row["config"] = {"block_n": cfg.block_n, "num_splits": cfg.num_splits, "transposed": cfg.transposed}

    def fn() -> torch.Tensor:
        return decode_fn(q, pages, table, lens, T)

    row["out"] = fn()
    row.update(timed(fn))
    if sweep:
        row["sweep"] = sweep_cell(fn, cfg)
    return row


def sweep_configs(cfg: Any) -> list[Any]:
    """Launch shapes around the rule's: tiles of 64/128/256 tokens x 4/8 warps x 2/3/4 stages at its
    split count; half the splits at its tile; two and four times the splits under tiles of 64/128 x
    4/8 warps (smaller programs fit more per SM, which more splits can then fill)."""
    from dataclasses import replace

    out = [
        replace(cfg, block_n=bn, num_warps=w, num_stages=st)
        for bn in (64, 128, 256)
        for w in (4, 8)
        for st in (2, 3, 4)
    ]
    out.append(replace(cfg, num_splits=max(1, cfg.num_splits // 2)))
    out += [
        replace(cfg, block_n=bn, num_warps=w, num_splits=cfg.num_splits * times)
        for times in (2, 4)
        for bn in (64, 128)
        for w in (4, 8)
    ]
    return out


def sweep_cell(fn: Any, cfg: Any) -> dict[str, Any]:
    """Each launch shape of :func:`sweep_configs` in place of the rule's (the module's decode_config
    swapped for the call): graph-replay median (eager where capture fails), or the error."""
    import dataclasses

    import quantrt.backends.triton.kv as tkv

    rule = tkv.decode_config
    res: dict[str, Any] = {}
    try:
        for c in sweep_configs(cfg):
            tkv.decode_config = lambda *a, _c=c, **kw: _c
            key = json.dumps(dataclasses.asdict(c))
            try:
                res[key] = best_us(timed(fn))
            except Exception as e:  # a shape the compiler or the GPU rejects
                res[key] = f"error: {type(e).__name__}: {str(e)[:120]}"
    finally:
        tkv.decode_config = rule
    return res


# -- the run ---------------------------------------------------------------------------------------


def git_sha() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
        sha = out.stdout.strip() or "unknown"
        return sha + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def header() -> dict[str, Any]:
    import triton

    return {
        "what": "decode attention: quantrt Triton split-K on quantized pages vs SDPA/FlashAttention on bf16",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": str(torch.version.cuda),
        },
        "git": git_sha(),
        "command": "python3 " + " ".join(sys.argv),
        "heads": {"q": HQ, "kv": HKV, "head_dim": D},
        "timing": f"triton.testing.do_bench median, L2 flushed, warmup {WARMUP_MS} ms, rep {REP_MS} ms; "
        "graph: do_bench over CUDAGraph.replay(); speedup on graph replay where both sides have it",
        "rows": [],
    }


def save(doc: dict, path: str) -> None:
    Path(path).write_text(json.dumps(doc, indent=1))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor | None:
    """fp32 attention over the bf16 cache (the quantrt cells' error is measured against it); None
    where its fp32 expanded copy would not fit comfortably."""
    B, _, T, _ = k.shape
    if 3 * B * HQ * T * D * 4 + MEMORY_MARGIN > free_bytes():
        return None
    ke = k.float().repeat_interleave(HQ // HKV, 1)
    ve = v.float().repeat_interleave(HQ // HKV, 1)
    return F.scaled_dot_product_attention(q.view(B, HQ, 1, D).float(), ke, ve, scale=scale).view(B, HQ, D)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y64, r64 = y.double(), ref.double()
    return float((y64 - r64).norm() / r64.norm())


def run(args: argparse.Namespace) -> dict:
    over = lambda: time.monotonic() - T_START > args.budget_s  # noqa: E731
    doc = header()
    doc["budget_s"] = args.budget_s
    doc["block_size"] = args.block_size
    doc["flush"] = args.flush
    doc["programs_per_sm"] = args.programs_per_sm
    names = args.schemes.split(",")
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        raise SystemExit(f"unknown schemes {unknown}; known: {', '.join(SCHEMES)}")
    scale = SCALE
    # the targets' context first, so a run cut short by the budget still has its verdicts
    contexts = sorted((int(x) for x in args.contexts.split(",")), key=lambda t: t != TARGET_CONTEXT)
    for T in contexts:
        for B in (int(x) for x in args.batches.split(",")):
            base_row = {"context": T, "batch": B}
            kv_bytes = 2 * B * HKV * T * D * 2
            if over():
                doc["rows"] += [{**base_row, "scheme": n, "skipped": "budget"} for n in names]
                save(doc, args.out)
                continue
            if kv_bytes + MEMORY_MARGIN > free_bytes():
                note = f"the bf16 cache needs {kv_bytes >> 20} MiB, {free_bytes() >> 20} MiB free"
                doc["rows"] += [{**base_row, "scheme": n, "skipped": note} for n in names]
                save(doc, args.out)
                continue
            g = torch.Generator(device=DEVICE).manual_seed(T + B)
            k = torch.randn(B, HKV, T, D, device=DEVICE, generator=g, dtype=BF16)
            v = torch.randn(B, HKV, T, D, device=DEVICE, generator=g, dtype=BF16)
            q = torch.randn(B, HQ, D, device=DEVICE, generator=g, dtype=BF16)
            cands = baselines(q, k, v, scale)
            timed_ok = {n: c for n, c in cands.items() if "eager_us" in c}
            if not timed_ok:
                doc.setdefault("baselines", {})[f"T={T} B={B}"] = cands
                doc["rows"] += [{**base_row, "scheme": n, "skipped": "no baseline ran"} for n in names]
                save(doc, args.out)
                continue
            doc.setdefault("baselines", {})[f"T={T} B={B}"] = cands
            base_name = min(timed_ok, key=lambda n: best_us(timed_ok[n]))
            base = timed_ok[base_name]
            ref = reference(q, k, v, scale)
            for name in names:
                row: dict[str, Any] = {**base_row, "scheme": name}
                if over():
                    row["skipped"] = "budget"
                    doc["rows"].append(row)
                    continue
                try:
                    row.update(quantrt_cell(name, k, v, q, args.block_size, args.sweep))
                except torch.cuda.OutOfMemoryError as e:
                    torch.cuda.empty_cache()
                    row["skipped"] = f"out of memory: {str(e)[:120]}"
                torch.cuda.empty_cache()  # the cell's pages are gone
                out = row.pop("out", None)
                if "eager_us" in row:
                    row["time_us"] = best_us(row)
                    row["baseline"] = base_name
                    row["baseline_us"] = best_us(base)
                    both_graph = row.get("graph_us") is not None and base.get("graph_us") is not None
                    row["speedup_on"] = "graph" if both_graph else "eager"
                    row["speedup"] = round(
                        (base["graph_us"] / row["graph_us"])
                        if both_graph
                        else (base["eager_us"] / row["eager_us"]),
                        3,
                    )
                    if ref is not None and out is not None:
                        row["rel_vs_bf16"] = round(rel(out.float(), ref), 5)
                doc["rows"].append(row)
                save(doc, args.out)
            del k, v, q, ref
            torch.cuda.empty_cache()
    doc["elapsed_s"] = round(time.monotonic() - T_START, 1)
    doc["targets"] = targets(doc["rows"])
    save(doc, args.out)
    return doc


def targets(rows: list[dict]) -> list[dict]:
    """fp8 >= 1.6x and 4-bit TurboQuant >= 2.5x the baseline at 32k, per batch."""
    out = []
    for r in rows:
        want = TARGETS.get(r["scheme"])
        if want is None or r["context"] != TARGET_CONTEXT:
            continue
        cell = f"T={r['context']} B={r['batch']} {r['scheme']}"
        if "speedup" not in r:
            out.append({"cell": cell, "target": f">= {want}x baseline", "value": None, "ok": False,
                        "note": r.get("skipped", "not measured")})  # fmt: skip
            continue
        out.append({"cell": cell, "target": f">= {want}x {r['baseline']}", "value": r["speedup"],
                    "ok": r["speedup"] >= want})  # fmt: skip
    return out


def table(doc: dict) -> str:
    lines = [
        f"{doc['device']}  torch {doc['versions']['torch']}  triton {doc['versions']['triton']}  git {doc['git']}",
        f"{'T':>6} {'B':>3} {'scheme':14} {'B/tok':>6} {'quantrt':>9} {'q graph':>9} {'baseline':>9} "
        f"{'which':24} {'speedup':>8} {'err':>8}",
    ]
    f = lambda x: f"{x:9.1f}" if isinstance(x, (int, float)) else f"{'-':>9}"  # noqa: E731
    for r in doc["rows"]:
        head = f"{r['context']:>6} {r['batch']:>3} {r['scheme']:14}"
        if "time_us" not in r:
            lines.append(f"{head} skipped ({r.get('skipped', 'not measured')})")
            continue
        lines.append(
            f"{head} {r['bytes_per_token']:>6} {f(r['eager_us'])} {f(r['graph_us'])} {f(r['baseline_us'])} "
            f"{r['baseline']:24} {r['speedup']:7.2f}x {r.get('rel_vs_bf16', float('nan')):8.1e}"
        )
    t = doc.get("targets", [])
    met = sum(x["ok"] for x in t)
    lines.append(f"targets: {met}/{len(t)} met")
    lines += [f"  {'ok  ' if x['ok'] else 'MISS'} {x['cell']}: {x['target']} (got {x['value']})" for x in t]
    lines.append(
        "times in us (median, L2 flushed); speedup = baseline / quantrt on graph replay where both have it"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no cell after this many seconds")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--block-size", type=int, default=16, help="slots per page of quantrt's cache")
    ap.add_argument(
        "--programs-per-sm", type=int, default=None, help="override the decode split rule's programs per SM"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also time every launch shape of sweep_configs per cell (row['sweep'])",
    )
    ap.add_argument(
        "--flush",
        choices=FLUSH_MODES,
        default="write",
        help="L2 flush between timed runs: write (triton's, leaves dirty lines) or read (leaves it clean)",
    )
    args = ap.parse_args()
    if args.programs_per_sm is not None:  # a launch-shape experiment: the split rule reads it per call
        import quantrt.backends.triton.kv as tkv

        tkv.PROGRAMS_PER_SM = args.programs_per_sm
    if not torch.cuda.is_available():
        print("bench/gpu_kv.py needs a CUDA GPU", file=sys.stderr)
        return 2
    with l2_flush(args.flush):
        print(table(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
