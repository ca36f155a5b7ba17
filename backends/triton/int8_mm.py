"""INT8 W8A8 GEMM in Triton with the dequantization scales in the epilogue.

``y = (xq @ w.T as int32) * a_scale[m] * w_scale[n] + bias``: int8 tiles meet in ``tl.dot`` with
an int32 accumulator (exact), and the accumulator turns into fp32 once, after the K loop, where
the per-token (or per-tensor) activation scale, the per-channel weight scale and the bias are
applied while the tile is still in registers. On the GPU that makes the scaling free next to
``torch._int_mm`` followed by separate scale and bias kernels.

The weight is signed int8 [N, K], row-major: quantrt's canonical codes are uint8 with offset
128, and the caller subtracts the offset once at load. Split-K (``split_k`` > 1) scales each
program's int32 partial sum (the scales are per row and column, so scaling distributes over the
partial sums) and the tile's last program sums them in order (``common.reduce_tile``: one launch,
deterministic); ``split_k`` = 1 writes the output dtype directly. No host synchronization and no run-time tuning: the caller passes the tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    TileConfig,
    TileCounters,
    check_config,
    check_epilogue,
    empty_result,
    load_k_tiles,
    reduce_tile,
    split_k_buffers,
    tile_grid,
)
from .launch import Call, Launcher

__all__ = ["int8_matmul"]


@triton.jit
def _int8_mm_kernel(
    X, W, A, S, B, Y, P, C,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_b, stride_ym, stride_yn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    PER_TOKEN: tl.constexpr, EVEN_K: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.int32)
    for t in range(pid_k, tl.cdiv(K, BK), SPLIT_K):
        kk = t * BK + offs_k
        xk, wk = load_k_tiles(
            X, W, kk, offs_m, offs_n, mask_m, mask_n, K, stride_xm, stride_xk, stride_wn, stride_wk, EVEN_K
        )
        acc = tl.dot(xk, wk, acc, out_dtype=tl.int32)
    if PER_TOKEN:
        a = tl.load(A + offs_m * stride_am, mask=mask_m, other=0.0)[:, None]
    else:
        a = tl.load(A)
    s = tl.load(S + offs_n, mask=mask_n, other=0.0)
    y = acc.to(tl.float32) * a * s[None, :]
    tile = pid_m * tl.num_programs(1) + pid_n
    reduce_tile(y, B, Y, P, C, tile, pid_k, offs_m, offs_n, mask_m, mask_n, M, N,
                stride_b, stride_ym, stride_yn, HAS_B, SPLIT_K)  # fmt: skip


_int8_mm_launch = Launcher(_int8_mm_kernel)


def int8_matmul(
    xq: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: TileConfig,
    out: torch.Tensor | None = None,
    counters: TileCounters | None = None,
) -> torch.Tensor:
    """``y = (xq @ w.T) * a_scale * w_scale (+ bias)`` in ``out_dtype``; the int8 dot is exact in int32.

    xq int8 [M, K] (contiguous is fastest; any strides work); a_scale float32 [M, 1] (per token)
    or one element (per tensor, static); w int8 [N, K] (signed codes); w_scale float32 [N] (per
    channel); bias [N] float16/bfloat16/float32 or None; ``out``: an [M, N] ``out_dtype`` tensor
    to write into (returned). ``config.block_k`` must be at least 32 (int8 dots). ``counters``: the
    layer's split-K arrival counters (:class:`.common.TileCounters`); None makes zeros per call.
    """
    what = "int8_matmul"
    if xq.dim() != 2 or xq.dtype != torch.int8:
        raise ValueError(f"{what}: xq must be int8 [M, K], found {xq.dtype} {list(xq.shape)}")
    M, K = xq.shape
    if w.dim() != 2 or w.dtype != torch.int8 or w.shape[1] != K:
        hint = ""
        if w.dtype == torch.uint8:
            hint = " (convert quantrt's uint8 offset-128 codes once at load: (q.int() - 128).to(torch.int8))"
        raise ValueError(f"{what}: w must be int8 [N, {K}], found {w.dtype} {list(w.shape)}{hint}")
    N = w.shape[0]
    dev = xq.device
    if w.device != dev:
        raise ValueError(f"{what}: w must be on {dev} with xq, found {w.device}")
    if (
        a_scale.dtype != torch.float32
        or a_scale.device != dev
        or not (a_scale.numel() == 1 or tuple(a_scale.shape) == (M, 1))
    ):
        raise ValueError(
            f"{what}: a_scale must be float32 [{M}, 1] (per token) or one element (per tensor) on {dev}, "
            f"found {a_scale.dtype} {list(a_scale.shape)} on {a_scale.device}"
        )
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (N,) or w_scale.device != dev:
        raise ValueError(
            f"{what}: w_scale must be float32 [{N}] on {dev}, "
            f"found {w_scale.dtype} {list(w_scale.shape)} on {w_scale.device}"
        )
    check_config(config, 32, what)
    per_token = a_scale.numel() != 1  # one element: per tensor (the same for M = 1 either way)
    check_epilogue(bias, out, out_dtype, M, N, dev, what)
    if M == 0:
        return empty_result(N, out_dtype, out, dev)
    grid = tile_grid(M, N, config)
    y = torch.empty(M, N, device=dev, dtype=out_dtype) if out is None else out
    part, cnt = split_k_buffers(y, grid[0] * grid[1], M, N, config, counters)
    int8_call(xq, a_scale, w, w_scale, bias, y, part, cnt, config, per_token)()
    return y


def int8_call(
    xq: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    part: torch.Tensor,
    cnt: torch.Tensor,
    config: TileConfig,
    per_token: bool,
) -> Call:
    """The launch of :func:`int8_matmul` into given buffers, unchecked (M >= 1): ``part`` and
    ``cnt`` from :func:`.common.split_k_buffers`; ``per_token`` False for one activation scale.
    Its first eight arguments are the pointers."""
    M, K = xq.shape
    N = w.shape[0]
    return Call(_int8_mm_launch, tile_grid(M, N, config), (
        xq, w, a_scale, w_scale, bias if bias is not None else w_scale, y, part, cnt,
        M, N, K,
        xq.stride(0), xq.stride(1), w.stride(0), w.stride(1), a_scale.stride(0) if per_token else 0,
        bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
    ), dict(
        BM=config.block_m, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k,
        PER_TOKEN=per_token, EVEN_K=K % config.block_k == 0, HAS_B=bias is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    ))  # fmt: skip
