"""A fused dequantize-in-the-main-loop tensor-core GEMM for llama.cpp's GGUF weights, for large batches.

Until now large batches dequantized the whole weight to 16-bit slices and called cuBLAS
(``backends/cuda/dense_slices.py``): a full 16-bit write and read of the weight on top of the
GEMM. :func:`gguf_gemm` instead reads only the compressed planes of
:func:`quantrt.backends.triton.gguf.gguf_planes` (per-field tensors [N, ...], llama.cpp's bytes),
decodes a [block_n, block_k] weight tile inside its K loop and feeds it to ``tl.dot``.

**Program.** One program owns a [block_m, block_n] output tile and walks all of K in ``block_k``
steps, accumulating in fp32. The product is computed transposed, ``acc[BN, BM] += W_tile @ x_tile^T``:
the decoded weight (produced in registers) is the dot's A operand, which Hopper's wgmma can take
from registers, and x, loaded by plain tile loads, is B; the weight rows are the MMA's M dimension
(64 per warp group), so small batches (block_m 16 or 32) still fill it. Programs are ordered in
groups of ``group_m`` M tiles (the M tiles of one group vary fastest), so the programs that share a
weight tile run together and find it in L2, and a group's x rows stay in L2 across its N tiles.

**Natural k order.** Each weight tile is decoded into natural k order, so the x tile is one
contiguous [block_m, block_k] load (any strides) with no permutation. Per type the tile's plane
bytes are read as contiguous runs (each byte once per tile) into a small multi-dimensional tensor
whose trailing dimensions are the byte's position in its run; the fields packed into a byte (two
nibbles, or a 2-bit field per 32 elements) are spread over an extra dimension by broadcasting the
bytes against small constant shift tensors; sub-block scales enter the same way, with size 1 along
the dimensions they are constant over. The leading-to-trailing order of those dimensions is
natural k order, so a final ``reshape`` gives [block_n, block_k]:

==========  ========================================================================================
q4_0..q5_1  [BN, G, 2 (nibble), 16 (byte j)], G = block_k/32 blocks: qs byte j of a block holds
            element j (low nibble) and 16 + j (high); q5's fifth bit of element e is bit e of the
            block's u32 qh; the block's d (and m) [BN, G, 1, 1]
q8_0        [BN, G, 32]: int8 codes already in natural order, times d [BN, G, 1]
q4_k, q5_k  [BN, C, 2 (nibble), 32 (byte l)], C = block_k/64 chunks of 64 elements: qs byte 32c + l
            of a block holds element 64c + l (low nibble) and 64c + 32 + l (high), sub-block 2c + nib;
            its 6-bit scale and min are cut from the 16-byte head (d, dmin, 12 scale bytes; four
            int32 loads per row); q5_k's fifth bit of element 32s + l is bit s of qh[l]
            (qh [BN, 1, 1, 32], one load per tile); value ``d*sc*q - dmin*m``
q6_k        [BN, H, P, 2 (a), 2 (q), 16 (u)]: H half blocks of 128 elements, P nibbles (block_k 64
            covers one nibble of a half block); ql byte 32a + 16q + u of a half block holds element
            64*nib + 32a + 16q + u, whose upper two bits are bits 2j..2j+1 (j = 2*nib + a) of qh byte
            16q + u; the int8 scale of 16 elements [BN, H, P, 2, 2, 1]; value ``d*sc*(q - 32)``
==========  ========================================================================================

Every value is computed in fp32 with llama.cpp's formulas (the reference dequantizers in
:mod:`quantrt.reference.gguf`; codes become floats exactly by an OR and an FADD instead of an
int-to-float conversion), then rounded once to the activation dtype for the dot (fp32 activations
multiply in IEEE fp32). A K-quant tile lies inside one 256-element block (block_k 64, 128 or 256
divides 256 and hence K); a legacy type's K (a multiple of 32) may leave a partial last tile, which
runs masked: missing blocks load codes and d (and m) as 0, so their weights are exactly 0, and x
past K loads as 0. Weight rows past N and x rows past M are clamped (their results are never
stored), so the main loop's loads carry no masks. Offsets inside a plane row are int32; the row
bases, x's and y's offsets are 64-bit.

Layers get their tiles from ``cuda.triton_gguf``'s table (``tunings/gguf_<arch>.json``, swept by
``bench/gpu_gguf_gemm.py --table`` over :func:`gemm_candidates`); :func:`default_gemm_config` is the
fallback of direct calls. On the H200 the GEMM beat dequant + cuBLAS up to 16-128 rows depending on
the type, and lost at 256 (cuBLAS's 750 TFLOP/s against the decode in the K loop).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from quantrt.prepared import StrategyFn

from .bound import Runner, bind_one, bound_strategy
from .common import check_epilogue, empty_result
from .gguf import BLOCKS, _check_nk, _check_x, _padded, _plane_list, _type
from .launch import Call, Launcher, cdiv

#: the types the GEMM decodes, with their kernel ids (the constexpr QT)
GEMM_TYPES: dict[str, int] = {
    "q4_0": 0,
    "q4_1": 1,
    "q5_0": 2,
    "q5_1": 3,
    "q8_0": 4,
    "q4_k": 7,
    "q5_k": 8,
    "q6_k": 9,
}
_MAX_PLANES = 4


@dataclass(frozen=True)
class GemmConfig:
    """One launch of :func:`gguf_gemm`.

    block_m: x rows per program (the MMA's N side); block_n: weight rows per program (the MMA's M
    side); block_k: K elements per loop step (legacy types: 32 to 256, K-quants: 64, 128 or 256,
    powers of two); group_m: M tiles per group of the program order (1: plain row-major order)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8


def _gemm_type(gguf_type: str) -> str:
    t = _type(gguf_type)
    if t not in GEMM_TYPES:
        raise ValueError(
            f"gguf_gemm: GGUF type {t!r} is not supported by the fused GEMM; supported: {', '.join(GEMM_TYPES)}"
        )
    return t


def _min_block_k(t: str) -> int:
    return 32 if BLOCKS[t][0] == 32 else 64


def default_gemm_config(gguf_type: str, M: int) -> GemmConfig:
    """The tile :func:`gguf_gemm` uses when given none: x rows per program grow with M (16 .. 128),
    128 weight rows, 128 K elements per step (an untuned Hopper guess; see :func:`gemm_candidates`)."""
    _gemm_type(gguf_type)
    if M <= 16:
        return GemmConfig(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=4)
    if M <= 32:
        return GemmConfig(block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=4)
    if M <= 64:
        return GemmConfig(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3)
    return GemmConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3)


#: (block_m, block_n, block_k, num_warps, num_stages) for a Hopper sweep; the decoded fp32 tile
#: (block_n * block_k) stays within 128 values per thread; block_m 256 (one M tile at M=256: each
#: weight tile decoded once) was added after the first H200 sweep
_CANDIDATES = (
    (16, 64, 128, 4, 4),
    (16, 128, 64, 4, 4),
    (16, 128, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (32, 128, 128, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 128, 128, 8, 3),
    (64, 256, 64, 8, 3),
    (128, 64, 128, 4, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (128, 256, 64, 8, 3),
    (64, 64, 256, 4, 3),
    (128, 64, 256, 8, 3),
    (256, 64, 64, 8, 3),
    (256, 64, 128, 8, 3),
    (256, 32, 128, 8, 4),
)


def gemm_candidates(gguf_type: str, M: int | None = None) -> list[GemmConfig]:
    """Tiles worth timing on a Hopper GPU for this type (block_m 16..256, block_n 32..256, block_k
    64..256, 4 or 8 warps, 3 or 4 stages); every one is valid for the type. With ``M``, only tiles
    of at most max(32, M rounded up to a power of two) rows: taller ones only compute padding."""
    _gemm_type(gguf_type)
    top = max(32, 1 << max(0, (M or 1 << 30) - 1).bit_length())
    return [GemmConfig(bm, bn, bk, nw, ns) for bm, bn, bk, nw, ns in _CANDIDATES if bm <= top]


def _check_gemm_config(config: GemmConfig, t: str) -> None:
    if not isinstance(config, GemmConfig):
        raise ValueError(f"gguf_gemm: config must be a GemmConfig, found {type(config).__name__}")
    lo_k = _min_block_k(t)
    for field, lo, hi in (("block_m", 16, 256), ("block_n", 16, 256), ("block_k", lo_k, 256)):
        v = getattr(config, field)
        if not isinstance(v, int) or v < lo or v > hi or v & (v - 1):
            raise ValueError(
                f"gguf_gemm: {field} must be a power of two from {lo} to {hi} for {t}, found {v!r}"
            )
    nw = config.num_warps
    if not isinstance(nw, int) or nw < 1 or nw > 16 or nw & (nw - 1):
        raise ValueError(f"gguf_gemm: num_warps must be a power of two from 1 to 16, found {nw!r}")
    for field in ("num_stages", "group_m"):
        v = getattr(config, field)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"gguf_gemm: {field} must be a positive integer, found {v!r}")


# -- device helpers -----------------------------------------------------------------------------------


@triton.jit
def _ld(ptrs, valid, MASKED: tl.constexpr):
    """A plane load; with MASKED, entries not ``valid`` (blocks past K) read 0."""
    if MASKED:
        return tl.load(ptrs, mask=valid, other=0)
    return tl.load(ptrs)


@triton.jit
def _codes(c, OFFSET: tl.constexpr):
    """int32 codes 0 <= c < 2^22 -> fp32 ``c - OFFSET`` exactly, by the exponent trick (an OR and an
    FADD) instead of an int-to-float conversion, which runs at a quarter of the FP32 rate."""
    return (c | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)


@triton.jit
def _f16_lo(w):
    """The f16 in the low 16 bits of int32 words, as fp32."""
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _tile_legacy(t, p0, p1, p2, p3, K, QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 MASKED: tl.constexpr):  # fmt: skip
    """q4_0, q4_1, q5_0, q5_1 (QT 0..3), K tile t -> fp32 [BN, BK] in natural k order."""
    g = tl.arange(0, BK // 32)[None, :, None, None]
    nib = tl.arange(0, 2)[None, None, :, None]
    j = tl.arange(0, 16)[None, None, None, :]
    blk = t * (BK // 32) + g
    valid = blk < K // 32
    if QT == 0:
        pqs = p1
    elif QT == 3:
        pqs = p3
    else:
        pqs = p2
    qs = _ld(pqs[:, None, None, None] + blk * 16 + j, valid, MASKED).to(tl.int32)  # [BN, G, 1, 16]
    q = (qs >> (4 * nib)) & 15
    if QT == 2:
        qh = _ld(p1[:, None, None, None] + blk, valid, MASKED)
        q = q | (((qh >> (16 * nib + j)) & 1) << 4)
    elif QT == 3:
        qh = _ld(p2[:, None, None, None] + blk, valid, MASKED)
        q = q | (((qh >> (16 * nib + j)) & 1) << 4)
    d = _ld(p0[:, None, None, None] + blk, valid, MASKED).to(tl.float32)  # [BN, G, 1, 1]
    if QT == 0:
        w = d * _codes(q, 8.0)
    elif QT == 2:
        w = d * _codes(q, 16.0)
    else:
        m = _ld(p1[:, None, None, None] + blk, valid, MASKED).to(tl.float32)
        w = d * _codes(q, 0.0) + m
    return tl.reshape(w, (BN, BK))


@triton.jit
def _tile_q8_0(t, p0, p1, K, BN: tl.constexpr, BK: tl.constexpr, MASKED: tl.constexpr):
    """q8_0, K tile t: int8 codes in natural order times the block's d -> fp32 [BN, BK]."""
    g = tl.arange(0, BK // 32)[None, :, None]
    l = tl.arange(0, 32)[None, None, :]  # noqa: E741 - the code's place in its block
    blk = t * (BK // 32) + g
    valid = blk < K // 32
    q = _ld(p1[:, None, None] + blk * 32 + l, valid, MASKED).to(tl.int32)  # [BN, G, 32]
    d = _ld(p0[:, None, None] + blk, valid, MASKED).to(tl.float32)  # [BN, G, 1]
    return tl.reshape(d * _codes(q + 128, 128.0), (BN, BK))


@triton.jit
def _tile_k45(t, p0, p1, p2, QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """q4_k, q5_k (QT 7, 8), K tile t (inside one 256-element block) -> fp32 [BN, BK]."""
    c = tl.arange(0, BK // 64)[None, :, None, None]
    nib = tl.arange(0, 2)[None, None, :, None]
    l = tl.arange(0, 32)[None, None, None, :]  # noqa: E741 - byte in the chunk's 32 qs bytes
    blk = (t * BK) // 256
    cg = (t * BK) // 64 + c  # the chunk's index in the row
    if QT == 7:
        qs = tl.load(p1[:, None, None, None] + cg * 32 + l).to(tl.int32)  # [BN, C, 1, 32]
    else:
        qs = tl.load(p2[:, None, None, None] + cg * 32 + l).to(tl.int32)
    q = (qs >> (4 * nib)) & 15  # [BN, C, 2, 32]
    s = 2 * (cg % 4) + nib  # sub-block of 32 within the block [1, C, 2, 1]
    if QT == 8:
        qh = tl.load(p1[:, None, None, None] + blk * 32 + l).to(tl.int32)  # [BN, 1, 1, 32]
        q = q | (((qh >> s) & 1) << 4)
    head = p0.to(tl.pointer_type(tl.int32)) + blk * 4  # [BN]: d | dmin, then the 12 scale bytes
    w0 = tl.load(head)
    sh = 8 * (s % 4)
    a = (tl.load(head + 1)[:, None, None, None] >> sh) & 255  # scale byte s % 4
    b = (tl.load(head + 2)[:, None, None, None] >> sh) & 255  # scale byte s % 4 + 4
    cc = (tl.load(head + 3)[:, None, None, None] >> sh) & 255  # scale byte s % 4 + 8
    high = s >= 4
    sc = tl.where(high, (cc & 15) | ((a >> 6) << 4), a & 63)
    mn = tl.where(high, (cc >> 4) | ((b >> 6) << 4), b & 63)
    d = _f16_lo(w0)[:, None, None, None]
    dmin = _f16_lo(w0 >> 16)[:, None, None, None]
    w = (d * _codes(sc, 0.0)) * _codes(q, 0.0) - dmin * _codes(mn, 0.0)
    return tl.reshape(w, (BN, BK))


@triton.jit
def _tile_q6_k(t, p0, p1, p2, p3, BN: tl.constexpr, BK: tl.constexpr):
    """q6_k, K tile t (inside one 256-element block) -> fp32 [BN, BK]. Dimensions [BN, H, P, a, q, u]
    (see the module docstring): element 128h + 64p + 32a + 16q + u of the tile."""
    H: tl.constexpr = (BK + 127) // 128
    P: tl.constexpr = BK // H // 64
    h = tl.arange(0, H)[None, :, None, None, None, None]
    p = tl.arange(0, P)[None, None, :, None, None, None]
    a = tl.arange(0, 2)[None, None, None, :, None, None]
    qq = tl.arange(0, 2)[None, None, None, None, :, None]
    u = tl.arange(0, 16)[None, None, None, None, None, :]
    k0 = t * BK
    hb = k0 // 128 + h  # the half block's index in the row
    nib = (k0 % 128) // 64 + p
    ql = tl.load(p0[:, None, None, None, None, None] + hb * 64 + 32 * a + 16 * qq + u).to(tl.int32)
    qh = tl.load(p1[:, None, None, None, None, None] + hb * 32 + 16 * qq + u).to(tl.int32)
    q = ((ql >> (4 * nib)) & 15) | (((qh >> (2 * (2 * nib + a))) & 3) << 4)  # [BN, H, P, 2, 2, 16]
    sc = tl.load(p2[:, None, None, None, None, None] + k0 // 16 + 8 * h + 4 * p + 2 * a + qq)
    d = tl.load(p3 + k0 // 256).to(tl.float32)[:, None, None, None, None, None]
    w = (d * sc.to(tl.float32)) * _codes(q, 32.0)
    return tl.reshape(w, (BN, BK))


@triton.jit
def _w_tile(t, p0, p1, p2, p3, K, QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            MASKED: tl.constexpr):  # fmt: skip
    """The decoded weight tile t, fp32 [BN, BK]."""
    if QT <= 3:
        w = _tile_legacy(t, p0, p1, p2, p3, K, QT, BN, BK, MASKED)
    elif QT == 4:
        w = _tile_q8_0(t, p0, p1, K, BN, BK, MASKED)
    elif QT == 9:
        w = _tile_q6_k(t, p0, p1, p2, p3, BN, BK)
    else:
        w = _tile_k45(t, p0, p1, p2, QT, BN, BK)
    return w


@triton.jit
def _gemm_step(acc, t, xbase, kk, stride_xk, p0, p1, p2, p3, K, QT: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """acc [BN, BM] += W tile t @ x tile t^T."""
    w = _w_tile(t, p0, p1, p2, p3, K, QT, BN, BK, MASKED).to(xbase.dtype.element_ty)
    k = t * BK + kk
    ptrs = xbase[:, None] + (k.to(tl.int64) * stride_xk)[None, :]
    if MASKED:
        xt = tl.load(ptrs, mask=(k < K)[None, :], other=0.0)
    else:
        xt = tl.load(ptrs)
    if IEEE:
        return tl.dot(w, tl.trans(xt), acc, input_precision="ieee")
    return tl.dot(w, tl.trans(xt), acc)


@triton.jit
def _gguf_gemm_kernel(
    X, P0, P1, P2, P3, Bias, Y,
    M, N, K,
    stride_xm, stride_xk, stride_b, stride_ym, stride_yn,
    S0, S1, S2, S3,
    QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_B: tl.constexpr, HAS_TAIL: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """y[M, N] = x @ dequant(W)^T (+ bias), one [BM, BN] output tile per program, grouped order."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    p0 = P0 + rows * S0
    p1 = P1 + rows * S1
    p2 = P2 + rows * S2
    p3 = P3 + rows * S3
    xbase = X + tl.minimum(offs_m, M - 1).to(tl.int64) * stride_xm
    kk = tl.arange(0, BK)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for t in range(0, K // BK):
        acc = _gemm_step(acc, t, xbase, kk, stride_xk, p0, p1, p2, p3, K, QT, BN, BK, IEEE, False)
    if HAS_TAIL:
        acc = _gemm_step(acc, K // BK, xbase, kk, stride_xk, p0, p1, p2, p3, K, QT, BN, BK, IEEE, True)
    mask_n = offs_n < N
    if HAS_B:
        acc += tl.load(Bias + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    y_ptrs = Y + offs_m.to(tl.int64)[None, :] * stride_ym + offs_n.to(tl.int64)[:, None] * stride_yn
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask_n[:, None] & (offs_m < M)[None, :])


_gemm_launch = Launcher(_gguf_gemm_kernel)


def gguf_gemm(
    x: torch.Tensor,
    planes: dict[str, torch.Tensor],
    gguf_type: str,
    N: int,
    K: int,
    bias: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x @ dequant(W).T (+ bias)`` on tensor cores, decoding the planes of
    :func:`~quantrt.backends.triton.gguf.gguf_planes` inside the K loop (no dense weight).

    x [M, K] fp16/bf16 (or fp32: an IEEE fp32 dot), any strides; y [M, N] in x's dtype, or written
    into ``out`` (any strides); fp32 accumulation, bias [N] added in fp32 before the cast. ``config``
    None takes :func:`default_gemm_config`."""
    t = _gemm_type(gguf_type)
    _check_nk(t, N, K, "gguf_gemm")
    _check_x(x, K, "gguf_gemm")
    ps, strides = _padded(_plane_list(planes, t, N, K, x.device, "gguf_gemm"), _MAX_PLANES)
    M = x.shape[0]
    if config is None:
        config = default_gemm_config(t, M)
    _check_gemm_config(config, t)
    check_epilogue(bias, out, x.dtype, M, N, x.device, "gguf_gemm")
    if M == 0:
        return empty_result(N, x.dtype, out, x.device)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    gemm_call(x, ps, strides, t, bias, y, config)()
    return y


def gemm_call(
    x: torch.Tensor,
    ps: list[torch.Tensor],
    strides: list[int],
    gguf_type: str,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    config: GemmConfig,
) -> Call:
    """The launch of :func:`gguf_gemm` into ``y``, unchecked (M >= 1): ``ps`` and ``strides`` the
    padded planes. Its first seven arguments are the pointers."""
    M, K = x.shape
    N = y.shape[1]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    return Call(_gemm_launch, (cdiv(M, bm) * cdiv(N, bn),), (
        x, *ps, bias if bias is not None else y, y,
        M, N, K,
        x.stride(0), x.stride(1), bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
        *strides,
    ), dict(
        QT=GEMM_TYPES[gguf_type], BM=bm, BN=bn, BK=bk, GROUP_M=config.group_m,
        HAS_B=bias is not None, HAS_TAIL=K % bk != 0, IEEE=x.dtype == torch.float32,
        num_warps=config.num_warps, num_stages=config.num_stages,
    ))  # fmt: skip


def gemm_strategy(config: GemmConfig) -> StrategyFn:
    """One layer's fused-GEMM strategy on ``config``: :func:`gguf_gemm`, and from a batch size's
    second call on its bound launch (:mod:`.bound`; no scratch)."""

    def checked(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        return gguf_gemm(x, lay.planes, lay.gguf_type, lay.N, lay.K, bias, config, out)

    return bound_strategy(functools.partial(_first_gemm, config), checked)


def _first_gemm(
    config: GemmConfig, lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor | None
) -> tuple[torch.Tensor, Runner | None]:
    """The fused GEMM, bound after its launch."""
    M, N, t = x.shape[0], lay.N, _gemm_type(lay.gguf_type)
    ps, strides = _padded(_plane_list(lay.planes, t, N, lay.K, x.device, "gguf_gemm"), _MAX_PLANES)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    call = gemm_call(x, ps, strides, t, bias, y, config)
    call()
    planes = tuple(p.data_ptr() for p in ps)
    run = bind_one(call, lambda xp, bp, yp, pp, cp: (xp, *planes, yp if bp is None else bp, yp),
                   M=M, N=N, out_dtype=x.dtype)  # fmt: skip
    return y, run
