"""W8A8 for small batches in one launch: activation quantization inside the GEMM.

The two-pass path (:mod:`.act_quant`, then a split-K GEMM into zeroed fp32 scratch cast back) costs
four launches per call, which a decode step pays per layer on the host. Here each program takes
the whole of K for ``BN`` output columns and at most ``BM`` rows: it finds each row's amax over K
(dynamic per-token scales; a static scale is read instead), then quantizes every x tile as it goes,
with :mod:`.act_quant`'s own code functions (codes equal to the reference's), and multiplies the
codes with the weight's on the matrix units (fp8 or int8 ``tl.dot``). Both scales and the bias go
in the epilogue, which stores the output dtype: no scratch, no atomics, one launch.

x is read twice per program (amax, then codes), from L2 after the first: at most ``BM`` rows of a
few kilobytes each, small beside the weight columns a program streams. Per-tensor dynamic scales
(one amax over all rows) and block scales keep the two-pass paths.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from quantrt.prepared import StrategyFn

from .act_quant import _dynamic_scale, _encode, codes_meta
from .launch import Launcher, cdiv

#: rows per program (tl.dot's smallest M); batches up to this many rows run fused
FUSED_MAX_M = 16


@triton.jit
def _fused_kernel(
    X, W, WS, IS, B, Y,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_b, stride_ym, stride_yn, qmax, scale_mult,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STATIC: tl.constexpr, HAS_B: tl.constexpr,
    INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    offs_m = tl.program_id(1) * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = X + offs_m.to(tl.int64)[:, None] * stride_xm
    w_cols = W + offs_n.to(tl.int64)[None, :] * stride_wn
    if STATIC:
        s = tl.load(IS + tl.zeros((BM,), dtype=tl.int32))
    else:
        amax = tl.zeros((BM, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + offs_k
            x = tl.load(x_rows + kk[None, :] * stride_xk, mask=mask_m[:, None] & (kk[None, :] < K), other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        s = _dynamic_scale(tl.max(amax, axis=1), qmax, scale_mult)
    acc = tl.zeros((BM, BN), dtype=tl.int32 if INT8 else tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + offs_k
        kmask = kk < K
        x = tl.load(x_rows + kk[None, :] * stride_xk, mask=mask_m[:, None] & kmask[None, :], other=0.0)
        q = _encode(x.to(tl.float32), s[:, None], INT8, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
        if not INT8 and not HW_FP8:
            q = q.to(QTY, bitcast=True)  # the integer encoding's bits as the fp8 type
        w = tl.load(w_cols + kk[:, None] * stride_wk, mask=kmask[:, None] & mask_n[None, :], other=0.0)
        if INT8:
            acc = tl.dot(q, w, acc, out_dtype=tl.int32)
        else:  # promote the fp8 MMA's reduced-precision sums once per K tile (as fp8_mm does)
            acc = tl.dot(q, w, acc, max_num_imprecise_acc=BK)
    w_s = tl.load(WS + offs_n, mask=mask_n, other=0.0)
    y = acc.to(tl.float32) * s[:, None] * w_s[None, :]
    if HAS_B:
        y += tl.load(B + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(out, y.to(Y.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_fused_launch = Launcher(_fused_kernel)


def fused_strategy(
    kind: str, bn: int = 32, bk: int = 256, num_warps: int = 4, num_stages: int = 3
) -> StrategyFn:
    """The strategy function for a W8A8 layout (:class:`.w8a8_kernel.Fp8Layout` with ``act`` token or
    static, or :class:`.w8a8_kernel.Int8Layout`): ``kind`` "fp8" or "int8"."""
    from quantrt.torchops import SCHEME_FP8_MAX

    from .act_quant import INT8_QMAX

    metas: dict[torch.device, dict] = {}  # the encoding's constexprs, per device, found once

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        M, K = x.shape
        N = lay.w.shape[0]
        static = lay.in_scale is not None
        mult = getattr(lay, "mult", 1.0)
        meta = metas.get(x.device)
        if meta is None:
            meta = metas[x.device] = codes_meta(kind, getattr(lay, "fp8", torch.float8_e4m3fn), x)
            if kind == "fp8" and static:
                meta["FMAX"] = SCHEME_FP8_MAX / mult  # static codes saturate where the reference's do
        y = torch.empty(M, N, dtype=lay.out_dtype, device=x.device) if out is None else out
        _fused_launch((cdiv(N, bn), cdiv(M, FUSED_MAX_M)),
            x, lay.w, lay.w_scale, lay.in_scale if static else lay.w_scale, lay.w_scale if bias is None else bias, y,
            M, N, K,
            x.stride(0), x.stride(1), lay.w.stride(0), lay.w.stride(1), 0 if bias is None else bias.stride(0),
            y.stride(0), y.stride(1), INT8_QMAX if kind == "int8" else SCHEME_FP8_MAX, float(mult),
            BM=FUSED_MAX_M, BN=bn, BK=bk, STATIC=static, HAS_B=bias is not None,
            num_warps=num_warps, num_stages=num_stages, **meta,
        )  # fmt: skip
        return y

    return fn
