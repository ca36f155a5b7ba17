"""Sweep the Triton W8A8 / fp8 weight-only tile configurations per M bucket on this GPU (run on
the GPU machine) and write tunings/w8a8_<arch>.json.

    python3 ci/tune_w8a8.py --out $OUT/w8a8_sm_90.json [--sections fp8_rowwise,int8] [--budget 15]

For each section (the kernel of backends/cuda/triton_w8a8.py it configures) and bucket, times a
random subset of tile configurations on the benchmark's large shapes with inputs quantized
beforehand (the activation pass is the same for every tile), medians with the L2 flushed, and
keeps the best geometric mean. For fp8_rowwise it also times cuBLASLt's row-wise _scaled_mm and
sets ``scaled_mm_from_m`` to the first bucket where that is faster. Triton compiles each new
configuration once (about a second): the budget bounds the run. Sections not swept keep the
values of the file given by --base (the committed table).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.fp8_mm import fp8_block_matmul, fp8_rowwise_matmul
from quantrt.backends.triton.fp8_weight_only import fp8_weight_only_matmul
from quantrt.backends.triton.int8_mm import int8_matmul
from quantrt.backends.triton.tile_table import tile_configs
from quantrt.bench import median_us

SHAPES = ((8192, 57344), (28672, 8192), (4096, 28672))
BUCKETS = {"1": 1, "16": 16, "64": 64, "256": 256, "large": 4096}  # bucket -> the M timed
LOWEST = {"1": 1, "16": 2, "64": 17, "256": 65, "large": 257}  # bucket -> its smallest M
SECTIONS = ("fp8_rowwise", "fp8_block", "fp8_weight_only", "int8")
BASE = Path(__file__).resolve().parents[1] / "backends" / "cuda" / "tunings" / "w8a8_default.json"


def candidates(section: str, m: int) -> list[dict[str, int]]:
    bms = (16,) if m <= 16 else ((16, 32, 64) if m <= 64 else (64, 128))
    bns = (32, 64, 128) if m <= 256 else (64, 128, 256)
    bks = (128,) if section == "fp8_block" else ((64, 128) if section == "fp8_weight_only" else (128, 256))
    out = []
    for bm, bn, bk, warps, stages in itertools.product(bms, bns, bks, (4, 8), (3, 4, 5)):
        if bm * bn > 128 * 256 or (bm * bn <= 16 * 64 and warps == 8) or (bm * bn > 128 * 128 and warps == 4):
            continue
        for target in (0, 132, 264, 528) if m <= 64 else (0,):
            c = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
            if target:
                c["split_k_target"] = target
            out.append(c)
    return out


def operands(section: str, K: int, N: int, dev: str) -> dict[str, torch.Tensor]:
    """Weights and scales as the kernels take them (values irrelevant to the timing, never zero)."""
    w = torch.randn(N, K, device=dev)
    if section == "int8":
        return {"w": w.mul(40).clamp(-127, 127).to(torch.int8), "ws": torch.rand(N, device=dev) + 0.5}
    ws = torch.rand(N, device=dev) + 0.5
    if section == "fp8_block":
        ws = torch.rand(-(-N // 128), -(-K // 128), device=dev) + 0.5
    return {"w": w.to(torch.float8_e4m3fn), "ws": ws}


def call(section: str, ops: dict[str, torch.Tensor], m: int, K: int, tc: TileConfig):
    dev = ops["w"].device
    if section == "fp8_weight_only":
        x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        return lambda: fp8_weight_only_matmul(x, ops["w"], ops["ws"], None, None, torch.bfloat16, tc)
    a_scale = torch.rand(m, 1, device=dev) + 0.5
    if section == "int8":
        xq = torch.randint(-127, 128, (m, K), device=dev, dtype=torch.int8)
        return lambda: int8_matmul(xq, a_scale, ops["w"], ops["ws"], None, torch.bfloat16, tc)
    xq = torch.randn(m, K, device=dev).to(torch.float8_e4m3fn)
    if section == "fp8_block":
        xs = torch.rand(m, -(-K // 128), device=dev) + 0.5
        return lambda: fp8_block_matmul(xq, xs, ops["w"], ops["ws"], (128, 128), None, torch.bfloat16, tc)
    return lambda: fp8_rowwise_matmul(xq, a_scale, ops["w"], ops["ws"], None, torch.bfloat16, tc)


def int_mm_us(K: int, N: int, m: int, ops: dict[str, torch.Tensor]) -> float:
    """The bare ``torch._int_mm`` (no scales): what the int8 kernel's scaling must not slow down
    (at least 17 rows, the op's minimum on CUDA)."""
    xq = torch.randint(-127, 128, (max(m, 17), K), device=ops["w"].device, dtype=torch.int8)
    wt = ops["w"].t()
    return median_us(lambda: torch._int_mm(xq, wt))


def scaled_mm_us(K: int, N: int, m: int, ops: dict[str, torch.Tensor]) -> float:
    xq = torch.randn(m, K, device=ops["w"].device).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(m, 1, device=xq.device), ops["ws"].reshape(1, -1)
    return median_us(lambda: torch._scaled_mm(xq, ops["w"].t(), sa, sb, out_dtype=torch.bfloat16))


def geomean(v: list[float]) -> float:
    return math.exp(sum(math.log(t) for t in v) / len(v))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--budget", type=int, default=15, help="configurations tried per section and bucket")
    ap.add_argument("--base", default=str(BASE), help="the table whose other sections are kept")
    ap.add_argument("--seconds", type=float, default=math.inf, help="stop sweeping after this long")
    args = ap.parse_args()
    deadline = time.monotonic() + args.seconds
    dev = "cuda"
    table = json.loads(Path(args.base).read_text())
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    table["_note"] = (
        f"swept by ci/tune_w8a8.py on {torch.cuda.get_device_name()} (sections {args.sections}, shapes "
        + ", ".join(f"{k}x{n}" for k, n in SHAPES)
        + "; best geometric mean per bucket, inputs quantized beforehand)"
    )
    sweep: dict[str, dict[str, float]] = {}
    gen = torch.Generator().manual_seed(0)
    for section in args.sections.split(","):
        layers = [(K, N, operands(section, K, N, dev)) for K, N in SHAPES]
        for key, m in BUCKETS.items():
            cands = candidates(section, m)
            chosen = [cands[i] for i in torch.randperm(len(cands), generator=gen)[: args.budget].tolist()]
            base = {k: v for k, v in table[section][key].items() if not k.startswith("_")}
            best = (math.inf, None)
            for cfg in [base, *(c for c in chosen if c != base)]:  # the committed tile is always timed
                if time.monotonic() > deadline:
                    print(f"{section}/{key}: out of time, kept the best so far", file=sys.stderr)
                    break
                times = []
                try:
                    for K, N, ops in layers:
                        tc = tile_configs(dict.fromkeys(BUCKETS, cfg), N, K, TileConfig)[0]  # split resolved
                        times.append(median_us(call(section, ops, m, K, tc)))
                except Exception as e:  # a configuration the compiler or the checks reject
                    print(f"{section}/{key} {cfg}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                score = geomean(times)
                sweep.setdefault(f"{section}/{key}", {})[json.dumps(cfg, sort_keys=True)] = round(score, 2)
                if score < best[0]:
                    best = (score, cfg)
                    print(f"{section}/{key}: {score:.1f} us {cfg}", file=sys.stderr, flush=True)
            if best[1] is not None:
                table[section][key] = best[1]
                table[section][f"_{key}_us"] = round(best[0], 2)
            if section == "fp8_rowwise":
                cublas = geomean([scaled_mm_us(K, N, m, ops) for K, N, ops in layers])
                table[section][f"_{key}_scaled_mm_us"] = round(cublas, 2)
            if section == "int8":
                table[section][f"_{key}_int_mm_us"] = round(
                    geomean([int_mm_us(K, N, m, ops) for K, N, ops in layers]), 2
                )
            write(args.out, table, sweep, arch)  # a run cut short keeps what it measured
        if section == "fp8_rowwise":  # cuBLASLt from the first bucket after which it always wins
            sec = table[section]
            start = 1 << 30
            for key in reversed(BUCKETS):
                if sec[f"_{key}_scaled_mm_us"] >= sec.get(f"_{key}_us", math.inf):
                    break
                start = LOWEST[key]
            sec["scaled_mm_from_m"] = start
    write(args.out, table, sweep, arch)
    return 0


def write(out: str, table: dict, sweep: dict, arch: str) -> None:
    table["arch"] = arch
    Path(out).write_text(json.dumps(table, indent=1))
    Path(out).with_suffix(".sweep.json").write_text(json.dumps(sweep, indent=1))


if __name__ == "__main__":
    sys.exit(main())
