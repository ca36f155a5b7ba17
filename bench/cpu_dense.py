"""Times the seven linears of one llama layer (q, k, v, o, gate, up, down) per token for the native
dense GEMV against torch's F.linear in bf16 and fp32, to set and check the crossover batch size.

Every method of one M runs in the same process, interleaved repeat by repeat so that noise from
other work on the machine hits them alike; the table shows medians in ms per call of all seven and
the ratio torch bf16 / method (above 1 is faster than torch bf16).

    python bench/cpu_dense.py [--threads 2] [--repeats 9] [--rounds 1] [--m 1,8,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from cpu_timing import median_ms  # bench/ is on sys.path when a script here runs

from quantrt.backends.cpu.dense_native import DenseLinear

#: (name, out_features, in_features) of llama-3-8B's layer linears
LLAMA_LINEARS = (
    ("q", 4096, 4096),
    ("k", 1024, 4096),
    ("v", 1024, 4096),
    ("o", 4096, 4096),
    ("gate", 14336, 4096),
    ("up", 14336, 4096),
    ("down", 4096, 14336),
)
#: method -> (weight dtype, activation dtype, how): "native" the GEMV forced, "auto" DenseLinear as
#: dispatched, "fallback" DenseLinear's torch path forced, "torch" plain F.linear on weights of that dtype
METHODS = {
    "native bf16": (torch.bfloat16, torch.bfloat16, "native"),
    "native bf16w fp32act": (torch.bfloat16, torch.float32, "native"),
    "native bf16w fp16act": (torch.bfloat16, torch.float16, "native"),
    "native fp16": (torch.float16, torch.float16, "native"),
    "DenseLinear bf16 (auto)": (torch.bfloat16, torch.bfloat16, "auto"),
    "DenseLinear bf16w fp32act (auto)": (torch.bfloat16, torch.float32, "auto"),
    "DenseLinear fp16 (auto)": (torch.float16, torch.float16, "auto"),
    "torch path bf16w fp32act": (torch.bfloat16, torch.float32, "fallback"),
    "torch path fp16": (torch.float16, torch.float16, "fallback"),
    "torch bf16": (torch.bfloat16, torch.bfloat16, "torch"),
    "torch fp32": (torch.float32, torch.float32, "torch"),
}


def layer_fn(method: str, weights: dict[torch.dtype, list[torch.Tensor]], M: int) -> Callable[[], object]:
    """One call of the seven linears on a batch of M rows by one method."""
    wdt, act, how = METHODS[method]
    xs = [torch.randn(M, k).to(act) for _, _, k in LLAMA_LINEARS]
    if how == "torch":
        ws = weights[wdt]
        return lambda: [F.linear(x, w) for x, w in zip(xs, ws)]
    torch_from_m = {"native": 10**9, "fallback": 0}.get(how)
    mods = [DenseLinear(w, None, act, torch_from_m=torch_from_m) for w in weights[wdt]]
    return lambda: [m(x) for m, x in zip(mods, xs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=1, help="sweeps over every M; the median over them")
    ap.add_argument("--m", default="1,8,64")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    torch.manual_seed(0)
    base = [torch.randn(n, k) * 0.02 for _, n, k in LLAMA_LINEARS]
    dtypes = {METHODS[m][0] for m in methods}
    weights = {dt: [w.to(dt) for w in base] for dt in dtypes}
    del base
    ms = [int(m) for m in args.m.split(",")]
    samples: dict[int, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for M in ms:
            fns = {name: layer_fn(name, weights, M) for name in methods}
            samples.setdefault(M, []).append(median_ms(fns, args.repeats))
    gb = sum(n * k for _, n, k in LLAMA_LINEARS) * 2 / 1e9
    rows = []
    for M, runs in samples.items():
        times = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
        ref = times.get("torch bf16")
        for name, t in times.items():
            r = {"M": M, "method": name, "ms": t, "vs_torch_bf16": ref / t if ref else None}
            rows.append(r)
            speed = f"x{r['vs_torch_bf16']:.2f}" if ref else ""
            print(
                f"M={M:<3} {name:<38} {t:8.2f} ms  {speed:>6}  ({gb / t * 1e3:5.1f} GB/s of 16-bit weights)"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
