"""One llama layer's seven linears at M=1 (decode) through cpu.native_gguf, next to llama.cpp.

Shapes are Llama-3-8B's (hidden 4096, ffn 14336, 32 query / 8 kv heads; 218M linear parameters). The
weights are random blocks with finite f16 scales (speed does not depend on the values), built through
``QuantLinear.from_canonical`` so the timed call is the layer's own ``__call__``: activation
quantization, the ctypes call and the output allocation included. Q4_K_M is llama.cpp's mix for a
"more bits" layer: v and down in Q6_K, the rest Q4_K.

llama.cpp's figures (ms per token, one layer, 2 threads, same machine) were measured by the issue's
author and include a few percent of non-linear work (norms, rope, attention over a short context).

The types are timed token by token in turn (not one after the other), so load from other processes on
a shared machine hits them alike; the share of the CPUs other processes used meanwhile is printed.

Run: ``python bench/cpu_gguf_layer.py [--threads 2] [--repeats 30] [--types q4_0,q8_0,q4_k_m,q6_k]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.layers import QuantLinear
from quantrt.reference.gguf import F16_FIELDS
from quantrt.schemes import GGUF_TYPES, parse_scheme

#: name -> (N, K)
LINEARS = {
    "q": (4096, 4096),
    "k": (1024, 4096),
    "v": (1024, 4096),
    "o": (4096, 4096),
    "gate": (14336, 4096),
    "up": (14336, 4096),
    "down": (4096, 14336),
}
LLAMA_CPP_MS = {"q8_0": 15.5, "q4_0": 8.6, "q4_k_m": 10.4, "q6_k": 9.1}


def mix(name: str) -> dict[str, str]:
    """The GGUF type of each linear for a file type name (llama.cpp's Q4_K_M: v and down in Q6_K)."""
    if name == "q4_k_m":
        return {lin: "q6_k" if lin in ("v", "down") else "q4_k" for lin in LINEARS}
    return dict.fromkeys(LINEARS, name)


def random_blocks(gtype: str, N: int, K: int, gen: torch.Generator) -> CanonicalWeight:
    """Random code bytes with every f16 field set to a small finite scale."""
    B, T, _ = GGUF_TYPES[gtype]
    q = torch.randint(0, 256, (N, K // B, T), dtype=torch.uint8, generator=gen)
    scale = torch.tensor([1e-3], dtype=torch.float16).view(torch.uint8)
    for off in F16_FIELDS[gtype]:
        q[..., off : off + 2] = scale
    return CanonicalWeight(parse_scheme(f"gguf-{gtype}"), N, K, {"qweight": q.reshape(N, -1)})


def token_ms(
    layers: dict[str, QuantLinear], xs: dict[str, torch.Tensor], per: dict[str, list[float]]
) -> float:
    """One token: the seven calls back to back; returns ms and appends each call's ms to ``per``."""
    total = 0.0
    for n, lin in layers.items():
        t0 = time.perf_counter()
        lin(xs[n])
        dt = 1e3 * (time.perf_counter() - t0)
        per[n].append(dt)
        total += dt
    return total


def busy_seconds() -> float:
    """CPU seconds all processes have spent busy (from /proc/stat; 0 where it does not exist)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--types", default="q8_0,q4_0,q4_k_m,q6_k")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    names = args.types.split(",")
    models = {}
    for name in names:
        types = mix(name)
        models[name] = {
            lin: QuantLinear.from_canonical(
                random_blocks(types[lin], N, K, gen), device="cpu", act_dtype=torch.bfloat16
            )
            for lin, (N, K) in LINEARS.items()
        }
    xs = {lin: torch.randn(1, K, dtype=torch.bfloat16, generator=gen) for lin, (_, K) in LINEARS.items()}
    totals: dict[str, list[float]] = {name: [] for name in names}
    per = {name: {lin: [] for lin in LINEARS} for name in names}
    busy0, own0, wall0 = busy_seconds(), sum(os.times()[:2]), time.perf_counter()
    for rep in range(args.repeats + 3):  # types interleaved, so load from elsewhere hits them alike
        for name in names:
            ms = token_ms(models[name], xs, per[name])
            if rep >= 3:  # the first tokens warm pages, caches and the OpenMP threads
                totals[name].append(ms)
    others = busy_seconds() - busy0 - (sum(os.times()[:2]) - own0)
    share = max(0.0, others) / ((os.cpu_count() or 1) * (time.perf_counter() - wall0))
    print(
        f"threads={torch.get_num_threads()} tokens={args.repeats} per type, medians; other processes "
        f"used {100 * share:.0f}% of the {os.cpu_count()} CPUs meanwhile"
    )
    for name in names:
        layers = models[name]
        ms = statistics.median(totals[name])
        nbytes = sum(lin._state.layout.weight.numel() for lin in layers.values())
        ref = LLAMA_CPP_MS.get(name)
        vs = f"  llama.cpp {ref:5.1f} ms ({ref / ms:4.2f}x)" if ref else ""
        kernels = ", ".join(sorted({lin.kernel_name for lin in layers.values()}))
        print(f"{name:7s} {ms:6.2f} ms/token  {nbytes / ms / 1e6:5.1f} GB/s{vs}  [{kernels}]")
        print("        " + "  ".join(f"{n} {statistics.median(v[3:]):.3f}" for n, v in per[name].items()))


if __name__ == "__main__":
    main()
