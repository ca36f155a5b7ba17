"""A quick side-by-side check of the tensor-core W4A16/W8A16 kernel against cuBLAS bf16 (GPU machine).

Smaller and faster than ``quantrt bench --quick``: for tuning work between full benchmark runs.
Prints, per shape and M, the median time with the L2 flushed and the ratio to ``F.linear``, and
the eager host cost per call at M=1 (CPU-side time of a burst of calls on a tiny layer).

  python3 ci/quick_wna16_mma.py --scheme w4a16-int-g128-asym --shapes 8192x57344,28672x8192
"""

from __future__ import annotations

import argparse

import torch

from quantrt.bench import host_us, median_us
from quantrt.layers import QuantLinear
from quantrt.reference import quantize


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="w4a16-int-g128-asym")
    ap.add_argument("--shapes", default="8192x57344,28672x8192")
    ap.add_argument("--ms", default="1,8,16,32,64,256")
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        K, N = (int(v) for v in shape.split("x"))
        canon = quantize(torch.randn(N, K, device="cuda") * 0.02, args.scheme)
        layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
        dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            tq = median_us(lambda x=x, f=layer: f(x)) * 1e-3
            tc = median_us(lambda x=x, w=dense: torch.nn.functional.linear(x, w)) * 1e-3
            gb = canon.nbytes  # stored bytes: codes, scales, zeros
            print(
                f"{args.scheme} {K}x{N} M={m}: {tq * 1e3:.1f} us, cuBLAS {tc * 1e3:.1f} us, {tc / tq:.2f}x"
                f", {gb / tq / 1e9:.2f} TB/s  [{layer._kernel.strategy(layer._state, m)}]",
                flush=True,
            )
        del layer, dense, canon
        torch.cuda.empty_cache()
    small = QuantLinear.from_canonical(
        quantize(torch.randn(512, 512, device="cuda") * 0.02, args.scheme),
        device="cuda",
        act_dtype=torch.bfloat16,
    )
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    hq, hf = host_us(lambda: small(x)), host_us(lambda: torch.nn.functional.linear(x, w))
    print(f"host cost at M=1: quantrt {hq:.1f} us, F.linear {hf:.1f} us, {hq / hf:.2f}x", flush=True)


if __name__ == "__main__":
    main()
