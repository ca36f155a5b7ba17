"""llama.cpp's GGUF weight types in Triton: a fused dequantize-and-multiply GEMV for small M and a
dequantizer (for cuBLAS on large M), portable across GPU vendors.

**Planes.** quantrt stores a GGUF weight canonically as llama.cpp's native blocks, ``qweight`` uint8
[N, K/B*T] (see :mod:`quantrt.reference.gguf`). A native block is 18, 34 or 210 bytes, so its
fields are only 2-byte aligned. At load, :func:`gguf_planes` splits the blocks into per-field
tensors ("planes"), [N, ...] row-major and contiguous, holding exactly the same bytes (so the
memory is the same): each row of each plane starts 16-byte aligned whenever its byte length allows
it, and the kernels read codes and activations with vector loads. Planes per type (K elements per
row; llama.cpp's block order, which :data:`PLANES` lists with byte offsets):

==========  ========================================================================================
q4_0        d fp16 [N, K/32], qs uint8 [N, K/2]
q4_1        d fp16 [N, K/32], m fp16 [N, K/32], qs uint8 [N, K/2]
q5_0        d fp16 [N, K/32], qh int32 [N, K/32] (the block's u32), qs uint8 [N, K/2]
q5_1        d fp16 [N, K/32], m fp16 [N, K/32], qh int32 [N, K/32], qs uint8 [N, K/2]
q8_0        d fp16 [N, K/32], qs int8 [N, K]
q2_k        scales uint8 [N, K/16], qs uint8 [N, K/4], d fp16 [N, K/256], dmin fp16 [N, K/256]
q3_k        hmask uint8 [N, K/8], qs uint8 [N, K/4], scales uint8 [N, K/256*12], d fp16 [N, K/256]
q4_k        head uint8 [N, K/256*16] (d, dmin, 12 scale bytes: one 16-byte load), qs uint8 [N, K/2]
q5_k        head uint8 [N, K/256*16], qh uint8 [N, K/8], qs uint8 [N, K/2]
q6_k        ql uint8 [N, K/2], qh uint8 [N, K/4], scales int8 [N, K/16], d fp16 [N, K/256]
==========  ========================================================================================

**GEMV** (:func:`gguf_matmul`). One kernel for the ten types; the per-type decode is chosen by a
constexpr type id. A program owns ``block_m`` rows of x and ``block_n`` rows of the weight and
walks K ``block_k`` elements per iteration; ``split_k`` > 1 deals those iterations out over
programs, whose fp32 partial sums the launch reduces itself (:func:`.common.reduce_tile`). A K
tile of a plane is cut into *runs* of 8 consecutive code bytes; the tile is [runs, block_n, 8], lanes and warps along the runs, each
thread holding one run of each of its block_n rows (one 8-byte load per row) and the 8 matching
activations (one 16-byte load for fp16/bf16, shared by its rows). Codes are decoded in *plane
order*: a byte's two nibbles (or four 2-bit fields) are elements that are not adjacent in k, so
instead of interleaving them in registers, x is loaded at the matching permuted indices (x is tiny
and cached). Every element a run decodes to (per nibble or field) shares one sub-block scale, so
the products are summed per run first, ``sum_j q_j x_j``, and the scales apply to those sums, as
does the min / offset term through ``sum_j x_j`` (``d*sc*sum(q*x) - dmin*m*sum(x)``). Per-run sums
stay in a [runs, block_n, block_m] accumulator, reduced across lanes once after the K loop. A K
that is a multiple of 32 (legacy types) or 256 but not of ``block_k`` ends in one masked tile.
Weight rows past N and x rows past M are clamped (their results are never stored), so the main
loop's loads carry no masks; offsets are int32 except the 64-bit row bases.

With fewer runs per tile than threads (``block_k`` below :func:`auto_block_k`), codes and
activations get different layouts and Triton converts between them: correct, but slower; the
default ``block_k`` = 0 picks the matching tile.

**Dequantizer** (:func:`gguf_dequant`) decodes the same tiles and writes rows n0:n1 in natural k
order in fp16, bf16 or fp32, computing every value exactly as llama.cpp's reference dequantizers
do (the same products and the same final add), so fp32 output equals ``gguf.quants.dequantize``
bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from quantrt.prepared import StrategyFn

from .bound import Runner, bind_one, bound_strategy, regions
from .common import (
    FLOAT_DTYPES,
    TileCounters,
    check_epilogue,
    dtype_name,
    empty_result,
    reduce_tile,
    split_k_buffers,
)
from .launch import Call, Launcher, cdiv, next_power_of_2

#: type -> (elements per block, bytes per block), as quantrt.schemes.GGUF_TYPES
BLOCKS: dict[str, tuple[int, int]] = {
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "q2_k": (256, 84),
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
}

_F16, _U8, _I8, _I32 = torch.float16, torch.uint8, torch.int8, torch.int32

#: type -> its planes in block order: (name, byte offset in the block, bytes per block, dtype)
PLANES: dict[str, tuple[tuple[str, int, int, torch.dtype], ...]] = {
    "q4_0": (("d", 0, 2, _F16), ("qs", 2, 16, _U8)),
    "q4_1": (("d", 0, 2, _F16), ("m", 2, 2, _F16), ("qs", 4, 16, _U8)),
    "q5_0": (("d", 0, 2, _F16), ("qh", 2, 4, _I32), ("qs", 6, 16, _U8)),
    "q5_1": (("d", 0, 2, _F16), ("m", 2, 2, _F16), ("qh", 4, 4, _I32), ("qs", 8, 16, _U8)),
    "q8_0": (("d", 0, 2, _F16), ("qs", 2, 32, _I8)),
    "q2_k": (("scales", 0, 16, _U8), ("qs", 16, 64, _U8), ("d", 80, 2, _F16), ("dmin", 82, 2, _F16)),
    "q3_k": (("hmask", 0, 32, _U8), ("qs", 32, 64, _U8), ("scales", 96, 12, _U8), ("d", 108, 2, _F16)),
    "q4_k": (("head", 0, 16, _U8), ("qs", 16, 128, _U8)),
    "q5_k": (("head", 0, 16, _U8), ("qh", 16, 32, _U8), ("qs", 48, 128, _U8)),
    "q6_k": (("ql", 0, 128, _U8), ("qh", 128, 64, _U8), ("scales", 192, 16, _I8), ("d", 208, 2, _F16)),
}

#: type -> the plane names in the order the kernels take them
PLANE_NAMES: dict[str, tuple[str, ...]] = {t: tuple(p[0] for p in ps) for t, ps in PLANES.items()}

#: the kernels' constexpr type ids
_TYPE_ID = {t: i for i, t in enumerate(BLOCKS)}
_MAX_PLANES = 5
#: Triton's largest tensor (elements); the GEMV's biggest hold block_n * block_k / 8 * max(8, block_m)
_MAX_TILE = 1 << 20


@dataclass(frozen=True)
class GGUFConfig:
    """One GEMV launch configuration.

    block_m: rows of x per program (1, 2, 4 or 8); block_n: weight rows per program (a power of
    two); split_k: programs that share one output tile's K loop (> 1: their fp32 partial sums
    reduced in the launch); block_k: K elements per loop iteration, a power of two >= 256, or 0 (the
    default) for the type's fast tile, 32 runs of 8 code bytes per warp (:func:`auto_block_k`).

    Fast GEMV tiles keep every lane and warp along K (block_k >= auto_block_k) and few weight rows
    per thread (block_n 2..8): measured on an H200 at M = 1, block_n 4 with 2 warps (q8_0: 4)."""

    block_m: int
    block_n: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    block_k: int = 0


#: K elements per tile that put every lane and warp along K (see :func:`_xload`): 8-byte runs per
#: tile per element (q8_0: 1/8; 4/5-bit legacy, q4_k, q5_k: 1/16; q2_k, q3_k, q6_k: 1/32)
_RUNS_PER_K = {"q8_0": 8, "q4_k": 16, "q5_k": 16, "q2_k": 32, "q3_k": 32, "q6_k": 32}


def auto_block_k(gguf_type: str, num_warps: int) -> int:
    """The K tile that gives each thread one 8-byte run of codes per row: 32 runs per warp."""
    return max(256, 32 * num_warps * _RUNS_PER_K.get(_type(gguf_type), 16))


def default_config(gguf_type: str, M: int = 1) -> GGUFConfig:
    """The GEMV tile :func:`gguf_matmul` uses when given none (measured on an H200 at M = 1): 4 weight
    rows per program, two warps (four for q8_0), and the type's :func:`auto_block_k`."""
    t = _type(gguf_type)
    return GGUFConfig(block_m=min(8, next_power_of_2(max(M, 1))), block_n=4, split_k=1,
                      num_warps=4 if t == "q8_0" else 2, num_stages=3, block_k=0)  # fmt: skip


#: the dequantizer's tile: weight rows and K elements per program
_DEQ_BLOCK_N = 16
_DEQ_BLOCK_K = 256


# -- host helpers -------------------------------------------------------------------------------------


def _type(gguf_type: str) -> str:
    t = gguf_type.lower() if isinstance(gguf_type, str) else gguf_type
    if t not in BLOCKS:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; supported: {', '.join(BLOCKS)}")
    return t


def _check_nk(t: str, N: int, K: int, what: str) -> None:
    B = BLOCKS[t][0]
    if not isinstance(N, int) or N < 1:
        raise ValueError(f"{what}: N must be a positive int, found {N!r}")
    if not isinstance(K, int) or K < B or K % B:
        raise ValueError(f"{what}: K={K!r} must be a positive multiple of the {t} block size {B}")


def _plane_shape(t: str, size: int, dtype: torch.dtype, N: int, K: int) -> tuple[int, int]:
    B = BLOCKS[t][0]
    return N, K // B * size // dtype.itemsize


def gguf_planes(qweight: torch.Tensor, gguf_type: str, N: int, K: int) -> dict[str, torch.Tensor]:
    """Split native blocks uint8 [N, K/B*T] into per-field planes (the table in the module
    docstring): each [N, ...] row-major contiguous, together exactly qweight's bytes. Pure torch
    (byte slicing and views), on qweight's device."""
    t = _type(gguf_type)
    _check_nk(t, N, K, "gguf_planes")
    B, T = BLOCKS[t]
    nb = K // B
    if (
        not isinstance(qweight, torch.Tensor)
        or qweight.dtype != torch.uint8
        or tuple(qweight.shape) != (N, nb * T)
    ):
        found = (
            f"{qweight.dtype} {list(qweight.shape)}" if isinstance(qweight, torch.Tensor) else type(qweight)
        )
        raise ValueError(
            f"gguf_planes: {t} qweight for N={N}, K={K} must be uint8 [{N}, {nb * T}] "
            f"({nb} blocks of {T} bytes per row), found {found}"
        )
    blocks = qweight.reshape(N, nb, T)
    planes = {}
    for name, off, size, dtype in PLANES[t]:
        field = blocks[:, :, off : off + size].contiguous().reshape(N, nb * size)
        planes[name] = field.view(dtype)
    return planes


def plane_list(planes: dict[str, torch.Tensor], gguf_type: str) -> list[torch.Tensor]:
    """The planes in :data:`PLANE_NAMES` order (the order the CUDA GEMV of ``backends/cuda`` takes them)."""
    return [planes[n] for n in PLANE_NAMES[_type(gguf_type)]]


def _plane_list(
    planes: dict[str, torch.Tensor], t: str, N: int, K: int, device: torch.device, what: str
) -> list:
    if not isinstance(planes, dict) or set(planes) != set(PLANE_NAMES[t]):
        found = sorted(planes) if isinstance(planes, dict) else type(planes).__name__
        raise ValueError(f"{what}: {t} planes must be a dict of {list(PLANE_NAMES[t])}, found {found}")
    out = []
    for name, _, size, dtype in PLANES[t]:
        p = planes[name]
        shape = _plane_shape(t, size, dtype, N, K)
        if (
            not isinstance(p, torch.Tensor)
            or p.dtype != dtype
            or tuple(p.shape) != shape
            or not p.is_contiguous()
            or p.device != device
        ):
            found = (
                f"{dtype_name(p.dtype)} {list(p.shape)} on {p.device}" if isinstance(p, torch.Tensor) else p
            )
            raise ValueError(
                f"{what}: {t} plane {name!r} must be a contiguous {dtype_name(dtype)} {list(shape)} "
                f"tensor on {device} (from gguf_planes), found {found}"
            )
        out.append(p)
    return out


def _check_config(config: GGUFConfig) -> None:
    if not isinstance(config, GGUFConfig):
        raise ValueError(f"gguf_matmul: config must be a GGUFConfig, found {type(config).__name__}")
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if bm not in (1, 2, 4, 8):
        raise ValueError(f"gguf_matmul: block_m must be 1, 2, 4 or 8, found {bm!r}")
    if not isinstance(bn, int) or bn < 1 or bn & (bn - 1):
        raise ValueError(f"gguf_matmul: block_n must be a power of two, found {bn!r}")
    if not isinstance(bk, int) or (bk != 0 and (bk < 256 or bk & (bk - 1))):
        raise ValueError(f"gguf_matmul: block_k must be 0 (auto) or a power of two >= 256, found {bk!r}")
    nw = config.num_warps
    if not isinstance(nw, int) or nw < 1 or nw > 32 or nw & (nw - 1):
        raise ValueError(f"gguf_matmul: num_warps must be a power of two from 1 to 32, found {nw!r}")
    for field in ("split_k", "num_stages"):
        v = getattr(config, field)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"gguf_matmul: {field} must be a positive integer, found {v!r}")


def _groups(t: str, block_k: int) -> int:
    """8-byte runs of codes per K tile of a plane (see the decode helpers)."""
    return block_k // _RUNS_PER_K.get(t, 16)


def _padded(ps: list[torch.Tensor], count: int = _MAX_PLANES) -> tuple[list[torch.Tensor], list[int]]:
    """The planes and their row strides, padded to ``count`` with the first plane (never read)."""
    pad = count - len(ps)
    return ps + [ps[0]] * pad, [p.stride(0) for p in ps] + [0] * pad


def _check_x(x: object, K: int, what: str) -> None:
    """x must be a 2-D float16/bfloat16/float32 tensor of K columns."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != K or x.dtype not in FLOAT_DTYPES:
        found = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{what}: x must be a float16/bfloat16/float32 [M, {K}] tensor, found {found}")


# -- device helpers: loads ----------------------------------------------------------------------------


@triton.jit
def _wload(prow, off, valid, MASKED: tl.constexpr):
    """Code bytes: row base pointers [BN], offsets [G, 8] -> [G, BN, 8]; runs not ``valid`` (past
    K, only in the masked tail) read 0."""
    ptrs = prow[None, :, None] + off[:, None, :]
    if MASKED:
        return tl.load(ptrs, mask=valid[:, None, None], other=0)
    return tl.load(ptrs)


@triton.jit
def _gload(prow, off, valid, MASKED: tl.constexpr):
    """One value per run: row base pointers [BN], offsets [G] -> [G, BN]."""
    ptrs = prow[None, :] + off[:, None]
    if MASKED:
        return tl.load(ptrs, mask=valid[:, None], other=0)
    return tl.load(ptrs)


@triton.jit
def _xload(xm, e, valid, stride_xk, MASKED: tl.constexpr):
    """Activations of one x row (base pointer ``xm``) at element indices e [G, 8] -> fp32 [G, 1, 8].
    With G >= 32 * num_warps this load and the codes' [G, BN, 8] get the same layout (lanes and
    warps along G, 8 contiguous bytes or activations per thread, the BN rows in each thread), so
    each thread loads its activations once for all its rows and nothing changes layout."""
    ptrs = xm + (e * stride_xk)[:, None, :]
    if MASKED:
        v = tl.load(ptrs, mask=valid[:, None, None], other=0.0)
    else:
        v = tl.load(ptrs)
    return v.to(tl.float32)


@triton.jit
def _xrow(x0, mi: tl.constexpr, mlast, stride_xm):
    """Base pointer of the tile's x row mi (rows past M repeat the last one; never stored)."""
    return x0 + tl.minimum(mi, mlast).to(tl.int64) * stride_xm


@triton.jit
def _u2f(c):
    """int32 codes 0 <= c < 2^23 -> fp32 exactly, by the exponent trick (an OR and an FADD) instead of
    an int-to-float conversion, which runs at a quarter of the FP32 rate and would bound the GEMV."""
    return (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _psum(code, xv):
    """Per-run partial dots: fp32 codes [G, BN, 8], x [G, 1, 8] -> [G, BN]."""
    return tl.sum(code * xv, axis=2)


@triton.jit
def _xsum(xv):
    """Per-run sums of x [G, 1, 8] -> [G, 1]."""
    return tl.sum(xv, axis=2)


@triton.jit
def _put(acc, c, mi: tl.constexpr, BM: tl.constexpr):
    """acc [G, BN, BM] += c [G, BN] in column mi (the x row)."""
    if BM == 1:
        return acc + c[:, :, None]
    col = tl.arange(0, BM)[None, None, :]
    return acc + tl.where(col == mi, c[:, :, None], 0.0)


@triton.jit
def _store(orow, e, v, mask_n, valid, stride_ok, MASKED: tl.constexpr):
    """Dequantized values [G, BN, 8] to their natural k (``e`` [G, 8]) of the output rows."""
    ptrs = orow[None, :, None] + (e * stride_ok)[:, None, :]
    mask = mask_n[None, :, None]
    if MASKED:
        mask = mask & valid[:, None, None]
    tl.store(ptrs, v.to(orow.dtype.element_ty), mask=mask)


# -- device helpers: per-family decode ----------------------------------------------------------------
#
# Every tile is [G, BN, 8]: G runs of 8 consecutive bytes of a plane (the unit of one vector load in
# both the codes' and the activations' layout: 8 bytes of codes, 8 activations), each decoding into
# elements that share one sub-block scale. ``e`` [G, 8] gives the elements' k.


@triton.jit
def _legacy45(t, p0, p1, p2, p3, K, QT: tl.constexpr, G: tl.constexpr, MASKED: tl.constexpr):
    """q4_0, q4_1, q5_0, q5_1 (QT 0..3): a 32-element block is 16 bytes of qs, two runs; byte j holds
    element j (low nibble) and j + 16 (high), q5's fifth bits are bits j / j + 16 of the block's u32.
    -> (lo, hi codes int32 [G, BN, 8], d, m fp32 [G, BN], k of the low elements [G, 8], valid [G])."""
    g = tl.arange(0, G)
    j8 = tl.arange(0, 8)
    blk = t * (G // 2) + g // 2
    valid = blk < K // 32
    off = t * (G * 8) + 8 * g[:, None] + j8[None, :]
    d = _gload(p0, blk, valid, MASKED).to(tl.float32)
    if QT == 0:
        q = _wload(p1, off, valid, MASKED).to(tl.int32)
        m = d
    elif QT == 1:
        m = _gload(p1, blk, valid, MASKED).to(tl.float32)
        q = _wload(p2, off, valid, MASKED).to(tl.int32)
    elif QT == 2:
        qh = _gload(p1, blk, valid, MASKED)
        q = _wload(p2, off, valid, MASKED).to(tl.int32)
        m = d
    else:
        m = _gload(p1, blk, valid, MASKED).to(tl.float32)
        qh = _gload(p2, blk, valid, MASKED)
        q = _wload(p3, off, valid, MASKED).to(tl.int32)
    lo = q & 15
    hi = q >> 4
    j = 8 * (g % 2)[:, None] + j8[None, :]  # byte in the block
    if QT >= 2:
        lo = lo | (((qh[:, :, None] >> j[:, None, :]) & 1) << 4)
        hi = hi | (((qh[:, :, None] >> (j + 16)[:, None, :]) & 1) << 4)
    e = blk[:, None] * 32 + j
    return lo, hi, d, m, e, valid


@triton.jit
def _q8_0(t, p0, p1, K, G: tl.constexpr, MASKED: tl.constexpr):
    """q8_0: a block is 32 int8 codes in natural order, four runs -> (q [G, BN, 8], d, k, valid)."""
    g = tl.arange(0, G)
    j8 = tl.arange(0, 8)
    blk = t * (G // 4) + g // 4
    valid = blk < K // 32
    e = t * (G * 8) + 8 * g[:, None] + j8[None, :]
    q = _wload(p1, e, valid, MASKED)
    d = _gload(p0, blk, valid, MASKED).to(tl.float32)
    return q, d, e, valid


@triton.jit
def _words(prow, off, valid, NW: tl.constexpr, MASKED: tl.constexpr):
    """NW little-endian 32-bit words from byte rows (base pointers [BN]) at byte offsets off [G]
    (4-byte aligned) -> int32 [G, BN, NW], one vector load per run and row."""
    w = tl.arange(0, NW)
    ptrs = prow.to(tl.pointer_type(tl.int32))[None, :, None] + (off // 4)[:, None, None] + w[None, None, :]
    if MASKED:
        return tl.load(ptrs, mask=valid[:, None, None], other=0)
    return tl.load(ptrs)


@triton.jit
def _word(words, i: tl.constexpr):
    """Word i of :func:`_words`' [G, BN, NW] -> [G, BN] (a selection inside each thread)."""
    w = tl.arange(0, words.shape[2])[None, None, :]
    return tl.sum(tl.where(w == i, words, 0), axis=2)


@triton.jit
def _f16_lo(w):
    """The f16 in the low 16 bits of int32 words, as fp32."""
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale_min(w1, w2, w3, j):
    """q4_k/q5_k's packed 6-bit scale and min of sub-block j (0..7, [G]) from the scale bytes s[0..11]
    as words w1, w2, w3 [G, BN]: j < 4: s[j] & 63, s[j+4] & 63; else (s[j+4] & 15) | (s[j-4] >> 6) << 4,
    (s[j+4] >> 4) | (s[j] >> 6) << 4. -> fp32 (sc, m) [G, BN]."""
    sh = (8 * (j % 4))[:, None]
    a = (w1 >> sh) & 255  # s[j % 4]
    b = (w2 >> sh) & 255  # s[j % 4 + 4]
    c = (w3 >> sh) & 255  # s[j % 4 + 8]
    high = (j >= 4)[:, None]
    sc = tl.where(high, (c & 15) | ((a >> 6) << 4), a & 63)
    mn = tl.where(high, (c >> 4) | ((b >> 6) << 4), b & 63)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _k4(t, p0, p1, p2, K, QT: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, MASKED: tl.constexpr):
    """q4_k, q5_k (QT 7, 8): qs byte 32c + l of a block (c = 0..3) holds element 64c + l (low nibble,
    sub-block 2c) and 64c + 32 + l (high, sub-block 2c + 1); q5_k's fifth bit of element 32i + l is
    bit i of qh[l]. The block head (d, dmin, 12 scale bytes) is one 16-byte load per run and row.
    -> (lo, hi [G, BN, 8] int32, the scales and mins of the low and high sub-blocks, d, dmin
    [G, BN] fp32, k of the low elements [G, 8], valid)."""
    g = tl.arange(0, G)
    j8 = tl.arange(0, 8)
    blk = t * (BK // 256) + g // 16
    valid = blk < K // 256
    c = (g // 4) % 4
    l = 8 * (g % 4)[:, None] + j8[None, :]  # noqa: E741 - byte in the 32-byte run
    off = t * (BK // 2) + 8 * g[:, None] + j8[None, :]
    if QT == 7:
        q = _wload(p1, off, valid, MASKED).to(tl.int32)
    else:
        q = _wload(p2, off, valid, MASKED).to(tl.int32)
    lo = q & 15
    hi = q >> 4
    if QT == 8:
        qh = _wload(p1, blk[:, None] * 32 + l, valid, MASKED).to(tl.int32)
        lo = lo | (((qh >> (2 * c)[:, None, None]) & 1) << 4)
        hi = hi | (((qh >> (2 * c + 1)[:, None, None]) & 1) << 4)
    head = _words(p0, blk * 16, valid, 4, MASKED)
    w0 = _word(head, 0)
    w1 = _word(head, 1)
    w2 = _word(head, 2)
    w3 = _word(head, 3)
    sc_lo, m_lo = _k_scale_min(w1, w2, w3, 2 * c)
    sc_hi, m_hi = _k_scale_min(w1, w2, w3, 2 * c + 1)
    d = _f16_lo(w0)
    dmin = _f16_lo(w0 >> 16)
    e = t * BK + 64 * (g // 4)[:, None] + l
    return lo, hi, sc_lo, sc_hi, m_lo, m_hi, d, dmin, e, valid


@triton.jit
def _k2_load(t, p0, p1, p2, p3, K, QT: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, MASKED: tl.constexpr):
    """q2_k, q3_k, q6_k (QT 5, 6, 9): a 16-byte run r of a block's 2-bit fields (two of our runs,
    r = g // 2) holds in field i (i = 0..3) the 16 elements 128(r//2) + 32i + 16(r%2) + l, one
    sub-block. Loads the raw bytes: (a, b, c) = q2_k (qs, qs, qs), q3_k (qs, hmask, hmask), q6_k
    (ql low half, ql high half, qh), d, dmin, and for q2_k / q6_k the 8 sub-block scale bytes of the
    run's half block as two words [G, BN, 2] (q3_k: the scale plane is gathered per field)."""
    g = tl.arange(0, G)
    j8 = tl.arange(0, 8)
    r = g // 2
    blk = t * (BK // 256) + g // 8
    valid = blk < K // 256
    off = t * (BK // 4) + 8 * g[:, None] + j8[None, :]
    if QT == 5:  # scales, qs, d, dmin
        a = _wload(p1, off, valid, MASKED).to(tl.int32)
        b = a
        c = a
        d = _gload(p2, blk, valid, MASKED).to(tl.float32)
        dmin = _gload(p3, blk, valid, MASKED).to(tl.float32)
        sw = _words(p0, blk * 16 + 8 * ((r % 4) // 2), valid, 2, MASKED)
    elif QT == 6:  # hmask, qs, scales, d: element 32i' + l has its high bit at bit i' of hmask[l]
        offh = blk[:, None] * 32 + 16 * (r % 2)[:, None] + 8 * (g % 2)[:, None] + j8[None, :]
        a = _wload(p1, off, valid, MASKED).to(tl.int32)
        b = _wload(p0, offh, valid, MASKED).to(tl.int32)
        c = b
        d = _gload(p3, blk, valid, MASKED).to(tl.float32)
        dmin = d
        sw = a  # unused: q3_k's packed scales are gathered per field
    else:  # ql, qh, scales, d: ql byte 64h + l' holds elements 128h + l' (low) and 128h + 64 + l'
        offl = (
            t * (BK // 2)
            + 64 * (r // 2)[:, None]
            + 16 * (r % 2)[:, None]
            + 8 * (g % 2)[:, None]
            + j8[None, :]
        )
        a = _wload(p0, offl, valid, MASKED).to(tl.int32)
        b = _wload(p0, offl + 32, valid, MASKED).to(tl.int32)
        c = _wload(p1, off, valid, MASKED).to(tl.int32)
        d = _gload(p3, blk, valid, MASKED).to(tl.float32)
        dmin = d
        sw = _words(p2, blk * 16 + 8 * ((r % 4) // 2), valid, 2, MASKED)
    return a, b, c, d, dmin, sw, blk, valid


@triton.jit
def _k2_part(a, b, c, sw, psc, t, blk, valid, i: tl.constexpr, QT: tl.constexpr, BK: tl.constexpr,
             G: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """Field i of :func:`_k2_load`'s bytes: (codes int32 [G, BN, 8] (q2_k 0..3, q3_k 0..7 = q + 4,
    q6_k 0..63 = q + 32), the sub-block scale and min fp32 [G, BN], k [G, 8])."""
    g = tl.arange(0, G)
    j8 = tl.arange(0, 8)
    r = g // 2
    rb = r % 4  # the run within its block
    sb = 8 * (rb // 2) + 2 * i + rb % 2  # sub-block of 16 within the block
    if QT != 6:  # byte l + 2i of the 8 scale bytes (l = rb % 2) of the run's half block
        s = (_word(sw, i // 2) >> (8 * (rb % 2 + 2 * (i % 2)))[:, None]) & 255
    if QT == 5:
        code = (a >> (2 * i)) & 3
        scale = (s & 15).to(tl.float32)
        mn = (s >> 4).to(tl.float32)
    elif QT == 6:
        hshift = 4 * (rb // 2) + i
        code = ((a >> (2 * i)) & 3) | (((b >> hshift[:, None, None]) & 1) << 2)
        lo4 = (_gload(psc, blk * 12 + sb % 8, valid, MASKED).to(tl.int32) >> (4 * (sb // 8))[:, None]) & 15
        hi2 = (_gload(psc, blk * 12 + 8 + sb % 4, valid, MASKED).to(tl.int32) >> (2 * (sb // 4))[:, None]) & 3
        scale = ((lo4 | (hi2 << 4)) - 32).to(tl.float32)
        mn = scale
    else:
        if i == 0:
            code = (a & 15) | ((c & 3) << 4)
        elif i == 1:
            code = (b & 15) | (((c >> 2) & 3) << 4)
        elif i == 2:
            code = (a >> 4) | (((c >> 4) & 3) << 4)
        else:
            code = (b >> 4) | (((c >> 6) & 3) << 4)
        scale = (s - ((s & 128) << 1)).to(tl.float32)  # int8
        mn = scale
    e = t * BK + 128 * (r // 2)[:, None] + 16 * (r % 2)[:, None] + 8 * (g % 2)[:, None] + 32 * i + j8[None, :]
    return code, scale, mn, e


# -- the GEMV -----------------------------------------------------------------------------------------


@triton.jit
def _gemv_step(acc, t, x0, mlast, stride_xm, stride_xk, p0, p1, p2, p3, p4, K, QT: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, R: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """K tile t: acc [G, BN, BM] += the scaled per-run partial dots of each x row."""
    if QT <= 3:
        lo, hi, d, m, e, valid = _legacy45(t, p0, p1, p2, p3, K, QT, R, MASKED)
        lo = _u2f(lo)
        hi = _u2f(hi)
        for mi in tl.static_range(BM):
            xl = _xload(_xrow(x0, mi, mlast, stride_xm), e, valid, stride_xk, MASKED)
            xh = _xload(_xrow(x0, mi, mlast, stride_xm), e + 16, valid, stride_xk, MASKED)
            s = _psum(lo, xl) + _psum(hi, xh)
            xs = _xsum(xl + xh)
            if QT == 0:
                c = d * (s - 8.0 * xs)
            elif QT == 2:
                c = d * (s - 16.0 * xs)
            else:
                c = d * s + m * xs
            acc = _put(acc, c, mi, BM)
    elif QT == 4:
        q, d, e, valid = _q8_0(t, p0, p1, K, R, MASKED)
        q = ((q.to(tl.int32) + 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0  # int8, see _u2f
        for mi in tl.static_range(BM):
            acc = _put(
                acc,
                d * _psum(q, _xload(_xrow(x0, mi, mlast, stride_xm), e, valid, stride_xk, MASKED)),
                mi,
                BM,
            )
    elif QT == 7 or QT == 8:
        lo, hi, sc_lo, sc_hi, m_lo, m_hi, d, dmin, e, valid = _k4(t, p0, p1, p2, K, QT, BK, R, MASKED)
        lo = _u2f(lo)
        hi = _u2f(hi)
        for mi in tl.static_range(BM):
            xl = _xload(_xrow(x0, mi, mlast, stride_xm), e, valid, stride_xk, MASKED)
            xh = _xload(_xrow(x0, mi, mlast, stride_xm), e + 32, valid, stride_xk, MASKED)
            s = sc_lo * _psum(lo, xl) + sc_hi * _psum(hi, xh)
            c = d * s - dmin * (m_lo * _xsum(xl) + m_hi * _xsum(xh))
            acc = _put(acc, c, mi, BM)
    else:
        a, b, c, d, dmin, sw, blk, valid = _k2_load(t, p0, p1, p2, p3, K, QT, BK, R, MASKED)
        if QT == 5:
            psc = p0
        else:
            psc = p2
        for i in tl.static_range(4):
            code, scale, mn, e = _k2_part(a, b, c, sw, psc, t, blk, valid, i, QT, BK, R, MASKED)
            code = _u2f(code)
            for mi in tl.static_range(BM):
                xv = _xload(_xrow(x0, mi, mlast, stride_xm), e, valid, stride_xk, MASKED)
                s = _psum(code, xv)
                xs = _xsum(xv)
                if QT == 5:
                    w = d * (scale * s) - dmin * (mn * xs)
                elif QT == 6:
                    w = (d * scale) * (s - 4.0 * xs)
                else:
                    w = (d * scale) * (s - 32.0 * xs)
                acc = _put(acc, w, mi, BM)
    return acc


@triton.jit
def _gguf_gemv_kernel(
    X, P0, P1, P2, P3, P4, Bias, Y, Part, Cnt,
    M, N, K,
    stride_xm, stride_xk, stride_b, stride_ym, stride_yn,
    S0, S1, S2, S3, S4,
    QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, R: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_B: tl.constexpr, HAS_TAIL: tl.constexpr,
):  # fmt: skip
    """y[M, N] = x @ dequant(W)^T (+ bias). Program (pid, pid_k): the pid-th [BM, BN] output tile
    (M tiles vary fastest, so programs sharing a weight tile run together), K tiles pid_k,
    pid_k + SPLIT_K, ... The last, partial K tile (HAS_TAIL) runs masked, by one program. Split-K
    partials are reduced in the launch (:func:`.common.reduce_tile`: Part, Cnt)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    x0 = X + (pid_m * BM).to(tl.int64) * stride_xm
    mlast = M - 1 - pid_m * BM
    p0 = P0 + rows * S0
    p1 = P1 + rows * S1
    p2 = P2 + rows * S2
    p3 = P3 + rows * S3
    p4 = P4 + rows * S4
    acc = tl.zeros((R, BN, BM), dtype=tl.float32)
    n_full = K // BK
    for t in range(pid_k, n_full, SPLIT_K):
        acc = _gemv_step(
            acc, t, x0, mlast, stride_xm, stride_xk, p0, p1, p2, p3, p4, K, QT, BM, BN, BK, R, False
        )
    if HAS_TAIL:
        if pid_k == n_full % SPLIT_K:
            acc = _gemv_step(
                acc, n_full, x0, mlast, stride_xm, stride_xk, p0, p1, p2, p3, p4, K, QT, BM, BN, BK, R, True
            )
    y = tl.trans(tl.sum(acc, axis=0))  # [BM, BN]
    reduce_tile(y, Bias, Y, Part, Cnt, pid, pid_k, offs_m.to(tl.int64), offs_n, offs_m < M, offs_n < N, M, N,
                stride_b, stride_ym, stride_yn, HAS_B, SPLIT_K)  # fmt: skip


_gemv_launch = Launcher(_gguf_gemv_kernel)


def gguf_matmul(
    x: torch.Tensor,
    planes: dict[str, torch.Tensor],
    gguf_type: str,
    N: int,
    K: int,
    bias: torch.Tensor | None = None,
    config: GGUFConfig | None = None,
    out: torch.Tensor | None = None,
    counters: TileCounters | None = None,
) -> torch.Tensor:
    """``y = x @ dequant(W).T (+ bias)`` for x fp16/bf16/fp32 [M, K] (any strides) and the planes of
    :func:`gguf_planes`; y [M, N] in x's dtype (or ``out``), fp32 accumulation, no dense weight.
    ``config`` None takes :func:`default_config`. ``counters``: the layer's split-K arrival
    counters (:class:`.common.TileCounters`); None makes zeros per call."""
    t = _type(gguf_type)
    _check_nk(t, N, K, "gguf_matmul")
    if config is None:
        config = default_config(t, x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1)
    _check_config(config)
    _check_x(x, K, "gguf_matmul")
    ps, strides = _padded(_plane_list(planes, t, N, K, x.device, "gguf_matmul"))
    M = x.shape[0]
    check_epilogue(bias, out, x.dtype, M, N, x.device, "gguf_matmul")
    if M == 0:
        return empty_result(N, x.dtype, out, x.device)
    bk = config.block_k or auto_block_k(t, config.num_warps)
    if config.block_n * bk > _MAX_TILE:
        raise ValueError(
            f"gguf_matmul: block_n * block_k = {config.block_n * bk} exceeds {_MAX_TILE} (Triton's largest tile)"
        )
    y = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    part, cnt = split_k_buffers(y, gemv_tiles(M, N, config), M, N, config, counters)
    gemv_call(x, ps, strides, t, bias, y, part, cnt, config)()
    return y


def gemv_tiles(M: int, N: int, config: GGUFConfig) -> int:
    """Output tiles of a GEMV launch (one split-K counter each)."""
    return cdiv(M, config.block_m) * cdiv(N, config.block_n)


def gemv_call(
    x: torch.Tensor,
    ps: list[torch.Tensor],
    strides: list[int],
    gguf_type: str,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    part: torch.Tensor,
    cnt: torch.Tensor,
    config: GGUFConfig,
) -> Call:
    """The launch of :func:`gguf_matmul` into given buffers, unchecked (M >= 1): ``ps`` and
    ``strides`` the five planes of :func:`_padded`; ``part`` and ``cnt`` from
    :func:`.common.split_k_buffers`. Its first ten arguments are the pointers."""
    M, K = x.shape
    N = y.shape[1]
    bk = config.block_k or auto_block_k(gguf_type, config.num_warps)
    return Call(_gemv_launch, (gemv_tiles(M, N, config), config.split_k), (
        x, *ps, bias if bias is not None else y, y, part, cnt,
        M, N, K,
        x.stride(0), x.stride(1), bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
        *strides,
    ), dict(
        QT=_TYPE_ID[gguf_type], BM=config.block_m, BN=config.block_n, BK=bk, R=_groups(gguf_type, bk),
        SPLIT_K=config.split_k, HAS_B=bias is not None, HAS_TAIL=K % bk != 0,
        num_warps=config.num_warps, num_stages=config.num_stages,
    ))  # fmt: skip


def gemv_strategy(config: GGUFConfig) -> StrategyFn:
    """One layer's GEMV strategy on ``config``: :func:`gguf_matmul`, and from a batch size's second
    call on its bound launch (:mod:`.bound`: split-K partials in the workspace)."""

    def checked(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        return gguf_matmul(x, lay.planes, lay.gguf_type, lay.N, lay.K, bias, config, out, lay.counters)

    return bound_strategy(functools.partial(_first_gemv, config), checked)


def _first_gemv(
    config: GGUFConfig, lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor | None
) -> tuple[torch.Tensor, Runner | None] | None:
    """The GEMV with its split-K partials in the workspace; binds the launch."""
    if config.split_k > 1 and ws is None:
        return None
    M, N, t = x.shape[0], lay.N, lay.gguf_type
    ps, strides = _padded(_plane_list(lay.planes, t, N, lay.K, x.device, "gguf_matmul"))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    tiles, split = gemv_tiles(M, N, config), config.split_k
    if split > 1:
        part = ws[: regions(M, 0, N, 0, split)[2]].view(torch.float32).view(split, M, N)
        cnt = lay.counters.get(tiles)
    else:
        part = cnt = y
    call = gemv_call(x, ps, strides, t, bias, y, part, cnt, config)
    call()
    planes = tuple(p.data_ptr() for p in ps)
    run = bind_one(call, lambda xp, bp, yp, pp, cp: (xp, *planes, yp if bp is None else bp, yp, pp, cp),
                   M=M, N=N, out_dtype=x.dtype, split_k=split, tiles=tiles, counters=lay.counters)  # fmt: skip
    return y, run


# -- the dequantizer ----------------------------------------------------------------------------------


@triton.jit
def _dequant_tile(t, orow, stride_ok, mask_n, p0, p1, p2, p3, p4, K,
                  QT: tl.constexpr, BK: tl.constexpr, R: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """K tile t of BN rows, each value as llama.cpp's reference computes it."""
    if QT <= 3:
        lo, hi, d, m, e, valid = _legacy45(t, p0, p1, p2, p3, K, QT, R, MASKED)
        dd = d[:, :, None]
        if QT == 0:
            wl = dd * (lo - 8).to(tl.float32)
            wh = dd * (hi - 8).to(tl.float32)
        elif QT == 2:
            wl = dd * (lo - 16).to(tl.float32)
            wh = dd * (hi - 16).to(tl.float32)
        else:
            wl = dd * lo.to(tl.float32) + m[:, :, None]
            wh = dd * hi.to(tl.float32) + m[:, :, None]
        _store(orow, e, wl, mask_n, valid, stride_ok, MASKED)
        _store(orow, e + 16, wh, mask_n, valid, stride_ok, MASKED)
    elif QT == 4:
        q, d, e, valid = _q8_0(t, p0, p1, K, R, MASKED)
        _store(orow, e, q.to(tl.float32) * d[:, :, None], mask_n, valid, stride_ok, MASKED)
    elif QT == 7 or QT == 8:
        lo, hi, sc_lo, sc_hi, m_lo, m_hi, d, dmin, e, valid = _k4(t, p0, p1, p2, K, QT, BK, R, MASKED)
        wl = (d * sc_lo)[:, :, None] * lo.to(tl.float32) - (dmin * m_lo)[:, :, None]
        wh = (d * sc_hi)[:, :, None] * hi.to(tl.float32) - (dmin * m_hi)[:, :, None]
        _store(orow, e, wl, mask_n, valid, stride_ok, MASKED)
        _store(orow, e + 32, wh, mask_n, valid, stride_ok, MASKED)
    else:
        a, b, c, d, dmin, sw, blk, valid = _k2_load(t, p0, p1, p2, p3, K, QT, BK, R, MASKED)
        if QT == 5:
            psc = p0
        else:
            psc = p2
        for i in tl.static_range(4):
            code, scale, mn, e = _k2_part(a, b, c, sw, psc, t, blk, valid, i, QT, BK, R, MASKED)
            dl = (d * scale)[:, :, None]
            if QT == 5:
                w = dl * code.to(tl.float32) - (dmin * mn)[:, :, None]
            elif QT == 6:
                w = dl * (code - 4).to(tl.float32)
            else:
                w = dl * (code - 32).to(tl.float32)
            _store(orow, e, w, mask_n, valid, stride_ok, MASKED)


@triton.jit
def _gguf_dequant_kernel(
    P0, P1, P2, P3, P4, Out,
    n0, rows_out, K, stride_on, stride_ok,
    S0, S1, S2, S3, S4,
    QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, R: tl.constexpr, HAS_TAIL: tl.constexpr,
):  # fmt: skip
    """Program (pid_n, t): output rows pid_n*BN.. (weight rows n0 + those), K tile t."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    offs = pid_n * BN + tl.arange(0, BN)
    mask_n = offs < rows_out
    local = tl.minimum(offs, rows_out - 1).to(tl.int64)
    rows = local + n0
    orow = Out + local * stride_on
    p0 = P0 + rows * S0
    p1 = P1 + rows * S1
    p2 = P2 + rows * S2
    p3 = P3 + rows * S3
    p4 = P4 + rows * S4
    _dequant_tile(t, orow, stride_ok, mask_n, p0, p1, p2, p3, p4, K, QT, BK, R, HAS_TAIL)


_dequant_launch = Launcher(_gguf_dequant_kernel)


def gguf_dequant(
    planes: dict[str, torch.Tensor],
    gguf_type: str,
    N: int,
    K: int,
    dtype: torch.dtype,
    n0: int,
    n1: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``n0:n1`` of the dequantized weight, [n1 - n0, K] in ``dtype`` (fp16, bf16 or fp32), in
    natural k order; written into ``out`` (any strides) when given."""
    t = _type(gguf_type)
    _check_nk(t, N, K, "gguf_dequant")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"gguf_dequant: dtype must be float16, bfloat16 or float32, found {dtype}")
    if not isinstance(n0, int) or not isinstance(n1, int) or not 0 <= n0 <= n1 <= N:
        raise ValueError(f"gguf_dequant: need 0 <= n0 <= n1 <= N={N}, found n0={n0!r}, n1={n1!r}")
    names = PLANE_NAMES[t]
    first = planes.get(names[0]) if isinstance(planes, dict) else None
    device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
    ps, strides = _padded(_plane_list(planes, t, N, K, device, "gguf_dequant"))
    rows = n1 - n0
    if out is None:
        out = torch.empty(rows, K, device=device, dtype=dtype)
    elif out.dtype != dtype or tuple(out.shape) != (rows, K) or out.device != device:
        raise ValueError(
            f"gguf_dequant: out must be {dtype_name(dtype)} [{rows}, {K}] on {device}, "
            f"found {dtype_name(out.dtype)} {list(out.shape)} on {out.device}"
        )
    if rows == 0:
        return out
    bk = _DEQ_BLOCK_K
    _dequant_launch((cdiv(rows, _DEQ_BLOCK_N), cdiv(K, bk)),
        *ps, out, n0, rows, K, out.stride(0), out.stride(1), *strides,
        QT=_TYPE_ID[t], BN=_DEQ_BLOCK_N, BK=bk, R=_groups(t, bk), HAS_TAIL=K % bk != 0,
        num_warps=4, num_stages=1,
    )  # fmt: skip
    return out
