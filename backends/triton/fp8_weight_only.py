"""FP8 weight-only matmul (W8A16) in Triton, for GPUs without fp8 matrix units (NVIDIA sm_80/86).

The weight stays in quantrt's canonical layout (fp8 [N, K], row-major as stored) and reaches the
kernel as its uint8 view. Each K-tile of codes is turned into the activation dtype by integer
bit tricks, so no hardware fp8 conversion is needed (it runs on sm_80 and in the interpreter):

* e4m3fn code ``c`` -> fp16 bits ``((c & 0x7F) << 7) | ((c & 0x80) << 8)``, times 2^8 (the
  exponent bias is 15 instead of 7); subnormal codes land on fp16 subnormals, so every finite
  code is exact. The product is taken in fp32 (every result is a normal number >= 2^-9), then
  cast to the dot dtype, exactly: e4m3 values fit fp16, bf16 and fp32.
* e5m2 code ``c`` is the top byte of an fp16: bits ``c << 8`` (infinities and NaN included),
  then cast to the dot dtype, exactly.

bf16 activations use the fp16 route too. The direct bf16 identity (bf16 bits
``((c & 0x7F) << 4) | ((c & 0x80) << 8)`` times 2^120) is as exact on a GPU, but its subnormal
codes pass through bf16 subnormals, which Triton's interpreter converts wrongly, so it could
not be tested on the CPU; the fp16 route costs the same (bit ops, one cvt, one mul, one cvt).

The e4m3fn NaN codes 0x7F/0xFF decode to ±480, not NaN: a checkpoint holding NaN weight codes is
corrupt and must be rejected when it is loaded; the kernel cannot check (no host synchronization).

Dots run in the activation dtype with an fp32 accumulator (fp32 activations: IEEE dots).
Per-channel scales ``[N]`` (per-tensor weights pass theirs expanded to [N]) are applied once in
the epilogue; block scales ``[ceil(N/bn), ceil(K/bk)]`` multiply each K-tile's partial dot, so
``block_k`` must divide ``bk`` (``block_n`` need not divide ``bn``: scales are read per column). Split-K (``split_k`` > 1) reduces the partial sums with fp32
atomics into a zeroed buffer, then casts; ``split_k`` = 1 writes the output dtype directly.
Nothing here synchronizes with the host or tunes at run time: the caller passes the tile.
Pointer offsets are int32, so every operand must hold fewer than 2^31 elements.

:class:`TileConfig`, the checks and the split-K epilogue live in :mod:`.common`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    FLOAT_DTYPES,
    TileConfig,
    check_block,
    check_config,
    check_epilogue,
    dtype_name,
    empty_result,
    finish_output,
    load_k_tiles,
    output_buffers,
    store_tile,
    tile_grid,
)
from .launch import Launcher, cdiv

FP8_WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@triton.jit
def _decode_fp8(c, DST: tl.constexpr, E5M2: tl.constexpr):
    """uint8 fp8 codes -> exact values in DST (fp16, bf16 or fp32) with integer bit tricks only."""
    c = c.to(tl.int32)
    if E5M2:
        w = ((c << 8).to(tl.int16)).to(tl.float16, bitcast=True).to(DST)
    else:
        bits = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
        w = (bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0).to(DST)
    return w


@triton.jit
def _decode_kernel(C, Y, n, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = tl.load(C + offs, mask=mask, other=0)
    tl.store(Y + offs, _decode_fp8(c, Y.dtype.element_ty, E5M2), mask=mask)


_decode_launch = Launcher(_decode_kernel)


def decode_fp8_codes(codes: torch.Tensor, fp8_dtype: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's in-register decode on its own: contiguous uint8 codes -> values in ``dtype``.

    For tests and debugging; the matmul decodes the same way, tile by tile.
    """
    if fp8_dtype not in FP8_WEIGHT_DTYPES or dtype not in FLOAT_DTYPES or codes.dtype != torch.uint8:
        raise ValueError(
            f"decode_fp8_codes: expected uint8 codes, float8_e4m3fn/float8_e5m2 and a float16/bfloat16/"
            f"float32 target, found {dtype_name(codes.dtype)}, {fp8_dtype}, {dtype}"
        )
    codes = codes.contiguous()
    y = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    n = codes.numel()
    if n:
        _decode_launch((cdiv(n, 256),), codes, y, n, E5M2=fp8_dtype == torch.float8_e5m2, BLOCK=256)
    return y


@triton.jit
def _fp8_wo_kernel(
    X, W, S, B, Y,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_b, stride_ym, stride_yn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    SBN: tl.constexpr, SBK: tl.constexpr, BLOCKED: tl.constexpr, E5M2: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_B: tl.constexpr, ATOMIC: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in range(pid_k, tl.cdiv(K, BK), SPLIT_K):
        kk = t * BK + offs_k
        xk, c = load_k_tiles(
            X, W, kk, offs_m, offs_n, mask_m, mask_n, K, stride_xm, stride_xk, stride_wn, stride_wk, EVEN_K
        )
        wk = _decode_fp8(c, X.dtype.element_ty, E5M2)
        if IEEE:
            part = tl.dot(xk, wk, input_precision="ieee")
        else:
            part = tl.dot(xk, wk)
        if BLOCKED:
            s = tl.load(
                S + (offs_n // SBN) * stride_sn + ((t * BK) // SBK) * stride_sk, mask=mask_n, other=0.0
            )
            acc += part * s[None, :]
        else:
            acc += part
    if not BLOCKED:
        acc *= tl.load(S + offs_n * stride_sn, mask=mask_n, other=0.0)[None, :]
    store_tile(
        acc, B, Y, offs_m, offs_n, mask_m, mask_n, pid_k, stride_b, stride_ym, stride_yn, HAS_B, ATOMIC
    )


_fp8_wo_launch = Launcher(_fp8_wo_kernel)


def fp8_weight_only_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int] | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: TileConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x @ (float(w) * scale).T (+ bias)`` in ``out_dtype``, fp32 accumulation.

    x [M, K] float16/bfloat16/float32, any strides; w [N, K] float8_e4m3fn or float8_e5m2 as
    stored; w_scale float32 [N] (per channel, or a per-tensor scale expanded) when ``block`` is
    None, else [ceil(N/bn), ceil(K/bk)] for ``block = (bn, bk)``, with ``config.block_k``
    dividing bk. ``out``: an [M, N] ``out_dtype`` tensor to write into (returned).
    """
    what = "fp8_weight_only_matmul"
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{what}: x must be a 2-D float16/bfloat16/float32 [M, K] tensor, "
            f"found {dtype_name(x.dtype)} {list(x.shape)}"
        )
    M, K = x.shape
    if w.dim() != 2 or w.dtype not in FP8_WEIGHT_DTYPES or w.shape[1] != K:
        raise ValueError(
            f"{what}: w must be float8_e4m3fn or float8_e5m2 [N, {K}], "
            f"found {dtype_name(w.dtype)} {list(w.shape)}"
        )
    N = w.shape[0]
    if w.device != x.device:
        raise ValueError(f"{what}: w must be on {x.device} with x, found {w.device}")
    check_config(config, 16, what)
    if block is None:
        want = (N,)
    else:
        bn, bk = check_block(block, what)
        if bk % config.block_k:
            raise ValueError(f"{what}: block_k={config.block_k} must divide the scale block's bk={bk}")
        want = (-(-N // bn), -(-K // bk))
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != want or w_scale.device != x.device:
        kind = "per-channel" if block is None else f"block {block}"
        raise ValueError(
            f"{what}: {kind} w_scale must be float32 {list(want)} on {x.device}, "
            f"found {dtype_name(w_scale.dtype)} {list(w_scale.shape)} on {w_scale.device}"
        )
    check_epilogue(bias, out, out_dtype, M, N, x.device, what)
    if M == 0:
        return empty_result(N, out_dtype, out, x.device)
    atomic = config.split_k > 1
    y, result = output_buffers(M, N, out_dtype, out, atomic, x.device)
    codes = w.view(torch.uint8)
    s_strides = (w_scale.stride(0), 0) if block is None else (w_scale.stride(0), w_scale.stride(1))
    _fp8_wo_launch(tile_grid(M, N, config),
        x, codes, w_scale, bias if bias is not None else w_scale, y,
        M, N, K,
        x.stride(0), x.stride(1), codes.stride(0), codes.stride(1), *s_strides,
        bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
        BM=config.block_m, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k,
        SBN=1 if block is None else block[0], SBK=1 if block is None else block[1], BLOCKED=block is not None,
        E5M2=w.dtype == torch.float8_e5m2, EVEN_K=K % config.block_k == 0, HAS_B=bias is not None,
        ATOMIC=atomic, IEEE=x.dtype == torch.float32,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return finish_output(y, result)
