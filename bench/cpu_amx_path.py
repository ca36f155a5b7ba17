"""The AMX kernels' paths on this CPU: the native panel GEMM with its products on AMX tiles (where
the native library has them), dequantized bf16 row slices through torch's oneDNN matmul, and the
native AVX-512 GEMV / panel GEMM, all on one prepared weight, beside dense bf16 ``F.linear``.

On a CPU without AMX, oneDNN runs the matmul on AVX-512 BF16 and there are no tiles, so this
measures the dequantization cost; on a CPU with AMX it gives the cross-overs the ``cpu.amx_*``
kernels use (``TILES_FROM_M``, ``amx_from_m``). Every path runs interleaved in one process, round
by round; medians in ms.

    python bench/cpu_amx_path.py [--threads 2] [--repeats 7] [--m 16,64,256] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import time

import torch

from quantrt import reference
from quantrt.backends.cpu import amx, gguf_native, lut_native, wint_native
from quantrt.capability import probe
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec

SCHEMES = (
    ("w4a16-int-g128-sym", amx.AmxWint),
    ("w8a16-int-ch-sym", amx.AmxWint),
    ("w4a16-nf4-g64", amx.AmxLut),
    ("w4a16-nvfp4", amx.AmxLut),
    ("w8a16-fp8-ch", amx.AmxLut),
    ("gguf-q4_k", amx.AmxGGUF),
    ("gguf-q5_k", amx.AmxGGUF),
    ("gguf-q6_k", amx.AmxGGUF),
    ("gguf-q8_0", amx.AmxGGUF),
    ("gguf-q4_0", amx.AmxGGUF),
)


#: each AMX kernel's native strategies over its layout (the AVX-512 GEMV / panel GEMM alone)
NATIVE = {
    amx.AmxWint: wint_native.wint_strategies,
    amx.AmxLut: lut_native.lut_strategies,
    amx.AmxGGUF: gguf_native.gguf_strategies,
}


def restrategize(state: Prepared, strategies: list) -> Prepared:
    """The same prepared layout with its path forced: other strategies, the same call shape."""
    return Prepared(
        state.layout, strategies, K=state.K, N=state.N, out_dtype=state.out_dtype, act_dtypes=state.act_dtypes,
        kernel=state.kernel,
    )  # fmt: skip


def interleaved_ms(fns: list, repeats: int) -> list[float]:
    """Median ms of each function, timed round by round (one call of each per round), so the
    machine's load swings reach every side alike."""
    for fn in fns:
        fn()
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            ts[i].append(time.perf_counter() - t0)
    return [statistics.median(v) * 1e3 for v in ts]


def cpu_name() -> str:
    try:
        import cpuinfo

        return str(cpuinfo.get_cpu_info().get("brand_raw", ""))
    except Exception:  # py-cpuinfo is optional here
        return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shape", default="4096x4096", help="KxN")
    ap.add_argument("--m", default="16,64,256")
    ap.add_argument("--schemes", default=",".join(s for s, _ in SCHEMES))
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    K, N = (int(v) for v in args.shape.split("x"))
    rows = []
    wanted = args.schemes.split(",")
    for scheme, cls in SCHEMES:
        if scheme not in wanted:
            continue
        canon = reference.quantize(torch.randn(N, K) * 0.02, scheme)
        dense = torch.randn(N, K).bfloat16() * 0.02  # the unquantized layer's F.linear, for scale
        kernel = cls()
        state = kernel.prepare(canon, LayerSpec(canon.scheme, K, N, act_dtype=torch.bfloat16))
        # the same prepared weight four ways: the native AVX-512 GEMV / panel GEMM, the panel GEMM on
        # AMX tiles (where the library has them), dequant + oneDNN; and dense bf16 for scale
        lay = state.layout
        avx = restrategize(state, NATIVE[cls](lay))
        via_dequant = restrategize(state, kernel.strategies(lay, tiles=False, from_m=1))
        tiles = None
        if any(s.name.startswith(("panel-gemm on AMX tiles", "amx tiles")) for s in state.strategies):
            tiles = restrategize(state, kernel.strategies(lay, tiles=True, from_m=1))  # tiles from one row
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, K).bfloat16()
            fns = [
                lambda: kernel.apply(via_dequant, x),  # noqa: B023
                lambda: kernel.apply(avx, x),  # noqa: B023
                lambda: torch.nn.functional.linear(x, dense),  # noqa: B023
            ]
            if tiles is not None:
                fns.append(lambda: kernel.apply(tiles, x))  # noqa: B023
            ts = interleaved_ms(fns, args.repeats)
            row = {"scheme": scheme, "K": K, "N": N, "M": m, "amx_path_ms": round(ts[0], 2),
                   "native_ms": round(ts[1], 2), "dense_bf16_ms": round(ts[2], 2),
                   "native_strategy": kernel.strategy(avx, m)}  # fmt: skip
            if tiles is not None:
                row["tiles_ms"] = round(ts[3], 2)
            rows.append(row)
            print(
                f"{scheme} M={m}: dequant+oneDNN {ts[0]:.2f} ms, native AVX-512 {ts[1]:.2f} ms, dense bf16 "
                f"F.linear {ts[2]:.2f} ms"
                + (f", panel GEMM on AMX tiles {ts[3]:.2f} ms" if tiles is not None else "")
            )
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_name(),
        "amx_tiles": probe().cpu.has("amx_bf16", "amx_tile"),
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
