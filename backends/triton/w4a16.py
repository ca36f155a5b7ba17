"""Int4 and int8 weight-only matmul (W4A16, W8A16) in Triton, portable across GPU vendors.

The weight stays in quantrt's canonical layout, so ``prepare`` repacks nothing: codes uint8
[N, K/2] with the even k in the low nibble, scales [N, K/G] and zero-points [N, K/G] in the
activation dtype. A K-tile of BK codes lies inside one group (BK divides G), so each tile needs
one scale and one zero per output column. Even and odd input channels are multiplied
separately (two dots over BK/2), which avoids interleaving nibbles in registers. Act-order is
served by gathering activation columns through a permutation inside the kernel.

One kernel serves every batch size; the vendor folder picks the tile and the split of K per
M (small M: split K over programs and reduce with fp32 atomics; large M: one program per tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import TileConfig, empty_result, finish_output, output_buffers, store_tile, tile_grid
from .launch import Launcher, cdiv


@triton.jit
def _w4a16_kernel(
    X, W, S, Z, P, B, Y,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_zn, stride_b, stride_ym, stride_yn,
    G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_P: tl.constexpr, HAS_B: tl.constexpr, ATOMIC: tl.constexpr, IEEE: tl.constexpr,
    BITS: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    half = tl.arange(0, BK // 2)
    full = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_tiles = K // BK
    for t in range(pid_k, k_tiles, SPLIT_K):
        g = (t * BK) // G
        s = tl.load(S + offs_n * stride_sn + g, mask=mask_n, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(Z + offs_n * stride_zn + g, mask=mask_n, other=0).to(tl.float32)
        else:
            z = tl.full((BN,), 2.0 ** (BITS - 1), tl.float32)
        if BITS == 4:
            kb = t * (BK // 2) + half
            w = tl.load(W + offs_n[None, :] * stride_wn + kb[:, None], mask=mask_n[None, :], other=0)
            lo = (w & 0xF).to(tl.float32)
            hi = (w >> 4).to(tl.float32)
            w_lo = ((lo - z[None, :]) * s[None, :]).to(X.dtype.element_ty)
            w_hi = ((hi - z[None, :]) * s[None, :]).to(X.dtype.element_ty)
            k_even = 2 * kb
            k_odd = k_even + 1
            if HAS_P:
                k_even = tl.load(P + k_even)
                k_odd = tl.load(P + k_odd)
            x_even = tl.load(
                X + offs_m[:, None] * stride_xm + k_even[None, :] * stride_xk, mask=mask_m[:, None], other=0.0
            )
            x_odd = tl.load(
                X + offs_m[:, None] * stride_xm + k_odd[None, :] * stride_xk, mask=mask_m[:, None], other=0.0
            )
            if IEEE:
                acc += tl.dot(x_even, w_lo, input_precision="ieee")
                acc += tl.dot(x_odd, w_hi, input_precision="ieee")
            else:
                acc += tl.dot(x_even, w_lo)
                acc += tl.dot(x_odd, w_hi)
        else:
            kk = t * BK + full
            w = tl.load(W + offs_n[None, :] * stride_wn + kk[:, None], mask=mask_n[None, :], other=0)
            wq = ((w.to(tl.float32) - z[None, :]) * s[None, :]).to(X.dtype.element_ty)
            if HAS_P:
                kk = tl.load(P + kk)
            xk = tl.load(
                X + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk, mask=mask_m[:, None], other=0.0
            )
            if IEEE:
                acc += tl.dot(xk, wq, input_precision="ieee")
            else:
                acc += tl.dot(xk, wq)
    store_tile(
        acc, B, Y, offs_m, offs_n, mask_m, mask_n, pid_k, stride_b, stride_ym, stride_yn, HAS_B, ATOMIC
    )


_w4a16_launch = Launcher(_w4a16_kernel)


@triton.jit
def _w4_gemv_kernel(
    X, W, S, Z, P, B, Y,
    N, K,
    stride_xk, stride_wn, stride_sn, stride_zn, stride_b, stride_yn,
    G: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_P: tl.constexpr, HAS_B: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    """M == 1: each program streams whole rows of BN outputs (contiguous along K), no tensor cores."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    half = tl.arange(0, BK // 2)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for t in range(pid_k, K // BK, SPLIT_K):
        kb = t * (BK // 2) + half
        w = tl.load(W + offs_n[:, None] * stride_wn + kb[None, :], mask=mask_n[:, None], other=0)
        g = (t * BK) // G
        s = tl.load(S + offs_n * stride_sn + g, mask=mask_n, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(Z + offs_n * stride_zn + g, mask=mask_n, other=0).to(tl.float32)
        else:
            z = tl.full((BN,), 8.0, tl.float32)
        k_even = 2 * kb
        k_odd = k_even + 1
        if HAS_P:
            k_even = tl.load(P + k_even)
            k_odd = tl.load(P + k_odd)
        x_even = tl.load(X + k_even * stride_xk).to(tl.float32)
        x_odd = tl.load(X + k_odd * stride_xk).to(tl.float32)
        lo = (w & 0xF).to(tl.float32)
        hi = (w >> 4).to(tl.float32)
        dot = tl.sum(lo * x_even[None, :] + hi * x_odd[None, :], axis=1)
        acc += s * (dot - z * tl.sum(x_even + x_odd, axis=0))
    if HAS_B:
        if pid_k == 0:
            acc += tl.load(B + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)
    if ATOMIC:
        tl.atomic_add(Y + offs_n * stride_yn, acc, mask=mask_n)
    else:
        tl.store(Y + offs_n * stride_yn, acc.to(Y.dtype.element_ty), mask=mask_n)


_w4_gemv_launch = Launcher(_w4_gemv_kernel)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    perm: torch.Tensor | None,
    group: int,
    bias: torch.Tensor | None,
    config: TileConfig,
    out: torch.Tensor | None = None,
    bits: int = 4,
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` for x [M, K] and canonical codes: int4 [N, K/2] or int8 [N, K]."""
    M, K = x.shape
    N = qweight.shape[0]
    if K % config.block_k or group % config.block_k:
        raise ValueError(f"block_k={config.block_k} must divide K={K} and the group size {group}")
    if M == 0:
        return empty_result(N, x.dtype, out, x.device)
    atomic = config.split_k > 1
    y, result = output_buffers(M, N, x.dtype, out, atomic, x.device)
    if M == 1 and bits == 4 and config.block_m == 1:
        _w4_gemv_launch((cdiv(N, config.block_n), config.split_k),
            x, qweight, scales, zeros if zeros is not None else scales, perm if perm is not None else qweight,
            bias if bias is not None else scales, y, N, K,
            x.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0) if zeros is not None else 0,
            bias.stride(0) if bias is not None else 0, y.stride(1),
            G=group, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k, HAS_Z=zeros is not None,
            HAS_P=perm is not None, HAS_B=bias is not None, ATOMIC=atomic,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
    else:
        _launch_tiles(x, qweight, scales, zeros, perm, bias, y, group, config, atomic, bits)
    return finish_output(y, result)


def _launch_tiles(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    perm: torch.Tensor | None,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    group: int,
    config: TileConfig,
    atomic: bool,
    bits: int,
) -> None:
    M, K = x.shape
    N = qweight.shape[0]
    _w4a16_launch(tile_grid(M, N, config),
        x, qweight, scales, zeros if zeros is not None else scales, perm if perm is not None else qweight,
        bias if bias is not None else scales, y,
        M, N, K,
        x.stride(0), x.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0) if zeros is not None else 0,
        bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
        G=group, BM=config.block_m, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k,
        HAS_Z=zeros is not None, HAS_P=perm is not None, HAS_B=bias is not None, ATOMIC=atomic,
        IEEE=x.dtype == torch.float32, BITS=bits,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
