"""W8A8 (fp8 or int8) for decode-sized batches in one launch: the activation quantization inside
a GEMV over the weight's codes.

The split-K GEMMs of :mod:`.fp8_mm` / :mod:`.int8_mm` take stored activation codes, so a W8A8
call at small M is an activation-quantization launch, the GEMM, and for split-K a zeroed fp32
scratch and a cast back: four launches of host time each call, and ``tl.dot`` tiles of 16 rows
for one. Here each program takes all of K for ``block_n`` output columns and every row of the
batch (``MB`` rows, a power of two up to ``max_m``): it finds the rows' scale (amax over K, read
from the L2, or the static scale), then streams its weight rows once, turning each x tile into
the numbers of its codes (``act_quant._code_value``: the same codes the quantization kernels
store, as fp32 values) and adding products into a [rows, block_n, block_k] register accumulator
that is summed over k once, after the loop (int32 for int8: exact, as the int8 GEMM's). Both scales and the bias are applied once, and the output dtype is stored directly: one
launch, no scratch, no atomics, deterministic. The quantization work per program is one pass over
x, small next to its ``block_n`` weight rows.

Numerics are the W8A8 reference's: codes as :mod:`.act_quant` makes them (per token, per tensor
over the whole batch, or with the static scale, fp8 saturating where the layout says), products
of codes exact in fp32 (int32 for int8), fp32 sums, then ``* a_scale * w_scale + bias``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .act_quant import _code_value, _dynamic_scale
from .launch import Launcher, cdiv, next_power_of_2
from .tile_table import GemvConfig

#: how the activation scale is found: the static one, per token (row), or one over the batch
ACT_MODES = {"static": 0, "token": 1, "tensor": 2}


@triton.jit
def _w8a8_gemv_kernel(
    X, W, WS, IS, B, Y,
    M, N, K, stride_xm, stride_xk, stride_wn, stride_b, stride_ym, qmax, scale_mult,
    MB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_B: tl.constexpr,
    INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    rows = tl.arange(0, MB)
    mask_m = rows < M
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = cols < N
    ks = tl.arange(0, BK)
    x_rows = X + rows[:, None] * stride_xm
    w_rows = W + cols.to(tl.int64)[:, None] * stride_wn
    if ACT == 0:
        s = tl.load(IS + rows * 0).to(tl.float32)  # the static scale, on every row
    else:
        amax = tl.zeros((MB,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + ks
            mx = mask_m[:, None] & (kk[None, :] < K)
            xt = tl.load(x_rows + kk[None, :] * stride_xk, mask=mx, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(xt), axis=1))
        if ACT == 2:  # one scale over the batch (rows past M read as zeros)
            amax = tl.zeros((MB,), dtype=tl.float32) + tl.max(amax, axis=0)
        s = _dynamic_scale(amax, qmax, scale_mult)
    # each step reads a [BN, BK] weight tile once and multiplies it with every row's codes into a
    # [MB, BN, BK] accumulator, summed over k once after the loop: no cross-thread reduction (and
    # no barrier) inside the loop, which would stall the weight stream
    acc = tl.zeros((MB, BN, BK), dtype=tl.int32 if INT8 else tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        if EVEN_K:
            xt = tl.load(x_rows + kk[None, :] * stride_xk, mask=mask_m[:, None], other=0.0)
            wt = tl.load(w_rows + kk[None, :], mask=mask_n[:, None], other=0.0)
        else:
            mk = kk < K
            xt = tl.load(x_rows + kk[None, :] * stride_xk, mask=mask_m[:, None] & mk[None, :], other=0.0)
            wt = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mk[None, :], other=0.0)
        q = _code_value(xt.to(tl.float32), s[:, None], INT8, HW_FP8, FMAX, MANT, EMIN, QTY)
        if INT8:
            acc += q.to(tl.int32)[:, None, :] * wt.to(tl.int32)[None, :, :]
        else:
            acc += q[:, None, :] * wt.to(tl.float32)[None, :, :]
    sums = tl.sum(acc, axis=2)
    w_s = tl.load(WS + cols, mask=mask_n, other=0.0)
    y = sums.to(tl.float32) * s[:, None] * w_s[None, :]
    if HAS_B:
        y += tl.load(B + cols * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + rows[:, None] * stride_ym + cols[None, :],
        y.to(Y.dtype.element_ty),
        mask=mask_m[:, None] & mask_n[None, :],
    )


_w8a8_gemv_launch = Launcher(_w8a8_gemv_kernel)


def w8a8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: GemvConfig,
    meta: dict[str, Any],
    *,
    act: str,
    in_scale: torch.Tensor | None = None,
    qmax: float,
    scale_mult: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = codes(x) . w^T * a_scale * w_scale (+ bias)`` for 1 <= M <= ``config.max_m``, in one launch.

    The hot path of a prepared layer: x [M, K] (fp16/bf16/fp32, K the weight's, any strides), out
    [M, N] of ``out_dtype`` with unit column stride or None, as :class:`quantrt.prepared.Prepared`
    has checked them; w [N, K] fp8 or int8 (signed) codes with unit K stride; w_scale fp32 [N];
    ``meta`` the encoding of x's codes (``act_quant.encoding``, its FMAX the saturation point);
    ``act`` "static" (``in_scale``: one fp32 element, read on the device), "token" or "tensor"
    (dynamic: ``dynamic_scale(amax, qmax) * scale_mult``)."""
    M, K = x.shape
    N = w.shape[0]
    if M > config.max_m:
        raise ValueError(f"w8a8_gemv: at most {config.max_m} rows per call, found {M}")
    y = torch.empty(M, N, dtype=out_dtype, device=x.device) if out is None else out
    _w8a8_gemv_launch((cdiv(N, config.block_n),),
        x, w, w_scale, w_scale if in_scale is None else in_scale, w_scale if bias is None else bias, y,
        M, N, K, x.stride(0), x.stride(1), w.stride(0), 0 if bias is None else bias.stride(0), y.stride(0),
        float(qmax), float(scale_mult),
        MB=next_power_of_2(M), BN=config.block_n, BK=config.block_k, ACT=ACT_MODES[act],
        EVEN_K=K % config.block_k == 0, HAS_B=bias is not None,
        num_warps=config.num_warps, num_stages=config.num_stages, **meta,
    )  # fmt: skip
    return y
