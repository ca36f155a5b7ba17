"""Fused activation quantization for W8A8 kernels: one Triton launch and one pass over x per call
(dynamic per-tensor: an amax launch first), code for code equal to :mod:`quantrt.torchops` and
:mod:`quantrt.reference.activations`.

Numerics (the references'):

* dynamic scale ``s = amax / qmax`` in fp32 (IEEE division), 1 where that is 0, times
  ``scale_mult`` (2.0 where an e4m3fnuz device holds the scheme's e4m3 grid at half the value);
  ``qmax`` defaults to the scheme's 448 for fp8 (whatever the flavour) and 127 for int8;
* int8 codes: ``round-half-even(x / s)`` clamped to [-128, 127];
* fp8 codes: ``x / s`` saturated to the flavour's own largest value, then cast round-to-nearest-even.

Every division is ``div_rn`` (a GPU's default fp32 ``/`` may be approximate), so codes agree at
rounding boundaries. Rounding to the fp8 grid is done in fp32 arithmetic (``(v + c) - c`` with the
right ``c`` per binade) and the code bits are built with integer ops, so the codes do not depend on
a backend's float-to-fp8 conversion (Triton's interpreter rounds half up and loses the carry into
the exponent, and cannot convert to the fnuz types; other backends' rounding and saturation rules
need not match torch's), and every flavour, e4m3fnuz included, is tested on the CPU. On NVIDIA sm_89+ the hardware conversion (``cvt.rn.satfinite``,
round-to-nearest-even) is exact and cheaper, so e4m3fn/e5m2 use it there.

Nothing here synchronizes with the host (no ``.item()``, no branch on tensor values): launches can
be captured in CUDA graphs. Block sizes follow from K alone; nothing is tuned at run time.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantrt.torchops import SCHEME_FP8_MAX

from .launch import Call, Launcher, cdiv, next_power_of_2

INT8_QMAX = 127.0
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: a row up to this long is held in registers (one read of x); longer rows loop twice over K
_SINGLE_PASS_MAX = 8192
_LOOP_BLOCK = 4096
#: elements per program for short rows (several rows per program) and for token groups
_TILE = 4096
#: at most this many programs of the per-tensor amax reduction (each ends with one atomic)
_AMAX_PROGRAMS = 1024


@dataclass(frozen=True)
class Fp8Format:
    """An fp8 flavour as the kernels encode it: ``mant`` mantissa bits, ``emin`` the exponent of the
    smallest normal, ``nan`` the NaN code, ``neg_zero`` whether -0 exists (not in the fnuz types),
    ``tl_dtype`` Triton's type for the hardware cast, ``fmax`` the largest finite value (codes
    saturate there)."""

    mant: int
    emin: int
    nan: int
    neg_zero: bool
    tl_dtype: tl.dtype
    fmax: float


#: torch fp8 dtype -> encoding. Triton's names: e4m3fn = fp8e4nv, e5m2 = fp8e5, e4m3fnuz = fp8e4b8,
#: e5m2fnuz = fp8e5b16. The integer encoding serves all four on every backend and under the
#: interpreter (whose own fp8 casts are inexact, and which cannot convert the fnuz types at all).
FP8_FORMATS: dict[torch.dtype, Fp8Format] = {
    torch.float8_e4m3fn: Fp8Format(3, -6, 0x7F, True, tl.float8e4nv, 448.0),
    torch.float8_e5m2: Fp8Format(2, -14, 0x7F, True, tl.float8e5, 57344.0),
    torch.float8_e4m3fnuz: Fp8Format(3, -7, 0x80, False, tl.float8e4b8, 240.0),
    torch.float8_e5m2fnuz: Fp8Format(2, -15, 0x80, False, tl.float8e5b16, 57344.0),
}


# -- device helpers -------------------------------------------------------------------------------


@triton.jit
def _dynamic_scale(amax, qmax, scale_mult):
    """torchops.dynamic_scale(amax, qmax) * scale_mult, with an IEEE division."""
    s = tl.math.div_rn(amax, qmax)
    return tl.where(s == 0.0, 1.0, s) * scale_mult


@triton.jit
def _encode(x, s, INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
            EMIN: tl.constexpr, NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr):  # fmt: skip
    """Codes of fp32 ``x / s``: int8, fp8 through the hardware cast, or fp8 bits as uint8."""
    v = tl.math.div_rn(x, s)
    if INT8:
        v = tl.minimum(tl.maximum(v, -128.0), 127.0)
        # 1.5 * 2^23: the fp32 sum's ulp is 1, so IEEE addition rounds half to even (|v| <= 128)
        v = (v + 12582912.0) - 12582912.0
        code = v.to(tl.int8)
    else:
        v = tl.maximum(v, -FMAX, propagate_nan=tl.PropagateNan.ALL)
        v = tl.minimum(v, FMAX, propagate_nan=tl.PropagateNan.ALL)
        if HW_FP8:
            code = v.to(QTY, fp_downcast_rounding="rtne")
        else:
            code = _fp8_bits(v, MANT, EMIN, NAN, NEG_ZERO)
    return code


@triton.jit
def _fp8_bits(v, MANT: tl.constexpr, EMIN: tl.constexpr, NAN: tl.constexpr, NEG_ZERO: tl.constexpr):
    """The fp8 code (uint8) of fp32 v, |v| <= the flavour's max, rounded to nearest even."""
    vb = v.to(tl.int32, bitcast=True)
    sign = (vb >> 24) & 0x80
    a = vb & 0x7FFFFFFF
    # c = 1.5 * 2^(e - MANT + 23) with e the binade of |v| (at least the smallest normal's): the
    # sum's ulp is the fp8 spacing there, so (|v| + c) - c is |v| rounded half to even onto the
    # fp8 grid, subnormals included; a carry into the next binade comes out right.
    e = tl.maximum(a >> 23, EMIN + 127)
    c = (((e + (23 - MANT)) << 23) | 0x400000).to(tl.float32, bitcast=True)
    r = (a.to(tl.float32, bitcast=True) + c) - c
    rb = r.to(tl.int32, bitcast=True)
    normal = (rb >> (23 - MANT)) - ((126 + EMIN) << MANT)  # rebias the exponent: fp8 bias is 1 - EMIN
    # exact: r is a multiple of the subnormal step (the min keeps normals' unused value in range)
    sub = (tl.minimum(r, 2.0**EMIN) * (2.0 ** (MANT - EMIN))).to(tl.int32)
    code = tl.where(r >= 2.0**EMIN, normal, sub)
    if NEG_ZERO:
        code = code | sign
        code = tl.where(v != v, NAN | sign, code)
    else:
        code = tl.where(code == 0, code, code | sign)
        code = tl.where(v != v, NAN, code)
    return code.to(tl.uint8)


# -- kernels --------------------------------------------------------------------------------------


@triton.jit
def _per_token_kernel(
    X, Q, S,
    M, K, stride_xm, stride_xk, qmax, scale_mult,
    BM: tl.constexpr, BK: tl.constexpr, SINGLE: tl.constexpr, K64: tl.constexpr,
    INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """BM rows per program: amax per row, the scale, the codes. SINGLE: the row fits one block and
    stays in registers; otherwise a first loop finds amax and a second re-reads x (from L2)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    mask_m = rows < M
    rows64 = rows.to(tl.int64)
    x_row = X + rows64[:, None] * stride_xm
    q_row = Q + rows64[:, None] * K
    cols = tl.arange(0, BK)
    if K64:
        cols = cols.to(tl.int64)
    if SINGLE:
        mask = mask_m[:, None] & (cols[None, :] < K)
        x = tl.load(x_row + cols[None, :] * stride_xk, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        s = _dynamic_scale(amax, qmax, scale_mult)
        tl.store(S + rows, s, mask=mask_m)
        q = _encode(x, s[:, None], INT8, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
        tl.store(q_row + cols[None, :], q, mask=mask)
    else:
        acc = tl.zeros((BM, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + cols
            mask = mask_m[:, None] & (kk[None, :] < K)
            x = tl.load(x_row + kk[None, :] * stride_xk, mask=mask, other=0.0).to(tl.float32)
            acc = tl.maximum(acc, tl.abs(x))
        s = _dynamic_scale(tl.max(acc, axis=1), qmax, scale_mult)
        tl.store(S + rows, s, mask=mask_m)
        for k0 in range(0, K, BK):
            kk = k0 + cols
            mask = mask_m[:, None] & (kk[None, :] < K)
            x = tl.load(x_row + kk[None, :] * stride_xk, mask=mask, other=0.0).to(tl.float32)
            q = _encode(x, s[:, None], INT8, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
            tl.store(q_row + kk[None, :], q, mask=mask)


_per_token_launch = Launcher(_per_token_kernel)


@triton.jit
def _per_group_kernel(
    X, Q, S,
    K, NG, stride_xm, stride_xk, qmax,
    GROUP: tl.constexpr, GP: tl.constexpr, GB: tl.constexpr, K64: tl.constexpr,
    HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """One row and GB groups of GROUP channels per program (a [GB, GP] tile, GP the power of two
    at or above GROUP): per-group amax, scale (reference: 1 where amax is not > 0), codes."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    j = tl.arange(0, GP)
    k = g[:, None] * GROUP + j[None, :]
    if K64:
        k = k.to(tl.int64)
    mask = (j[None, :] < GROUP) & (k < K)
    x = tl.load(X + row * stride_xm + k * stride_xk, mask=mask, other=0.0).to(tl.float32)
    s, q = _group_codes(x, qmax, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
    tl.store(S + row * NG + g, s, mask=g < NG)
    tl.store(Q + row * K + k, q, mask=mask)


@triton.jit
def _group_codes(
    x, qmax, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """fp32 groups [GB, GP] (padding zero) -> each group's scale (amax / qmax, 1 where amax is not
    > 0) and the fp8 codes."""
    amax = tl.max(tl.abs(x), axis=1)
    s = tl.where(amax > 0.0, tl.math.div_rn(amax, qmax), 1.0)
    return s, _encode(x, s[:, None], False, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)


_per_group_launch = Launcher(_per_group_kernel)


@triton.jit
def _amax_kernel(
    X, A, M, K, stride_xm, stride_xk,
    BM: tl.constexpr, BK: tl.constexpr, K64: tl.constexpr,
):  # fmt: skip
    """Global amax into A (fp32, zero-initialized): each program reduces its share of [BM, BK]
    tiles (grid-strided, so a bounded grid covers any M), then one atomic max. The values are
    non-negative, which float atomic max handles on every backend."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_k * BK + tl.arange(0, BK)
    if K64:
        cols = cols.to(tl.int64)
    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for m0 in range(pid_m * BM, M, tl.num_programs(0) * BM):
        rows = m0 + tl.arange(0, BM)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        ptrs = X + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk
        acc = tl.maximum(acc, tl.abs(tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)))
    tl.atomic_max(A, tl.max(tl.max(acc, axis=1), axis=0))


_amax_launch = Launcher(_amax_kernel)


@triton.jit
def _per_tensor_kernel(
    X, Q, SCALE, A,
    M, K, stride_xm, stride_xk, qmax, scale_mult,
    BM: tl.constexpr, BK: tl.constexpr, K64: tl.constexpr, FROM_AMAX: tl.constexpr,
    INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """Codes of x with one scale: read from SCALE (static), or made from the amax in A, in which
    case program (0, 0) also writes it to SCALE."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    if FROM_AMAX:
        s = _dynamic_scale(tl.load(A), qmax, scale_mult)
        if (pid_m == 0) & (pid_k == 0):
            tl.store(SCALE, s)
    else:
        s = tl.load(SCALE).to(tl.float32)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_k * BK + tl.arange(0, BK)
    if K64:
        cols = cols.to(tl.int64)
    rows64 = rows.to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(X + rows64[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
    q = _encode(x.to(tl.float32), s, INT8, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
    tl.store(Q + rows64[:, None] * K + cols[None, :], q, mask=mask)


_per_tensor_launch = Launcher(_per_tensor_kernel)


# -- launchers ------------------------------------------------------------------------------------


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _nvidia_fp8_cvt(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (8, 9)


def _use_hw_fp8_cast(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """The hardware cast where it is known exact (NVIDIA sm_89+: cvt.rn.satfinite for e4m3fn and
    e5m2); the integer encoding everywhere else. Tests patch this to run both paths on a GPU."""
    if not x.is_cuda or _interpreted() or dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return False
    return _nvidia_fp8_cvt(x.device.index if x.device.index is not None else torch.cuda.current_device())


def _check_x(x: torch.Tensor, what: str) -> tuple[int, int]:
    if x.dim() != 2:
        raise ValueError(f"{what}: x must be 2-D [M, K], found shape {list(x.shape)}")
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"{what}: x must be float16, bfloat16 or float32, found {x.dtype}")
    return x.shape[0], x.shape[1]


def codes_meta(x: torch.Tensor, kind: str, fp8_dtype: torch.dtype, what: str) -> tuple[torch.dtype, dict]:
    """The codes' dtype (fp8 or int8) and the constexprs that pick the encoding for ``x``'s device."""
    if kind == "int8":
        meta = dict(INT8=True, HW_FP8=False, FMAX=127.0, MANT=0, EMIN=0, NAN=0, NEG_ZERO=False, QTY=tl.int8)
        return torch.int8, meta
    if kind != "fp8":
        raise ValueError(f"{what}: kind must be 'fp8' or 'int8', found {kind!r}")
    fmt = FP8_FORMATS.get(fp8_dtype)
    if fmt is None:
        raise ValueError(
            f"{what}: fp8_dtype must be one of "
            f"{', '.join(str(d).replace('torch.', '') for d in FP8_FORMATS)}, found {fp8_dtype}"
        )
    hw = _use_hw_fp8_cast(x, fp8_dtype)
    meta = dict(
        INT8=False, HW_FP8=hw, FMAX=fmt.fmax, MANT=fmt.mant, EMIN=fmt.emin, NAN=fmt.nan,
        NEG_ZERO=fmt.neg_zero, QTY=fmt.tl_dtype,
    )  # fmt: skip
    return fp8_dtype, meta


def _codes_args(x: torch.Tensor, kind: str, fp8_dtype: torch.dtype, what: str) -> tuple[torch.Tensor, dict]:
    """The output codes tensor [M, K] (fp8 or int8) and the constexprs of :func:`codes_meta`."""
    dtype, meta = codes_meta(x, kind, fp8_dtype, what)
    return torch.empty(x.shape, dtype=dtype, device=x.device), meta


def kernel_out(q: torch.Tensor, meta: dict) -> torch.Tensor:
    """The pointer the kernel stores to: fp8 codes go through a uint8 view unless cast in hardware."""
    return q if meta["INT8"] or meta["HW_FP8"] else q.view(torch.uint8)


def _qmax(kind: str, qmax: float | None) -> float:
    if qmax is not None:
        if not qmax > 0:
            raise ValueError(f"qmax must be positive, found {qmax}")
        return float(qmax)
    return INT8_QMAX if kind == "int8" else SCHEME_FP8_MAX


def _k64(x: torch.Tensor) -> bool:
    """Whether column offsets k * stride_k can leave int32 (row offsets are always int64)."""
    return (x.shape[1] - 1) * x.stride(1) >= 2**31


def _warps(elems: int) -> int:
    return 4 if elems <= 2048 else 8 if elems <= 8192 else 16


def quantize_per_token(
    x: torch.Tensor,
    kind: str,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    qmax: float | None = None,
    scale_mult: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token (row) quantization, the activation side of row-wise W8A8 GEMMs.

    x: [M, K] fp16/bf16/fp32, any strides. ``kind``: "fp8" (codes in ``fp8_dtype``) or "int8".
    Returns codes [M, K] (contiguous) and fp32 scales [M, 1], ``x ~= codes * scales``; equal code
    for code to torchops (``dynamic_scale(row amax, qmax) * scale_mult``, then quantize_fp8 /
    quantize_int8_per_token). One launch; rows up to 8192 channels are read once (held in registers).
    """
    M, K = _check_x(x, "quantize_per_token")
    q, meta = _codes_args(x, kind, fp8_dtype, "quantize_per_token")
    qm = _qmax(kind, qmax)
    s = torch.empty(M, 1, dtype=torch.float32, device=x.device)
    if M == 0:
        return q, s
    if K == 0:
        return q, s.fill_(scale_mult)  # an empty row's amax is 0: the scale of zeros
    per_token_call(x, kernel_out(q, meta), s, qm, scale_mult, meta)()
    return q, s


def per_token_call(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, qmax: float, scale_mult: float,
                   meta: dict) -> Call:  # fmt: skip
    """The launch of :func:`quantize_per_token` into given buffers, unchecked: x [M, K] with M, K >=
    1; q the codes [M, K] contiguous, as the kernel stores them (:func:`kernel_out`); s fp32, M
    elements; ``meta`` from :func:`codes_meta`."""
    M, K = x.shape
    p2 = next_power_of_2(K)
    single = p2 <= _SINGLE_PASS_MAX
    BK = p2 if single else _LOOP_BLOCK
    BM = max(1, min(_TILE // BK, 64)) if single else 1  # from K only: one compile per K
    return Call(_per_token_launch, (cdiv(M, BM),),
        (x, q, s, M, K, x.stride(0), x.stride(1), float(qmax), float(scale_mult)),
        dict(BM=BM, BK=BK, SINGLE=single, K64=_k64(x), num_warps=_warps(BM * BK), **meta),
    )  # fmt: skip


def quantize_per_token_group(
    x: torch.Tensor,
    group: int,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    qmax: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic fp8 quantization per token and group of ``group`` channels (DeepSeek-style 1 x group
    activation scales, as block-fp8 GEMMs consume them).

    Returns codes [M, K] in ``fp8_dtype`` and fp32 scales [M, ceil(K / group)] (row-major); a ragged
    last group has its own scale. ``s = amax / qmax`` (qmax default 448), 1 where amax is not > 0,
    as reference.activations does; codes saturate at the flavour's own largest value.
    """
    M, K = _check_x(x, "quantize_per_token_group")
    if group < 1:
        raise ValueError(f"quantize_per_token_group: group must be >= 1, found {group}")
    q, meta = _codes_args(x, "fp8", fp8_dtype, "quantize_per_token_group")
    out = kernel_out(q, meta)
    meta = {k: v for k, v in meta.items() if k != "INT8"}  # the group kernel is fp8 only
    qm = _qmax("fp8", qmax)
    ng = -(-K // group)
    s = torch.empty(M, ng, dtype=torch.float32, device=x.device)
    if M == 0 or K == 0:
        return q, s
    per_group_call(x, out, s, group, qm, meta)()
    return q, s


def per_group_call(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, qmax: float,
                   meta: dict) -> Call:  # fmt: skip
    """The launch of :func:`quantize_per_token_group` into given buffers, unchecked: x [M, K] with
    M, K >= 1; q the codes [M, K] contiguous as the kernel stores them; s fp32 [M, ceil(K / group)]
    contiguous; ``meta`` from :func:`codes_meta` without ``INT8`` (the group kernel is fp8 only)."""
    M, K = x.shape
    ng = -(-K // group)
    GP = next_power_of_2(group)
    GB = max(1, min(_TILE // GP, next_power_of_2(ng)))
    return Call(_per_group_launch, (M, cdiv(ng, GB)),
        (x, q, s, K, ng, x.stride(0), x.stride(1), float(qmax)),
        dict(GROUP=group, GP=GP, GB=GB, K64=_k64(x), num_warps=_warps(GB * GP), **meta),
    )  # fmt: skip


def _tensor_tiles(K: int) -> tuple[int, int]:
    BK = min(next_power_of_2(K), 1024)
    return max(1, _TILE // BK), BK


def quantize_static(
    x: torch.Tensor,
    scale: torch.Tensor,
    kind: str,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    fmax: float | None = None,
) -> torch.Tensor:
    """Codes of x with a static per-tensor scale (calibrated ``input_scale``): torchops'
    quantize_fp8 / quantize_int8_static code for code. ``scale``: one float element on x's device,
    any shape; it is read by the kernel, never by the host. ``fmax``: the magnitude fp8 codes
    saturate at (the flavour's max by default; e4m3fnuz holding the e4m3 grid at half the value
    saturates at 224, as e4m3 does at 448, and not at its own 240)."""
    _check_x(x, "quantize_static")
    if scale.numel() != 1 or not scale.is_floating_point():
        raise ValueError(
            f"quantize_static: scale must hold one float element, found {list(scale.shape)} {scale.dtype}"
        )
    if scale.device != x.device:
        raise ValueError(f"quantize_static: scale is on {scale.device}, x on {x.device}")
    q, meta = _codes_args(x, kind, fp8_dtype, "quantize_static")
    if fmax is not None and kind == "fp8":
        if not 0 < fmax <= meta["FMAX"]:
            raise ValueError(f"quantize_static: fmax must be in (0, {meta['FMAX']}], found {fmax}")
        meta["FMAX"] = float(fmax)
    if q.numel() == 0:
        return q
    static_call(x, kernel_out(q, meta), scale, meta)()
    return q


def static_call(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, meta: dict) -> Call:
    """The launch of :func:`quantize_static` into given buffers, unchecked: x [M, K] with M, K >= 1;
    q the codes [M, K] contiguous as the kernel stores them; ``scale`` one float element; ``meta``
    from :func:`codes_meta`, its ``FMAX`` the saturation magnitude."""
    M, K = x.shape
    BM, BK = _tensor_tiles(K)
    return Call(_per_tensor_launch, (cdiv(M, BM), cdiv(K, BK)),
        (x, q, scale, scale, M, K, x.stride(0), x.stride(1), 1.0, 1.0),
        dict(BM=BM, BK=BK, K64=_k64(x), FROM_AMAX=False, num_warps=_warps(BM * BK), **meta),
    )  # fmt: skip


def quantize_per_tensor(
    x: torch.Tensor,
    kind: str,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    qmax: float | None = None,
    scale_mult: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor quantization: ``s = dynamic_scale(amax(|x|), qmax) * scale_mult`` as a
    0-dim fp32 tensor, and the codes. Two launches (an amax reduction with one float atomic max
    per program into a zeroed buffer, then the quantization reading it) and no host sync. M = 0
    gives the scale of an all-zero x (``scale_mult``)."""
    M, K = _check_x(x, "quantize_per_tensor")
    q, meta = _codes_args(x, kind, fp8_dtype, "quantize_per_tensor")
    qm = _qmax(kind, qmax)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, s.fill_(scale_mult)  # amax of nothing taken as 0: the scale of zeros
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    BM, BK = _tensor_tiles(K)
    k64 = _k64(x)
    grid_k = cdiv(K, BK)
    # enough programs to fill a GPU, each reducing several row tiles before its one atomic
    grid_m = min(cdiv(M, BM), max(1, _AMAX_PROGRAMS // grid_k))
    _amax_launch(
        (grid_m, grid_k),
        x,
        amax,
        M,
        K,
        x.stride(0),
        x.stride(1),
        BM=BM,
        BK=BK,
        K64=k64,
        num_warps=_warps(BM * BK),
    )
    _per_tensor_launch((cdiv(M, BM), grid_k),
        x, kernel_out(q, meta), s, amax, M, K, x.stride(0), x.stride(1), qm, float(scale_mult),
        BM=BM, BK=BK, K64=k64, FROM_AMAX=True, num_warps=_warps(BM * BK), **meta,
    )  # fmt: skip
    return q, s
