"""Launch the tensor-core W4A16/W8A16 kernel and cuBLAS bf16 once per M inside an NVTX range
``prof``, for ``ncu --nvtx --nvtx-include prof/`` (run on the GPU machine):

  ncu --nvtx --nvtx-include prof/ --set full --clock-control none -o $OUT/prof \
      python3 ci/profile_wna16_mma.py --shape 8192x57344 --ms 1,16,64
"""

from __future__ import annotations

import argparse

import torch

from quantrt.bench import random_weight
from quantrt.layers import QuantLinear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x57344")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--scheme", default="w4a16-int-g128-asym")
    ap.add_argument("--no-cublas", action="store_true")
    args = ap.parse_args()
    K, N = (int(v) for v in args.shape.split("x"))
    canon = random_weight(args.scheme, N, K)
    layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
    dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    for m in (int(v) for v in args.ms.split(",")):
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        layer(x)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
        layer(x)
        if not args.no_cublas:
            torch.nn.functional.linear(x, dense)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"M={m}: {layer.kernel_name} {layer._kernel.strategy(layer._state, m)}", flush=True)


if __name__ == "__main__":
    main()
