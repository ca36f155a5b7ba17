"""Eager host cost per call of every scheme's CUDA kernel, beside F.linear's, in one run.

    python3 bench/gpu_host_cost.py --out FILE.json [--schemes a,b] [--ms 1,16] [--profile-top 3]

One 1024 x 1024 layer per catalog scheme that has a native kernel on this GPU (the dispatcher's
choice; GGUF as random llama.cpp blocks, the rest the reference quantizer), bf16 activations.
``host_us`` (``quantrt.bench.host_us``) times 2000 back-to-back calls and one synchronisation, on a
layer small enough that the GPU keeps up, so the figure is what Python, the launcher and the
driver cost per call; F.linear on a dense bf16 weight of the same shape is timed right after each
scheme, as the issue's yardstick (target: <= 1.3x). ``--profile-top N`` writes a cProfile (by own
time) of the N costliest schemes next to the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

K, N = 1024, 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default=None, help="comma-separated (default: every catalog scheme)")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--profile-top", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_host_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2

    from quantrt.bench import host_us, profile_text, random_weight, run_header
    from quantrt.layers import QuantLinear
    from quantrt.schemes import catalog

    names = args.schemes.split(",") if args.schemes else [s.name for s in catalog()]
    doc = {
        **run_header("eager host cost per call, 1024x1024, bf16", "bench/gpu_host_cost.py", args),
        "rows": [],
    }
    dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    layers = {}
    for name in names:
        row: dict = {"scheme": name}
        try:
            canon = random_weight(name, N, K)
            layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
        except Exception as e:  # no kernel for this scheme here, or a scheme needing more than a weight
            row["skipped"] = f"{type(e).__name__}: {str(e)[:160]}"
            doc["rows"].append(row)
            continue
        row["kernel"] = layer.kernel_name
        layers[name] = layer
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            layer(x)
            q = host_us(lambda layer=layer, x=x: layer(x))
            f = host_us(lambda x=x: F.linear(x, dense))
            row[f"M{m}"] = {"quantrt_us": round(q, 2), "F_linear_us": round(f, 2), "ratio": round(q / f, 3),
                            "strategy": layer._kernel.strategy(layer._state, m)}  # fmt: skip
        doc["rows"].append(row)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        m1 = row.get("M1", {})
        print(f"{name:28} {row['kernel']:28} M=1 {m1.get('quantrt_us')} us vs F.linear {m1.get('F_linear_us')} "
              f"({m1.get('ratio')}x) {m1.get('strategy')}", flush=True)  # fmt: skip
    timed = [r for r in doc["rows"] if "M1" in r]
    worst = sorted(timed, key=lambda r: -r["M1"]["ratio"])[: args.profile_top]
    doc["over_1.3x"] = [r["scheme"] for r in timed if r["M1"]["ratio"] > 1.3]
    for r in worst:
        layer, x = layers[r["scheme"]], torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        text = profile_text(lambda layer=layer, x=x: layer(x))
        Path(args.out).with_suffix(f".{r['scheme']}.prof.txt").write_text(text)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"over 1.3x F.linear at M=1: {doc['over_1.3x']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
