"""The streaming floor under this project's timing: how fast can a kernel that only reads a
layer's stored weight bytes run, timed exactly as ``quantrt bench`` times a layer, and what ratio
to cuBLAS bf16 does that allow?

    python3 bench/gpu_floor.py --out FILE.json [--shapes 8192x57344,...] [--formats nvfp4,...]

For each shape (K x N) and weight format, one Triton kernel reads the format's bytes per weight
(codes plus scales, as stored) once, in 16-byte pieces, and writes one word per program: nothing
a quantized GEMV could skip. It is timed with ``quantrt.bench.median_us`` (triton's ``do_bench``:
the L2 is flushed by *writing* 256 MB before every call, so a call starts with the L2 full of dirty
lines it must write back) and under CUDA-graph replay (no flush), beside cuBLAS bf16 at M=1 the
same two ways. Also timed: the same read after an L2 flush that *reads* 256 MB (clean lines), to
show what the dirty write-back costs. ``ceiling`` = cuBLAS time / read time: no kernel for that
format reaches a higher ratio on that shape in the benchmark.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from quantrt.bench import copy_bandwidth_tbps, median_us, run_header

# stored bits per weight, codes plus scales, as the kernels read them
BITS = {
    "nvfp4": 4 + 8 / 16,  # e2m1 + one e4m3 byte per 16
    "mxfp4": 4 + 8 / 32,  # e2m1 + one e8m0 byte per 32
    "nf4-g64": 4 + 16 / 64,  # codes + one 16-bit absmax per 64 (double quant resolved at load)
    "q4_k": 144 * 8 / 256,
    "q6_k": 210 * 8 / 256,
    "q8_0": 34 * 8 / 32,
    "int4-g128": 4 + 32 / 128,  # codes + (zero, scale) pair per 128
    "bf16": 16,
}


@triton.jit
def _read(src, out, n16, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Program p reads pieces [p * ITERS * BLOCK, ...) of 16 bytes (4 int32 each) and xors them."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, 4], dtype=tl.int32)
    for i in range(ITERS):
        piece = (pid * ITERS + i) * BLOCK + lanes
        offs = piece[:, None] * 4 + tl.arange(0, 4)[None, :]
        acc ^= tl.load(src + offs, mask=(piece < n16)[:, None], other=0, cache_modifier=".cg")
    tl.store(out + pid, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


def reader(nbytes: int, block: int = 256, iters: int = 8):
    n16 = (nbytes + 15) // 16
    src = torch.randint(-(2**31), 2**31 - 1, (n16 * 4,), dtype=torch.int32, device="cuda")
    grid = triton.cdiv(n16, block * iters)
    out = torch.empty(grid, dtype=torch.int32, device="cuda")
    return lambda: _read[(grid,)](src, out, n16, BLOCK=block, ITERS=iters, num_warps=4)


def clean_flush_us(fn, reps: int = 60) -> float:
    """Median time of fn after an L2 flush that reads 256 MB (leaves clean lines)."""
    buf = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        buf.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x57344,28672x8192,4096x28672")
    ap.add_argument("--formats", default=",".join(BITS))
    ap.add_argument(
        "--configs", default="256x8,512x4,128x16", help="BLOCKxITERS of the read kernel; the best is kept"
    )
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    copy = copy_bandwidth_tbps()
    doc = {
        **run_header(
            "read-only streaming floor vs cuBLAS bf16 at M=1 (bench/gpu_floor.py)", "bench/gpu_floor.py", args
        ),
        "copy_TBps": round(copy, 3),
        "empty_launch_us": round(median_us(lambda: torch.empty(0, device="cuda").add_(1)), 2),
        "rows": [],
    }
    for K, N in shapes:
        dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        cub = median_us(lambda x=x, w=dense: F.linear(x, w))
        cub_g = median_us(lambda x=x, w=dense: F.linear(x, w), graph=True)
        dense = None
        for fmt in args.formats.split(","):
            nbytes = int(K * N * BITS[fmt] / 8)
            best = None
            for block, iters in configs:
                fn = reader(nbytes, block, iters)
                fn()
                t = median_us(fn)
                if best is None or t < best[0]:
                    best = (t, block, iters, fn)
            t, block, iters, fn = best
            tg = median_us(fn, graph=True)
            tc = clean_flush_us(fn)
            row = {
                "K": K,
                "N": N,
                "format": fmt,
                "bytes": nbytes,
                "read": f"{block}x{iters}",
                "read_us": round(t, 2),
                "read_graph_us": round(tg, 2),
                "read_clean_flush_us": round(tc, 2),
                "read_TBps": round(nbytes / t / 1e6, 3),
                "pct_copy": round(100 * nbytes / t / 1e6 / copy, 1),
                "pct_copy_clean_flush": round(100 * nbytes / tc / 1e6 / copy, 1),
                "cublas_bf16_us": round(cub, 2),
                "cublas_bf16_graph_us": round(cub_g, 2),
                "ceiling": round(cub / t, 3),
                "ceiling_graph": round(cub_g / tg, 3),
            }
            doc["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
    print(
        f"{'K x N':>12} {'format':>10} {'read us':>8} {'%copy':>6} {'clean%':>6} {'cuBLAS':>7} {'ceil':>5} {'ceil_g':>6}"
    )
    for r in doc["rows"]:
        print(
            f"{r['K']:>5}x{r['N']:<6} {r['format']:>10} {r['read_us']:8.1f} {r['pct_copy']:6.1f} "
            f"{r['pct_copy_clean_flush']:6.1f} {r['cublas_bf16_us']:7.1f} {r['ceiling']:5.2f} {r['ceiling_graph']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
