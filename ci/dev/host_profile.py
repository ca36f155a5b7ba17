"""Where a W8A8 layer's host time per call goes (GPU only): the whole call, its parts, a bare
Triton launch, and the top of a cProfile of the call. Usage: python ci/dev/host_profile.py [--json F]."""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from quantrt.backends.triton import act_quant
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.fp8_mm import fp8_rowwise_matmul
from quantrt.bench import host_us, profile_text
from quantrt.layers import QuantLinear
from quantrt.reference import quantize


@triton.jit
def _empty(a, b, c, d, e, f, g, h, M, N, K, s0, s1, s2, s3, s4, s5, s6, s7, BM: tl.constexpr):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = "cuda"
    K = N = 4096
    out: dict = {}
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    t = [torch.empty(16, device=dev) for _ in range(8)]
    out["empty_triton_launch_us"] = host_us(
        lambda: _empty[(1,)](*t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, BM=16)
    )
    k = _empty[(1,)](*t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, BM=16)
    stream = torch.cuda.current_stream().cuda_stream
    allargs = (*t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16)
    out["direct_launch_us"] = host_us(
        lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *allargs)
    )
    out["direct_launch_with_stream_us"] = host_us(
        lambda: k.run(
            1,
            1,
            1,
            torch.cuda.current_stream().cuda_stream,
            k.function,
            k.packed_metadata,
            None,
            None,
            None,
            *allargs,
        )
    )
    out["torch_empty_us"] = host_us(lambda: torch.empty(1, 1, device=dev))
    out["quant_per_token_us"] = host_us(lambda: act_quant.quantize_per_token(x, "fp8"))
    xq, s = act_quant.quantize_per_token(x, "fp8")
    w = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
    ws = torch.rand(N, device=dev)
    cfg = TileConfig(16, 64, 256, 1, 4, 3)
    out["fp8_rowwise_us"] = host_us(lambda: fp8_rowwise_matmul(xq, s, w, ws, None, torch.bfloat16, cfg))
    cfg5 = TileConfig(16, 64, 256, 5, 4, 3)
    out["fp8_rowwise_splitk_us"] = host_us(
        lambda: fp8_rowwise_matmul(xq, s, w, ws, None, torch.bfloat16, cfg5)
    )
    from quantrt.backends.triton import fp8_mm

    kargs = (
        xq,
        w,
        s,
        ws,
        ws,
        torch.empty(1, N, device=dev, dtype=torch.bfloat16),
        1,
        N,
        K,
        K,
        1,
        K,
        1,
        1,
        1,
        0,
        N,
        1,
    )
    meta = dict(
        BM=16,
        BN=64,
        BK=256,
        SPLIT_K=1,
        GM=8,
        EVEN_K=True,
        HAS_B=False,
        ATOMIC=False,
        num_warps=4,
        num_stages=3,
    )
    grid = (N // 64, 1)
    out["rowwise_kernel_triton_launch_us"] = host_us(lambda: fp8_mm._fp8_rowwise_kernel[grid](*kargs, **meta))
    out["rowwise_kernel_fast_launch_us"] = host_us(lambda: fp8_mm._fp8_rowwise_launch(grid, *kargs, **meta))
    for scheme in ("w8a8-fp8-ch", "w8a8-fp8-block128", "w8a8-int-ch-sym", "w4a16-int-g128-asym"):
        canon = quantize(torch.randn(N, K, device=dev) * 0.02, scheme)
        layer = QuantLinear.from_canonical(canon, device=dev, act_dtype=torch.bfloat16)
        out[f"{scheme}_layer_us"] = host_us(lambda layer=layer: layer(x))
        out[f"{scheme}_profile"] = profile_text(lambda layer=layer: layer(x), calls=300)
    for k, v in out.items():
        print(k, v if isinstance(v, str) else round(v, 2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
