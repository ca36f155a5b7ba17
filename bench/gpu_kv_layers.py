"""Decode attention timed per layer of a many-layer decode step: each side's calls over L distinct
caches (one per layer) captured back to back in one CUDA graph, the replay's median over L.

    python3 bench/gpu_kv_layers.py --out FILE.json [--contexts 32768,8192,1024] [--batches 1,16,64]
        [--schemes kv-fp8,kv-tq-4bit-nc] [--chain-mb 512] [--flush read] [--cuda-source TAG=FILE]

Why beside ``bench/gpu_kv.py``: that bench times one call after an L2 flush, so every cell carries
the replay's own start (graph launch, the events; what ``floor_us`` below measures: a graph of one
tiny kernel), which at batch 1 is a large part of a short kernel's time and the same for both
sides, pulling every ratio towards 1. In a model the attention of layer i is followed by layer
i + 1's, with the weight GEMMs between them evicting the L2; here layer i + 1's cache is another
allocation, and L is chosen per side so that the L caches together exceed ``--chain-mb`` (and so
the L2, 50 MB on the H100) many times over: the cache a call reads was last touched L - 1 layers
earlier, by then evicted. The L2 is still flushed between replays (``--flush``).

Sides, Llama-3-8B heads (Hq 32, Hkv 8, D 128), bf16: the baseline, SDPA (``enable_gqa``) over a
contiguous bf16 cache [B, Hkv, T, D] per layer (the faster of its default and flash backends);
each quantrt scheme through ``quantrt.kv.decode_attention`` on pages of 16 slots (the dispatcher's
kernels, ``cuda.mma`` for 4-bit TurboQuant); ``<scheme>@triton``: the same pages through the
portable Triton kernels (where the chosen kernels have them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_kv as g

from quantrt.bench import FLUSH_MODES, graph_replay_us, l2_flush

WARMUP_MS, REP_MS = 10, 60
MAX_LAYERS = 256
#: the kernel objects behind the last quantrt_calls (their compiled launches are dropped to swap sources)
QUANTRT_KERNELS: list[Any] = []
TQ_SOURCE = "kv_tq_decode.cu"
_OWN_SOURCE: Callable[[str], str] | None = None


def swapped_source(path: str | None) -> None:
    """Compile the CUDA TurboQuant decode from ``path`` (None: the package's own) on its next call:
    an A/B of two versions of the kernel on the same caches in one process."""
    from quantrt.backends.cuda import cupy_kernels as ck

    global _OWN_SOURCE
    if _OWN_SOURCE is None:
        _OWN_SOURCE = ck.source
    own = _OWN_SOURCE
    text = Path(path).read_text() if path else None
    ck.source = own if text is None else (lambda n: text if n == TQ_SOURCE else own(n))
    ck._functions.clear()
    for kern in QUANTRT_KERNELS:
        getattr(kern, "_launch", {}).clear()


def layers_for(bytes_per_layer: int, chain_bytes: int) -> int:
    """Layers whose caches together reach ``chain_bytes`` (at least 2, at most MAX_LAYERS)."""
    return max(2, min(MAX_LAYERS, -(-chain_bytes // max(1, bytes_per_layer))))


def chain_us(calls: list[Callable[[], Any]]) -> float:
    """Per-call median of the calls captured in one graph, one after another."""

    def run() -> None:
        for c in calls:
            c()

    total, err = graph_replay_us(run, WARMUP_MS, REP_MS)
    if total is None:
        raise RuntimeError(f"the chain of {len(calls)} calls could not be replayed: {err}")
    return total / len(calls)


def floor_us() -> float:
    """One replay of a graph holding one tiny kernel, timed as every cell: the per-replay start."""
    x = torch.zeros(16, device="cuda")
    return chain_us([lambda: x.add_(1.0)])


def sdpa_calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layers: int, flash: bool) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B = q.shape[0]
    q4 = q.view(B, g.HQ, 1, g.D)
    caches = [(k.clone(), v.clone()) for _ in range(layers)]

    def call(kc: torch.Tensor, vc: torch.Tensor) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            if flash:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q4, kc, vc, scale=g.SCALE, enable_gqa=True)
            return F.scaled_dot_product_attention(q4, kc, vc, scale=g.SCALE, enable_gqa=True)

        return run

    return [call(kc, vc) for kc, vc in caches]


def quantrt_calls(
    scheme: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layers: int, portable: bool
):
    T = k.shape[2]
    calls, kernels = [], None
    QUANTRT_KERNELS.clear()
    for _ in range(layers):
        pages, table, lens, row = g.build_pages(scheme, k, v, 16)
        if pages is None:
            return None, row.get("skipped", "did not fit")
        kernels = pages.kernels.name
        QUANTRT_KERNELS.append(pages.kernels)
        if portable:
            kern = getattr(pages.kernels, "portable", pages.kernels)
            kernels = kern.name
            calls.append(lambda p=pages, t=table, n=lens, kk=kern: kk.decode(q, p, t, n, T, scale=g.SCALE))
        else:
            calls.append(lambda p=pages, t=table, n=lens: g.decode_fn(q, p, t, n, T))
    return calls, kernels


def cell(
    T: int, B: int, schemes: list[str], chain_bytes: int, sources: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    from quantrt.kv import bytes_per_token
    from quantrt.schemes import parse_kv_scheme

    gen = torch.Generator(device="cuda").manual_seed(T + B)
    k = torch.randn(B, g.HKV, T, g.D, device="cuda", generator=gen, dtype=g.BF16)
    v = torch.randn_like(k)
    q = torch.randn(B, g.HQ, g.D, device="cuda", generator=gen, dtype=g.BF16)
    rows = []
    bf16_bytes = 2 * k.numel() * 2
    L = layers_for(bf16_bytes, chain_bytes)
    if (L + 1) * bf16_bytes + g.MEMORY_MARGIN > g.free_bytes():
        L = max(1, (g.free_bytes() - g.MEMORY_MARGIN) // bf16_bytes - 1)
    best = None
    for flash in (False, True):
        name = "sdpa_gqa_flash" if flash else "sdpa_gqa"
        try:
            us = chain_us(sdpa_calls(q, k, v, L, flash))
            rows.append({"context": T, "batch": B, "side": name, "layers": L, "us_per_layer": round(us, 2)})
            best = us if best is None else min(best, us)
        except Exception as e:  # a backend this torch lacks
            rows.append(
                {"context": T, "batch": B, "side": name, "error": f"{type(e).__name__}: {str(e)[:160]}"}
            )
        torch.cuda.empty_cache()
    for scheme in schemes:
        portable = scheme.endswith("@triton")
        name = scheme.removesuffix("@triton")
        per = B * T * bytes_per_token(parse_kv_scheme(name), g.HKV, g.D)
        Lq = layers_for(per, chain_bytes)
        calls, kernels = quantrt_calls(name, q, k, v, Lq, portable)
        row: dict[str, Any] = {"context": T, "batch": B, "side": scheme, "layers": Lq}
        if calls is None:
            row["skipped"] = kernels
        else:
            us = chain_us(calls)
            row.update(kernels=kernels, us_per_layer=round(us, 2))
            if best is not None:
                row["speedup_vs_sdpa"] = round(best / us, 3)
            if kernels == "cuda.mma" and sources:
                for tag, path in sources.items():
                    swapped_source(path)
                    other = chain_us(calls)
                    row[f"us_per_layer@{tag}"] = round(other, 2)
                    if best is not None:
                        row[f"speedup_vs_sdpa@{tag}"] = round(best / other, 3)
                swapped_source(None)
        rows.append(row)
        del calls
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="32768,8192,1024")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--schemes", default="kv-fp8,kv-tq-4bit-nc,kv-tq-4bit-nc@triton")
    ap.add_argument("--chain-mb", type=int, default=512, help="each side's caches together reach this")
    ap.add_argument("--flush", choices=FLUSH_MODES, default="read")
    ap.add_argument(
        "--git-note", default="", help="recorded as is (the device's checkout may not know its tree)"
    )
    ap.add_argument(
        "--cuda-source",
        action="append",
        default=[],
        metavar="TAG=FILE",
        help="also time the cuda.mma rows with kernels/kv_tq_decode.cu compiled from FILE (same caches, "
        "same process), as us_per_layer@TAG; e.g. an earlier version from git show",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_kv_layers.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = g.header()
    doc["what"] = "decode attention per layer of a back-to-back chain of layers, each with its own cache"
    doc.update(git_note=args.git_note, chain_mb=args.chain_mb, flush=args.flush)
    doc["timing"] = (
        f"CUDA graph of L calls over L caches, triton do_bench median of the replay / L, warmup {WARMUP_MS} ms, "
        f"rep {REP_MS} ms, L2 flushed ({args.flush}) between replays"
    )
    schemes = args.schemes.split(",")
    sources = dict(x.split("=", 1) for x in args.cuda_source)
    doc["cuda_sources"] = sources
    with l2_flush(args.flush):
        doc["floor_us"] = round(floor_us(), 2)
        print(f"floor (one tiny kernel per replay): {doc['floor_us']} us", flush=True)
        for T in (int(x) for x in args.contexts.split(",")):
            for B in (int(x) for x in args.batches.split(",")):
                if 2 * B * g.HKV * T * g.D * 2 * 3 + g.MEMORY_MARGIN > g.free_bytes():
                    doc["rows"].append({"context": T, "batch": B, "skipped": "the bf16 cache does not fit"})
                    continue
                for r in cell(T, B, schemes, args.chain_mb << 20, sources):
                    doc["rows"].append(r)
                    print(json.dumps(r), flush=True)
                Path(args.out).write_text(json.dumps(doc, indent=1))
                torch.cuda.empty_cache()
    doc["elapsed_s"] = round(time.monotonic() - g.T_START, 1)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
