"""The AVX2 builds beside the AVX-512 ones on this CPU: one linear layer at M=1 (or ``--ms``), weights
from DRAM.

Each scheme and shape is planned twice, as this CPU is (the AVX-512 kernels) and held to AVX2 with
``QUANTRT_CPU_ISA=avx2``'s override (cpu.avx2_wint, cpu.native_gguf's x86-64-v3 build). Every
variant holds ``--copies`` weights of the layer (more bytes than the L3 cache) and calls them in
turn, so each call streams its weight from DRAM; the variants alternate call by call (cpu_timing's
round robin), so load from other work hits them alike. Reported per variant: the median ms, the
weight bytes read per second (the checkpoint's tensors: codes, scales, zeros) and the AVX2 build's
share of the AVX-512 build's bandwidth.

Run: ``python bench/cpu_isa.py [--schemes ...] [--shapes 4096x14336,14336x4096] [--threads 2]
--out bench/results/cpu-<date>-isa.json`` (shapes are KxN, as ``quantrt bench``).

``--gguf-builds A,B`` times two builds of the gguf library instead (names of ``build.ISA_CFLAGS``, e.g.
``avx2,avx2_vnni_twin``: the AVX2 build against its VPDPBUSD twin), each layout called through
``gguf_native.linear`` alike, interleaved as above; gguf schemes only. The two builds' outputs are
checked bit for bit first; reported: each build's ms and GB/s and B's speedup over A.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from cpu_timing import median_ms

from quantrt import reference
from quantrt.backends.cpu import gguf_native
from quantrt.canonical import CanonicalWeight
from quantrt.capability import probe
from quantrt.env import Overrides
from quantrt.layers import QuantLinear
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

VARIANTS = {"avx512": Overrides(), "avx2": Overrides(cpu_isa="avx2")}


def weight(scheme: str, N: int, K: int, seed: int) -> CanonicalWeight:
    s = parse_scheme(scheme)
    if s.weight == "gguf":
        q = random_blocks(s.gguf_type or "", N, K, seed)
        return CanonicalWeight(s, N, K, {"qweight": q})
    g = torch.Generator().manual_seed(seed)
    return reference.quantize(torch.randn(N, K, generator=g) * 0.02, scheme)


def stored_bytes(w: CanonicalWeight) -> int:
    return sum(t.numel() * t.element_size() for t in w.tensors.values())


def run(scheme: str, K: int, N: int, M: int, copies: int, repeats: int) -> dict:
    weights = [weight(scheme, N, K, seed) for seed in range(copies)]
    x = torch.randn(M, K).bfloat16()
    fns, kernels = {}, {}
    for name, ov in VARIANTS.items():
        layers = [
            QuantLinear.from_canonical(w, device="cpu", act_dtype=torch.bfloat16, overrides=ov)
            for w in weights
        ]
        kernels[name] = layers[0].kernel_name
        turn = [0]

        def call(layers: list = layers, turn: list = turn) -> None:
            layers[turn[0] % len(layers)](x)
            turn[0] += 1

        fns[name] = call
    ms = median_ms(fns, repeats, warmups=copies)
    nbytes = stored_bytes(weights[0])
    row = {"scheme": scheme, "K": K, "N": N, "M": M, "weight_bytes": nbytes, "copies": copies}
    for name in VARIANTS:
        row[name] = {
            "kernel": kernels[name],
            "ms": round(ms[name], 4),
            "GB/s": round(nbytes / ms[name] / 1e6, 2),
        }
    row["avx2_share"] = round(row["avx2"]["GB/s"] / row["avx512"]["GB/s"], 3)
    return row


def run_builds(scheme: str, K: int, N: int, M: int, copies: int, repeats: int, builds: list[str]) -> dict:
    """One gguf layer under two builds of the library (``--gguf-builds``), interleaved call by call."""
    s = parse_scheme(scheme)
    if s.weight != "gguf":
        raise SystemExit(f"--gguf-builds times gguf schemes only, not {scheme}")
    weights = [weight(scheme, N, K, seed) for seed in range(copies)]
    x = torch.randn(M, K).bfloat16()
    spec = LayerSpec(s, K, N, act_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    fns, paths, outs = {}, {}, {}
    for isa in builds:
        layouts = [gguf_native.prepare_layout(w, spec, isa) for w in weights]
        ws = torch.empty(M * layouts[0].ws_row, dtype=torch.uint8)
        out = torch.empty(M, N, dtype=torch.bfloat16)
        paths[isa] = "16-row groups" if layouts[0].groups else "canonical rows"
        outs[isa] = gguf_native.linear(layouts[0], x, None, None, ws)
        turn = [0]

        def call(
            layouts: list = layouts, ws: torch.Tensor = ws, out: torch.Tensor = out, turn: list = turn
        ) -> None:
            gguf_native.linear(layouts[turn[0] % len(layouts)], x, None, out, ws)
            turn[0] += 1

        fns[isa] = call
    a, b = builds
    if not torch.equal(outs[a].view(torch.int16), outs[b].view(torch.int16)):
        raise SystemExit(f"{scheme}: the {a} and {b} builds' outputs differ")
    ms = median_ms(fns, repeats, warmups=copies)
    nbytes = stored_bytes(weights[0])
    row = {"scheme": scheme, "K": K, "N": N, "M": M, "weight_bytes": nbytes, "copies": copies}
    for isa in builds:
        row[isa] = {"path": paths[isa], "ms": round(ms[isa], 4), "GB/s": round(nbytes / ms[isa] / 1e6, 2)}
    row["speedup"] = round(ms[a] / ms[b], 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--schemes", default="w4a16-int-g128-sym,gguf-q4_k,gguf-q4_0,gguf-q6_k,gguf-q8_0,w8a16-int-ch-sym"
    )
    ap.add_argument("--shapes", default="4096x14336,14336x4096", help="KxN, comma-separated")
    ap.add_argument("--ms", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", type=int, default=4, help="weights per variant, called in turn (beyond L3)")
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument(
        "--gguf-builds", help="A,B: time two builds of the gguf library (e.g. avx2,avx2_vnni_twin) instead"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    builds = args.gguf_builds.split(",") if args.gguf_builds else None
    if builds is not None and len(builds) != 2:
        raise SystemExit("--gguf-builds takes two build names, A,B")
    rows = []
    for scheme in args.schemes.split(","):
        for shape in args.shapes.split(","):
            for M in (int(m) for m in args.ms.split(",")):
                K, N = (int(v) for v in shape.split("x"))
                if builds is not None:
                    row = run_builds(scheme, K, N, M, args.copies, args.repeats, builds)
                    rows.append(row)
                    a, b = row[builds[0]], row[builds[1]]
                    print(
                        f"{scheme:22s} {K}x{N} M={M}: {builds[0]} {a['ms']:.3f} ms {a['GB/s']:.1f} GB/s | "
                        f"{builds[1]} {b['ms']:.3f} ms {b['GB/s']:.1f} GB/s | speedup {row['speedup']:.3f} "
                        f"({a['path']})",
                        flush=True,
                    )
                    continue
                row = run(scheme, K, N, M, args.copies, args.repeats)
                rows.append(row)
                a, b = row["avx512"], row["avx2"]
                print(
                    f"{scheme:22s} {K}x{N} M={M}: avx512 {a['kernel']} {a['ms']:.3f} ms {a['GB/s']:.1f} GB/s | "
                    f"avx2 {b['kernel']} {b['ms']:.3f} ms {b['GB/s']:.1f} GB/s | share {row['avx2_share']:.2f}",
                    flush=True,
                )
    if args.out:
        tree = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout
        tree += "+uncommitted" if dirty.strip() else ""
        doc = {
            "date": datetime.date.today().isoformat(),
            "device": f"cpu {probe().cpu.name} ({probe().cpu.microarch}), {args.threads} threads",
            "tree": tree,
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "threads": args.threads,
            **({"builds": builds} if builds else {}),
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
