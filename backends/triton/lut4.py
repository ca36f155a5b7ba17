"""4-bit code-book weight-only matmul (W4A16) in Triton: NVFP4, MXFP4, bitsandbytes NF4 and FP4.

``y = x @ W.T (+ bias)`` with ``W[n, k] = value(code[n, k]) * scale(scales[n, k // G]) * row_scale[n]``.
The caller prepares the tensors; nothing is repacked here:

* codes uint8 [N, K/2], row-major, low nibble = even k (K is a multiple of G);
* scales [N, K/G] as ``scale_kind`` says: "e4m3" (uint8 bits of float8_e4m3fn, NVFP4), "e8m0"
  (uint8 exponents E, 2^(E-127), MXFP4) or "f32" (bitsandbytes absmax);
* ``table``: the fp32 [16] code book (NF4, bnb FP4), or None for e2m1;
* ``row_scale``: fp32 [N] or None (NVFP4's global scale, applied in the epilogue).

Every decode is exact and branch-free, integer ops plus one bitcast:

* e2m1 ``c`` -> fp16 bits ``((c & 8) << 12) | ((c & 7) << 9)``: the value times 2^-14 (code 1 lands
  on an fp16 subnormal, code 8 on -0). The 2^14 is folded into the e4m3 scale's constant, applied
  once per group (GEMV) or per element (tiles) otherwise: 2^14 * 2^127 would overflow a folded e8m0.
* e4m3 -> fp16 bits ``((c & 0x7F) << 7) | ((c & 0x80) << 8)`` times 2^8 (as :mod:`.fp8_weight_only`).
* e8m0 ``E`` -> fp32 bits ``(E << 23) | ((E == 0) << 22)``: E = 0 is the fp32 subnormal 2^-127.
* a code book entry is a gather from the 16-entry table (``tl.load(T + code)``, it stays in L1).

Two paths, picked by the tile (:class:`.common.TileConfig`):

* ``block_m == 1``: a GEMV without tensor cores. Each program owns ``block_n`` rows of W and one row
  of x (any M works, but W is streamed once per row of x: meant for M = 1, a few rows at most) and
  streams ``block_k`` codes per row per step (``block_k / 2`` contiguous bytes, vector loads). x is
  loaded once per step and split into even/odd k; products are summed per group in fp32 and each
  group's sum is multiplied by its scale once; the cross-group sum happens after the K loop. The
  loop is software-pipelined ``num_stages`` deep (``tl.range``: codes and x arrive by cp.async), which
  keeps enough bytes in flight per SM; code-book gathers sit behind an always-taken runtime branch so
  that neither pipeliner stages them through shared memory.
* ``block_m >= 16``: ``tl.dot`` tiles. Codes are read transposed as the B operand, decoded to
  value * scale in fp32 and cast to x's dtype; two dots per K tile over the even and odd k (x_even,
  x_odd by strided loads), so nibbles are never interleaved. fp32 activations use IEEE dots. Each
  W element must be finite in fp32 and, for fp16 activations, fit fp16 (true of real checkpoints,
  not of e8m0 scales far from 2^0: E = 254 with |value| >= 2 is inf in fp32, E = 0 underflows fp16);
  the GEMV scales group sums of value * x instead, so only its result has to fit.

``block_k`` and ``group`` are powers of two, so one divides the other: a K tile covers
``block_k / group`` whole groups or lies inside one group. K need not be a multiple of ``block_k``
(the last tile is masked) and N, M need not be multiples of the tile (rows are clamped for the
loads, masked for the stores). ``split_k`` > 1 spreads the K tiles over programs and reduces with
fp32 atomics (:func:`.common.output_buffers`, :func:`.common.finish_output`).
Offsets are int32: every operand must hold fewer than 2^31 elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    FLOAT_DTYPES,
    TileConfig,
    check_config,
    check_epilogue,
    dtype_name,
    empty_result,
    finish_output,
    output_buffers,
    store_tile,
    tile_grid,
)
from .launch import Launcher, cdiv, next_power_of_2

#: scale_kind -> the kernels' KIND constexpr
SCALE_KINDS = {"e4m3": 0, "e8m0": 1, "f32": 2}
#: the scale dtype each kind is stored as
_SCALE_DTYPES = {"e4m3": torch.uint8, "e8m0": torch.uint8, "f32": torch.float32}
#: the tile used when the caller passes none: a GEMV for one or two rows, tensor-core tiles beyond
DEFAULT_GEMV = TileConfig(1, 8, 512, 1, 4, 3)
DEFAULT_TILE = TileConfig(64, 64, 64, 1, 4, 3)
_MAX_GRID_Y = 65535  # CUDA's limit on grid dimension 1 (the GEMV's rows of x)
#: lut4_dequant's block: rows per program, codes per row per program (at most)
_DQ_ROWS, _DQ_CODES = 16, 512


# -- device helpers ----------------------------------------------------------------------------


@triton.jit
def _scale(c, KIND: tl.constexpr, E2M1: tl.constexpr):
    """Stored scales -> fp32, exact. e4m3 with e2m1 values returns the scale times 2^14 (the values'
    decode factor, folded into the constant: at most 448 * 2^14)."""
    if KIND == 0:
        b = c.to(tl.int32)
        f = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True)
        if E2M1:
            s = f.to(tl.float32) * 4194304.0  # 2^8 * 2^14
        else:
            s = f.to(tl.float32) * 256.0
    elif KIND == 1:
        e = c.to(tl.int32)
        s = ((e << 23) | ((e == 0).to(tl.int32) << 22)).to(tl.float32, bitcast=True)
    else:
        s = c.to(tl.float32)
    return s


@triton.jit
def _values(w, T, K, HIGH: tl.constexpr, E2M1: tl.constexpr):
    """The low (even k) or high (odd k) nibble of each code byte -> fp32 value; e2m1 gives the value
    times 2^-14 (see the module docstring), a table the entry itself (a gather that stays in L1)."""
    b = w.to(tl.int32)
    if E2M1:
        if HIGH:
            bits = ((b & 0x80) << 8) | ((b & 0x70) << 5)
        else:
            bits = ((b & 0x8) << 12) | ((b & 0x7) << 9)
        v = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        # Behind a runtime branch (always taken: K > 0) the gathers stay out of the software
        # pipeliner, which would otherwise stage every gathered value through shared memory.
        v = tl.zeros(w.shape, tl.float32)
        if K > 0:
            if HIGH:
                v = tl.load(T + (b >> 4))
            else:
                v = tl.load(T + (b & 0xF))
    return v


# -- GEMV (block_m == 1) -----------------------------------------------------------------------


@triton.jit
def _gemv_step(
    acc, x_row, w_rows, s_rows, T, t, K, stride_xk,
    G: tl.constexpr, GT: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr, E2M1: tl.constexpr,
    TAIL: tl.constexpr,
):  # fmt: skip
    """K tile ``t``: acc [BN, BK/GT] += per-group sums of value * x, times the group scales."""
    NG: tl.constexpr = BK // GT
    BN: tl.constexpr = acc.shape[0]
    kb = t * (BK // 2) + tl.arange(0, BK // 2)
    kb = tl.max_contiguous(tl.multiple_of(kb, BK // 2), BK // 2)
    kk = t * BK + tl.arange(0, BK)
    kk = tl.max_contiguous(tl.multiple_of(kk, BK), BK)
    gi = (t * BK + tl.arange(0, NG) * GT) // G
    if TAIL:
        w = tl.load(w_rows + kb[None, :], mask=(kb < K // 2)[None, :], other=0)
        sc = tl.load(s_rows + gi[None, :], mask=(gi < K // G)[None, :], other=0)
        xk = tl.load(x_row + kk * stride_xk, mask=kk < K, other=0.0)
    else:
        w = tl.load(w_rows + kb[None, :])
        sc = tl.load(s_rows + gi[None, :])
        xk = tl.load(x_row + kk * stride_xk)
    x_even, x_odd = tl.split(tl.reshape(xk.to(tl.float32), (BK // 2, 2)))
    p = _values(w, T, K, False, E2M1) * x_even[None, :] + _values(w, T, K, True, E2M1) * x_odd[None, :]
    part = tl.sum(tl.reshape(p, (BN, NG, GT // 2)), axis=2)
    if E2M1 and KIND != 0:
        part = part * 16384.0  # e2m1's 2^14, once per group (folded into the scale for e4m3)
    return acc + part * _scale(sc, KIND, E2M1)


@triton.jit
def _lut4_gemv_kernel(
    X, W, S, T, R, B, Y,
    N, K,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_b, stride_ym, stride_yn,
    G: tl.constexpr, GT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
    KIND: tl.constexpr, E2M1: tl.constexpr, EVEN_K: tl.constexpr, HAS_R: tl.constexpr,
    HAS_B: tl.constexpr, ATOMIC: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Program (n-block, row of x, K split): BN rows of W streamed along K, no tensor cores."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rn = tl.minimum(offs_n, N - 1)  # clamped: unmasked loads, masked stores
    x_row = X + pid_m * stride_xm
    w_rows = W + rn[:, None] * stride_wn
    s_rows = S + rn[:, None] * stride_sn
    acc = tl.zeros((BN, BK // GT), dtype=tl.float32)
    n_full = K // BK
    # tl.range's num_stages pipelines the loads (cp.async), which the launch option alone does only for
    # loads that feed a dot
    for t in tl.range(pid_k, n_full, SPLIT_K, num_stages=STAGES):
        acc = _gemv_step(acc, x_row, w_rows, s_rows, T, t, K, stride_xk, G, GT, BK, KIND, E2M1, False)
    if not EVEN_K:
        if pid_k == n_full % SPLIT_K:  # the ragged last tile, by the program whose turn it is
            acc = _gemv_step(acc, x_row, w_rows, s_rows, T, n_full, K, stride_xk, G, GT, BK, KIND, E2M1, True)
    y = tl.sum(acc, axis=1)
    if HAS_R:
        y = y * tl.load(R + rn)
    offs_m = pid_m + tl.arange(0, 1)
    store_tile(
        y[None, :], B, Y, offs_m, offs_n, offs_m == pid_m, offs_n < N, pid_k, stride_b, stride_ym, stride_yn,
        HAS_B, ATOMIC,
    )  # fmt: skip


_lut4_gemv_launch = Launcher(_lut4_gemv_kernel)


# -- tensor-core tiles (block_m >= 16) ---------------------------------------------------------


@triton.jit
def _scaled_half(w, s, T, K, HIGH: tl.constexpr, GT: tl.constexpr, KIND: tl.constexpr, E2M1: tl.constexpr):
    """One nibble of the transposed codes [BK/2, BN] -> value * scale in fp32; s is [BK/GT, BN]."""
    NG: tl.constexpr = s.shape[0]
    BKH: tl.constexpr = w.shape[0]
    BN: tl.constexpr = w.shape[1]
    v = _values(w, T, K, HIGH, E2M1)
    if E2M1 and KIND != 0:
        v = v * 16384.0
    if NG == 1:
        v = v * s
    else:
        v = tl.reshape(tl.reshape(v, (NG, GT // 2, BN)) * s[:, None, :], (BKH, BN))
    return v


@triton.jit
def _tile_step(
    acc, x_rows, w_cols, s_cols, T, t, K, stride_xk,
    G: tl.constexpr, GT: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr, E2M1: tl.constexpr,
    IEEE: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    """K tile ``t``: acc [BM, BN] += x_even @ W_even + x_odd @ W_odd (W decoded with its scales)."""
    NG: tl.constexpr = BK // GT
    kb = t * (BK // 2) + tl.arange(0, BK // 2)
    kb = tl.max_contiguous(tl.multiple_of(kb, BK // 2), BK // 2)
    gi = (t * BK + tl.arange(0, NG) * GT) // G
    w_ptrs = w_cols + kb[:, None]
    xe_ptrs = x_rows + (2 * kb)[None, :] * stride_xk
    if TAIL:
        mk = kb < K // 2
        w = tl.load(w_ptrs, mask=mk[:, None], other=0)
        sc = tl.load(s_cols + gi[:, None], mask=(gi < K // G)[:, None], other=0)
        x_even = tl.load(xe_ptrs, mask=mk[None, :], other=0.0)
        x_odd = tl.load(xe_ptrs + stride_xk, mask=mk[None, :], other=0.0)
    else:
        w = tl.load(w_ptrs)
        sc = tl.load(s_cols + gi[:, None])
        x_even = tl.load(xe_ptrs)
        x_odd = tl.load(xe_ptrs + stride_xk)
    s = _scale(sc, KIND, E2M1)
    w_even = _scaled_half(w, s, T, K, False, GT, KIND, E2M1).to(x_even.dtype)
    w_odd = _scaled_half(w, s, T, K, True, GT, KIND, E2M1).to(x_even.dtype)
    if IEEE:
        acc = tl.dot(x_even, w_even, acc, input_precision="ieee")
        acc = tl.dot(x_odd, w_odd, acc, input_precision="ieee")
    else:
        acc = tl.dot(x_even, w_even, acc)
        acc = tl.dot(x_odd, w_odd, acc)
    return acc


@triton.jit
def _lut4_tile_kernel(
    X, W, S, T, R, B, Y,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_b, stride_ym, stride_yn,
    G: tl.constexpr, GT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SPLIT_K: tl.constexpr, KIND: tl.constexpr, E2M1: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_R: tl.constexpr, HAS_B: tl.constexpr, ATOMIC: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rm = tl.minimum(offs_m, M - 1)  # clamped: unmasked loads, masked stores
    rn = tl.minimum(offs_n, N - 1)
    x_rows = X + rm[:, None] * stride_xm
    w_cols = W + rn[None, :] * stride_wn
    s_cols = S + rn[None, :] * stride_sn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    n_full = K // BK
    for t in range(pid_k, n_full, SPLIT_K):
        acc = _tile_step(acc, x_rows, w_cols, s_cols, T, t, K, stride_xk, G, GT, BK, KIND, E2M1, IEEE, False)
    if not EVEN_K:
        if pid_k == n_full % SPLIT_K:
            acc = _tile_step(
                acc, x_rows, w_cols, s_cols, T, n_full, K, stride_xk, G, GT, BK, KIND, E2M1, IEEE, True
            )
    if HAS_R:
        acc = acc * tl.load(R + rn)[None, :]
    store_tile(
        acc,
        B,
        Y,
        offs_m,
        offs_n,
        offs_m < M,
        offs_n < N,
        pid_k,
        stride_b,
        stride_ym,
        stride_yn,
        HAS_B,
        ATOMIC,
    )


_lut4_tile_launch = Launcher(_lut4_tile_kernel)


# -- dequantization (rows of W, for a cuBLAS GEMM at large M) ----------------------------------


@triton.jit
def _lut4_dequant_kernel(
    W, S, T, R, Y,
    n0, rows, K,
    stride_wn, stride_sn, stride_yn,
    G: tl.constexpr, GT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr,
    E2M1: tl.constexpr, HAS_R: tl.constexpr,
):  # fmt: skip
    """Program (row block, K block): W[n0 + r, k] = (value * scale) * row_scale, in Y's dtype."""
    NG: tl.constexpr = BK // GT
    offs_r = tl.program_id(0) * BR + tl.arange(0, BR)
    rn = n0 + tl.minimum(offs_r, rows - 1)
    pid_k = tl.program_id(1)
    kb = pid_k * (BK // 2) + tl.arange(0, BK // 2)
    gi = (pid_k * BK + tl.arange(0, NG) * GT) // G
    w = tl.load(W + rn[:, None] * stride_wn + kb[None, :], mask=(kb < K // 2)[None, :], other=0)
    sc = tl.load(S + rn[:, None] * stride_sn + gi[None, :], mask=(gi < K // G)[None, :], other=0)
    s = _scale(sc, KIND, E2M1)[:, :, None]
    lo = _values(w, T, K, False, E2M1)
    hi = _values(w, T, K, True, E2M1)
    if E2M1 and KIND != 0:
        lo = lo * 16384.0
        hi = hi * 16384.0
    lo = tl.reshape(tl.reshape(lo, (BR, NG, GT // 2)) * s, (BR, BK // 2))
    hi = tl.reshape(tl.reshape(hi, (BR, NG, GT // 2)) * s, (BR, BK // 2))
    if HAS_R:
        r = tl.load(R + rn)[:, None]
        lo = lo * r  # (value * scale) * row_scale: one rounding in fp32
        hi = hi * r
    v = tl.reshape(tl.join(lo, hi), (BR, BK))
    kk = pid_k * BK + tl.arange(0, BK)
    mask = (offs_r < rows)[:, None] & (kk < K)[None, :]
    tl.store(Y + offs_r[:, None] * stride_yn + kk[None, :], v.to(Y.dtype.element_ty), mask=mask)


_lut4_dequant_launch = Launcher(_lut4_dequant_kernel)


# -- host side ---------------------------------------------------------------------------------


def _is_pow2(v: object, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo and not v & (v - 1)


def _check_weight(
    codes: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    scale_kind: str,
    table: torch.Tensor | None,
    row_scale: torch.Tensor | None,
    K: int | None,
    device: torch.device,
    what: str,
) -> tuple[int, int]:
    """Validate the prepared weight; returns (N, K). ``K`` None: taken from the codes."""
    if scale_kind not in SCALE_KINDS:
        raise ValueError(f"{what}: scale_kind must be one of {', '.join(SCALE_KINDS)}, found {scale_kind!r}")
    if not _is_pow2(group, 2):
        raise ValueError(f"{what}: group must be a power of two >= 2, found {group!r}")
    if codes.dim() != 2 or codes.dtype != torch.uint8 or codes.device != device:
        raise ValueError(
            f"{what}: codes must be a 2-D uint8 [N, K/2] tensor on {device}, "
            f"found {dtype_name(codes.dtype)} {list(codes.shape)} on {codes.device}"
        )
    N = codes.shape[0]
    if K is None:
        K = 2 * codes.shape[1]
    if K % group:
        raise ValueError(f"{what}: the group size {group} must divide K={K}")
    if codes.shape[1] != K // 2 or (N > 1 and codes.shape[1] > 1 and codes.stride(1) != 1):
        raise ValueError(
            f"{what}: codes must be uint8 [N, {K // 2}] with unit column stride, "
            f"found {list(codes.shape)} strides {list(codes.stride())}"
        )
    want = _SCALE_DTYPES[scale_kind]
    if (
        scales.dtype != want
        or tuple(scales.shape) != (N, K // group)
        or scales.device != device
        or (K // group > 1 and scales.stride(1) != 1)
    ):
        raise ValueError(
            f"{what}: {scale_kind} scales must be {dtype_name(want)} [{N}, {K // group}] with unit column "
            f"stride on {device}, found {dtype_name(scales.dtype)} {list(scales.shape)} "
            f"strides {list(scales.stride())} on {scales.device}"
        )
    if table is not None and (
        table.dtype != torch.float32
        or tuple(table.shape) != (16,)
        or table.device != device
        or table.stride(0) != 1
    ):
        raise ValueError(
            f"{what}: table must be a contiguous float32 [16] code book on {device} (or None for e2m1), "
            f"found {dtype_name(table.dtype)} {list(table.shape)} on {table.device}"
        )
    if row_scale is not None and (
        row_scale.dtype != torch.float32
        or tuple(row_scale.shape) != (N,)
        or row_scale.device != device
        or (N > 1 and row_scale.stride(0) != 1)
    ):
        raise ValueError(
            f"{what}: row_scale must be a contiguous float32 [{N}] tensor on {device} (or None), "
            f"found {dtype_name(row_scale.dtype)} {list(row_scale.shape)} on {row_scale.device}"
        )
    return N, K


def _check_gemv_config(config: TileConfig, M: int, what: str) -> None:
    for field, lo in (("block_n", 1), ("block_k", 2)):
        v = getattr(config, field)
        if not _is_pow2(v, lo):
            raise ValueError(f"{what}: GEMV (block_m=1) {field} must be a power of two >= {lo}, found {v!r}")
    for field in ("split_k", "num_warps", "num_stages"):
        v = getattr(config, field)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{what}: {field} must be a positive integer, found {v!r}")
    if M > _MAX_GRID_Y:
        raise ValueError(f"{what}: the GEMV (block_m=1) takes at most {_MAX_GRID_Y} rows of x, found M={M}")


def lut4_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    scale_kind: str,
    table: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` in x's dtype, fp32 accumulation (W as in the module docstring).

    x [M, K] float16/bfloat16/float32, any strides. ``config.block_m == 1`` runs the GEMV (any M,
    one program row per row of x), else ``tl.dot`` tiles (block_m, block_n >= 16, block_k >= 32);
    None picks :data:`DEFAULT_GEMV` for M <= 2, :data:`DEFAULT_TILE` beyond. ``out``: an [M, N]
    tensor of x's dtype to write into (returned).
    """
    what = "lut4_matmul"
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{what}: x must be a 2-D float16/bfloat16/float32 [M, K] tensor, "
            f"found {dtype_name(x.dtype)} {list(x.shape)}"
        )
    M, K = x.shape
    N, _ = _check_weight(codes, scales, group, scale_kind, table, row_scale, K, x.device, what)
    if config is None:
        config = DEFAULT_GEMV if M <= 2 else DEFAULT_TILE
    gemv = config.block_m == 1
    if gemv:
        _check_gemv_config(config, M, what)
    else:
        check_config(config, 32, what)  # two dots over block_k / 2 >= 16
    check_epilogue(bias, out, x.dtype, M, N, x.device, what)
    if M == 0 or N == 0:  # nothing to launch (a zero-size grid is an error in some launchers)
        return (
            empty_result(N, x.dtype, out, x.device)
            if M == 0
            else (out if out is not None else x.new_empty(M, 0))
        )
    atomic = config.split_k > 1
    y, result = output_buffers(M, N, x.dtype, out, atomic, x.device)
    BK = config.block_k
    meta = dict(
        G=group, GT=min(group, BK), BK=BK, SPLIT_K=config.split_k, KIND=SCALE_KINDS[scale_kind],
        E2M1=table is None, EVEN_K=K % BK == 0, HAS_R=row_scale is not None, HAS_B=bias is not None,
        ATOMIC=atomic, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    args = (
        x, codes, scales, table if table is not None else scales, row_scale if row_scale is not None else scales,
        bias if bias is not None else scales, y,
    )  # fmt: skip
    strides = (
        x.stride(1), codes.stride(0), scales.stride(0), bias.stride(0) if bias is not None else 0,
        y.stride(0), y.stride(1),
    )  # fmt: skip
    if gemv:
        grid = (cdiv(N, config.block_n), M, config.split_k)
        _lut4_gemv_launch(
            grid, *args, N, K, x.stride(0), *strides, BN=config.block_n, STAGES=config.num_stages, **meta
        )
    else:
        _lut4_tile_launch(
            tile_grid(M, N, config), *args, M, N, K, x.stride(0), *strides,
            BM=config.block_m, BN=config.block_n, IEEE=x.dtype == torch.float32, **meta,
        )  # fmt: skip
    return finish_output(y, result)


def lut4_dequant(
    codes: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    scale_kind: str,
    table: torch.Tensor | None,
    row_scale: torch.Tensor | None,
    dtype: torch.dtype,
    n0: int,
    n1: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``n0:n1`` of W as [n1 - n0, K] in ``dtype``, computed as ``(value * scale) * row_scale``
    in fp32 (exact for fp32 output: one rounding, by the row scale). ``out``: a [n1 - n0, K] tensor
    of ``dtype`` with unit column stride to write into (returned)."""
    what = "lut4_dequant"
    N, K = _check_weight(codes, scales, group, scale_kind, table, row_scale, None, codes.device, what)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{what}: dtype must be float16, bfloat16 or float32, found {dtype}")
    if not (isinstance(n0, int) and isinstance(n1, int) and 0 <= n0 <= n1 <= N):
        raise ValueError(f"{what}: rows must satisfy 0 <= n0 <= n1 <= N={N}, found n0={n0!r}, n1={n1!r}")
    rows = n1 - n0
    if out is None:
        out = torch.empty(rows, K, dtype=dtype, device=codes.device)
    elif (
        out.dtype != dtype
        or tuple(out.shape) != (rows, K)
        or out.device != codes.device
        or (K > 1 and rows > 0 and out.stride(1) != 1)
    ):
        raise ValueError(
            f"{what}: out must be {dtype_name(dtype)} [{rows}, {K}] with unit column stride on {codes.device}, "
            f"found {dtype_name(out.dtype)} {list(out.shape)} strides {list(out.stride())} on {out.device}"
        )
    if rows == 0 or K == 0:
        return out
    BK = min(next_power_of_2(K), _DQ_CODES)
    _lut4_dequant_launch(
        (cdiv(rows, _DQ_ROWS), cdiv(K, BK)),
        codes, scales, table if table is not None else scales, row_scale if row_scale is not None else scales, out,
        n0, rows, K, codes.stride(0), scales.stride(0), out.stride(0),
        G=group, GT=min(group, BK), BR=_DQ_ROWS, BK=BK, KIND=SCALE_KINDS[scale_kind], E2M1=table is None,
        HAS_R=row_scale is not None, num_warps=4, num_stages=1,
    )  # fmt: skip
    return out
