"""The AMX kernels' large-batch path (dequantize row slices to bf16, then torch's oneDNN matmul)
against the native path of the same prepared weight, on this CPU.

On a CPU without AMX, oneDNN runs the matmul on AVX-512 BF16, so this measures the dequantization
cost and the cross-over the AMX path must beat; on a Sapphire Rapids machine the same script gives
the real cross-over (``cpu.amx_*``'s ``AMX_FROM_M`` is set from it). Both paths run interleaved in
one process; medians in ms.

    python bench/cpu_amx_path.py [--threads 2] [--repeats 7] [--m 16,64,256] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import statistics
import subprocess
import time

import torch

from quantrt import reference
from quantrt.backends.cpu import amx
from quantrt.specs import LayerSpec

SCHEMES = (("w4a16-int-g128-sym", amx.AmxWint), ("w4a16-nf4-g64", amx.AmxLut), ("gguf-q4_k", amx.AmxGGUF))


def median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shape", default="4096x4096", help="KxN")
    ap.add_argument("--m", default="16,64,256")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    K, N = (int(v) for v in args.shape.split("x"))
    rows = []
    for scheme, cls in SCHEMES:
        canon = reference.quantize(torch.randn(N, K) * 0.02, scheme)
        kernel = cls()
        state = kernel.prepare(canon, LayerSpec(canon.scheme, K, N, act_dtype=torch.bfloat16))
        native = dataclasses.replace(state, amx_from=1 << 30)
        via_amx = dataclasses.replace(state, amx_from=1)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, K).bfloat16()
            a = median_ms(lambda: kernel.apply(via_amx, x), args.repeats)  # noqa: B023
            n = median_ms(lambda: kernel.apply(native, x), args.repeats)  # noqa: B023
            rows.append({"scheme": scheme, "K": K, "N": N, "M": m, "amx_path_ms": round(a, 2),
                         "native_ms": round(n, 2), "native_strategy": kernel.strategy(native, m)})  # fmt: skip
            print(f"{scheme} M={m}: dequant+oneDNN {a:.1f} ms, native {n:.1f} ms")
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "date": datetime.date.today().isoformat(),
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "git_sha": sha,
        "torch": torch.__version__,
        "command": "python bench/cpu_amx_path.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
