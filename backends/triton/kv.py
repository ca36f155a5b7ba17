"""Quantized KV cache in Triton, portable across GPU vendors: quantize-on-write into a paged cache's
planes, and split-K decode attention ("flash decoding") that reads the quantized pages directly.

The cache is a pool of slots (``block * block_size + offset``), each scheme a few planes
``[slots, H, *shape]`` (``quantrt.kv.pages.kv_planes``); the launchers take those planes flat, the
static scales and, for TurboQuant, the code book and rotation signs (:class:`TQTables`), so this
module needs nothing of the runtime but the scheme types.

Write (:func:`write_kv`): ``WRITE_ROWS`` (token, head) rows per program, codes equal to the torch
codec's (``quantrt.reference.kv`` and ``quantrt.reference.turboquant``): divisions are ``div_rn``,
square roots ``sqrt_rn``, fp8 saturates before its round-to-nearest-even cast (act_quant's encoder),
int8 rounds half to even. TurboQuant keys are rotated in the kernel by a fast Walsh-Hadamard
transform (``(x * signs) H / sqrt(D)``, the reference's ``x @ R`` summed in another order), so a
code may differ by one level where ``y`` lies within rounding of a boundary, and the stored norm
with it (it is divided by the chosen centroids' norm).

Decode (:func:`decode_kv`): grid (KV head, split, sequence). A program takes the ``G = Hq / H`` query
heads of its KV head (padded to ``BG >= 16`` rows for ``tl.dot``), walks its share of the sequence
in tiles of ``block_n`` tokens (token ``t`` at slot ``block_table[b, t // block_size] * block_size +
t % block_size``, so a tile spans pages), dequantizes each tile in registers and keeps an fp32 online
softmax (base 2); a second kernel merges the splits by log-sum-exp (one split: the first kernel
finishes itself), launched before the first ends where the vendor gives a grid sync
(``decode_kv(grid_sync=...)``: NVIDIA's programmatic dependent launch). A split's share is cut
from its sequence's own length, read on the device, so the grid depends only on (B, H, max_len)
and a call captures into a CUDA graph. The slots and per-token scales of the next tile are loaded
one iteration ahead; the pipeliner keeps two tiles of codes in flight. The sums of the
probabilities (and of probability x zero-point) are kept per score element and reduced once after
the loop, so only the running max is exchanged between threads per tile. Per scheme:

* unquantized: the 16/32-bit rows in their own dtype;
* fp8 / int8: codes in the dots (exact in fp16: e4m3 by the hardware conversion on NVIDIA sm_89+
  or bit tricks, e5m2 as an fp16's high byte, int8 by an integer add into fp16 bits); a static
  (tensor, head) key scale folded into the logit scale and the value scale applied to the
  accumulator once; per-token scales multiply the logits (keys) and the probabilities (values);
  per-group scales dequantize the tile element-wise; where decoders are given, values with one
  scale per token or tensor (fp8) are read as 16-bit words of two codes and decoded by byte (two value
  accumulators, channels ``2w + n``, interleaved after the loop), which the dot loads through
  16-bit transposing loads instead of one shared-memory load per byte (``QUANTRT_KV_BYTE_WORDS=0``
  reads them byte by byte);
* TurboQuant 3/4-bit keys: the query is rotated once (``qR``, the same transform) and scored against
  ``centroid[idx]`` directly (``q.k = norm * (qR).c``, R orthogonal), the norm multiplying the
  logits; fp8 (k8) keys unscaled; values ``q * scale + zero`` as ``(p * scale) . q + (p . zero)``:
  codes in the dot, the scale on the probabilities, the zero-point as one extra sum per row.
  Given decoders (``decode_kv(decoders=...)``: NVIDIA's are PTX, ``backends/cuda/triton_kv_decode.py``;
  :data:`PORTABLE_DECODERS` read the centroids from the code book in global memory and make a value
  code fp16 as the mantissa of 1024), 4-bit codes (keys and values) are read as 16-bit words, four
  channels each, and the dots run once per code position ``n`` (q's channels ``4w + n`` against
  code n of each key word; value accumulators per n, interleaved after the loop): the decode of a
  word is elementwise, so Triton loads the words straight into the dots' operand registers and
  decodes there. Otherwise (and for 3-bit codes, and under ``QUANTRT_KV_TQ_DECODE=pairs``, read at
  import for side-by-side timings) codes become fp16 through tables of code pairs in shared memory
  (``tl.gather``, one lookup per two elements), decoded tiles passing through shared memory to the
  dots.

Dot operands are fp16 for every quantized cache (the query scaled by the softmax scale first), the
cache's own dtype for an unquantized one, fp32 (IEEE) for fp32 queries. Launch shapes come from
:func:`decode_config`, one small heuristic with its constants beside it.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from quantrt.schemes import KVCacheScheme, KVScheme, TurboQuantScheme

from .act_quant import FP8_FORMATS, INT8_QMAX, _encode
from .launch import Launcher, cdiv, next_power_of_2

# -- what a plane holds (the kernels' constexpr codes) -----------------------------------------

#: element kinds: 16/32-bit floats, fp8 e4m3 / e5m2, int8, packed 4-bit / 3-bit codes
FLOAT, E4M3, E5M2, INT8, U4, U3 = 0, 1, 2, 3, 4, 5
#: scale kinds: none, static per tensor or head, dynamic per token or group (fp32 plane), the fp16
#: TurboQuant key norm, the fp16 TurboQuant value scale and zero-point
NO_SCALE, STATIC, DYNAMIC, NORM, AFFINE = 0, 1, 2, 3, 4

_STORE = {"fp8_e4m3": E4M3, "fp8_e5m2": E5M2, "int8": INT8}
_FP8_TORCH = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
LOG2E = 1.4426950408889634

# -- launch shapes (the one place to tune them) -----------------------------------------------------

#: resident programs to aim for per SM: splits fill the GPU when B * H alone cannot, in one wave
#: (two programs of four warps fit any scheme's registers and shared memory)
PROGRAMS_PER_SM = 2
#: the fewest tokens a split is given (below that the merge costs more than the split saves)
MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 128
#: splits the combine reads in one round of loads (an fp32 [splits, head_dim] tile per program)
MERGE_SPLITS = 64
#: SMs assumed where the device has none to ask (the interpreter)
DEFAULT_SMS = 132
#: (token, head) rows a write program takes: several tokens per program
WRITE_ROWS = 32


@dataclass(frozen=True)
class DecodeConfig:
    """One decode launch: ``block_n`` tokens per tile, ``num_splits`` programs per (sequence, KV
    head); ``transposed`` computes scores as keys x q^T (the keys fill the dot's 64-row side:
    Hopper's warp-group MMA, the decoded keys its register operand) and the output transposed, but
    for 4-bit value words (their dots take the probabilities on the left)."""

    block_n: int = 64
    num_splits: int = 1
    num_warps: int = 4
    num_stages: int = 3
    transposed: bool = False

    def check(self) -> None:
        b = self.block_n
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"DecodeConfig: block_n must be a power of two >= 16, found {b!r}")
        for name in ("num_splits", "num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"DecodeConfig: {name} must be a positive integer, found {v!r}")


def decode_config(
    batch: int, num_kv_heads: int, max_len: int, head_dim: int, sms: int, fmt: KVFormat | None = None
) -> DecodeConfig:
    """The launch shape of a decode call, from Python ints only (graph-capturable).

    Tiles: 128 tokens where the values are packed codes (TurboQuant) up to head_dim 128, computed
    transposed; 64 for every other cache (8-bit codes, 16/32-bit rows, per-group scales) and wider
    heads; three stages (two tiles in flight) up to head_dim 128, four warps. Splits: as many as
    keep ``batch * H * splits`` within ``PROGRAMS_PER_SM`` per SM, each at least
    ``MIN_SPLIT_TOKENS``. From an H100 sweep of tiles x warps x stages x splits at 32k tokens
    (``bench/gpu_kv.py --sweep``, docs/performance.md): the tile is the only choice that moved
    the time by more than noise."""
    packed = fmt is not None and fmt.v_kind in (U4, U3)
    block_n = 128 if packed and head_dim <= 128 else 64
    fit = (PROGRAMS_PER_SM * sms) // max(1, batch * num_kv_heads)
    splits = max(1, min(MAX_SPLITS, fit, cdiv(max_len, MIN_SPLIT_TOKENS)))
    return DecodeConfig(
        block_n, splits, num_warps=4, num_stages=3 if head_dim <= 128 else 2, transposed=packed
    )


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(device: torch.device) -> int:
    """SMs (compute units) of a CUDA device; :data:`DEFAULT_SMS` elsewhere."""
    if device.type != "cuda":
        return DEFAULT_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


#: read once, as Triton decides at import whether these kernels are interpreted (no per-call reads)
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpreted() -> bool:
    return _INTERPRETED


@functools.cache
def _fp8_cvt(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (8, 9)


def hw_fp8(device: torch.device) -> bool:
    """Whether fp8 converts in hardware (exact: NVIDIA sm_89+); bit tricks elsewhere."""
    if device.type != "cuda" or _interpreted():
        return False
    return _fp8_cvt(device.index if device.index is not None else torch.cuda.current_device())


# -- the scheme as the kernels see it ---------------------------------------------------------


@dataclass(frozen=True)
class KVFormat:
    """One scheme's planes as constexpr codes: element kind and scale kind of keys and values,
    channels per dynamic scale (``group``: head_dim for per-token scales), and the stored type's
    largest magnitude (``qmax``, what dynamic scales map amax onto)."""

    k_kind: int
    v_kind: int
    k_scale: int
    v_scale: int
    k_group: int
    v_group: int
    qmax: float = 1.0


def kv_format(scheme: KVScheme | None, head_dim: int) -> KVFormat:
    """The kernels' view of a scheme (``None``: the unquantized cache)."""
    d = head_dim
    if scheme is None:
        return KVFormat(FLOAT, FLOAT, NO_SCALE, NO_SCALE, d, d)
    if isinstance(scheme, KVCacheScheme):
        kind = _STORE[scheme.dtype]
        qmax = INT8_QMAX if kind == INT8 else FP8_FORMATS[_FP8_TORCH[kind]].fmax
        if scheme.dynamic:
            g = d if scheme.granularity == "token" else scheme.group_size
            return KVFormat(kind, kind, DYNAMIC, DYNAMIC, g, g, qmax)
        return KVFormat(kind, kind, STATIC, STATIC, d, d, qmax)
    if not isinstance(scheme, TurboQuantScheme):
        raise TypeError(f"kv_format: not a KV-cache scheme: {scheme!r}")
    if scheme.key_bits == 8:
        k_kind, k_scale = E4M3, NO_SCALE
    else:
        k_kind, k_scale = (U4 if scheme.key_bits == 4 else U3), NORM
    return KVFormat(k_kind, U4 if scheme.value_bits == 4 else U3, k_scale, AFFINE, d, d)


@dataclass(frozen=True)
class TQTables:
    """TurboQuant's constants on the device: the key code book (fp32 centroids [2^b], boundaries
    [2^b - 1]) and the rotation's signs (fp32 [D], ``R = diag(signs) H / sqrt(D)``). Made once per
    cache (a copy to the device cannot be captured in a CUDA graph); the centroids' fp16 bits are
    read back to the host then, once, for decoders that compile the code book into the kernel."""

    centroids: torch.Tensor
    bounds: torch.Tensor
    signs: torch.Tensor
    _cast: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        bits = self.centroids.to(torch.float16).view(torch.int16).tolist()
        self._cast["bits"] = tuple(b & 0xFFFF for b in bits)

    def centroid_bits(self) -> tuple[int, ...]:
        """The centroids as fp16 bit patterns (Python ints), read when the tables were made."""
        return self._cast["bits"]

    def centroids_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The centroids in the dot's dtype, cast once."""
        c = self._cast.get(dtype)
        if c is None:
            c = self._cast[dtype] = self.centroids.to(dtype)
        return c


def _encode_meta(kind: int, device: torch.device) -> dict:
    """act_quant._encode's constexprs for a plane of this kind (harmless defaults otherwise)."""
    if kind in (E4M3, E5M2):
        dtype = _FP8_TORCH[kind]
        f = FP8_FORMATS[dtype]
        hw = hw_fp8(device)
        return dict(
            ENC_INT8=False, ENC_HW=hw, ENC_FMAX=f.fmax, ENC_MANT=f.mant, ENC_EMIN=f.emin, ENC_NAN=f.nan,
            ENC_NEG_ZERO=f.neg_zero, ENC_QTY=f.tl_dtype,
        )  # fmt: skip
    return dict(
        ENC_INT8=True, ENC_HW=False, ENC_FMAX=127.0, ENC_MANT=0, ENC_EMIN=0, ENC_NAN=0, ENC_NEG_ZERO=False,
        ENC_QTY=tl.int8,
    )  # fmt: skip


def _as_kernel_plane(p: torch.Tensor, hw: bool, write: bool = False) -> torch.Tensor:
    """fp8 planes go to the kernels as bytes unless the hardware converts them: fp8 codes from
    act_quant's hardware cast (write), e4m3 widened to fp16 (read; e5m2 is read as bytes)."""
    fp8 = p.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8 and (not hw or (not write and p.dtype == torch.float8_e5m2)):
        return p.view(torch.uint8)
    return p


def dot_dtypes(
    q_dtype: torch.dtype, fmt: KVFormat, cache_dtype: torch.dtype
) -> tuple[torch.dtype, torch.dtype]:
    """The operand dtypes of the two dots (q.k, p.v): fp32 for an fp32 query (IEEE dots); an
    unquantized 16-bit cache's own dtype; fp16 for every code (fp8, int8, centroids and small
    integers widen to fp16 exactly and cheaply; bf16 would need slow conversions from fp8)."""
    if q_dtype == torch.float32:
        return torch.float32, torch.float32
    own = cache_dtype if cache_dtype in (torch.float16, torch.bfloat16) else torch.float16
    return (own if fmt.k_kind == FLOAT else torch.float16), (own if fmt.v_kind == FLOAT else torch.float16)


def _wide(planes: dict[str, torch.Tensor]) -> bool:
    """Whether element offsets into a plane can pass 2^31 (int64 slot arithmetic then)."""
    return any(p.numel() >= 2**31 for p in planes.values())


def _log2(n: int) -> int:
    return max(0, n.bit_length() - 1)


# -- device helpers ----------------------------------------------------------------------------


@triton.jit
def _fwht(x, R: tl.constexpr, DP: tl.constexpr, LOG: tl.constexpr):
    """Rows of x [R, DP] times the Sylvester Hadamard matrix (DP = 2^LOG), butterfly by butterfly."""
    for i in tl.static_range(LOG):
        y = tl.permute(tl.reshape(x, [R, DP >> (i + 1), 2, 1 << i]), (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, [R, DP])
    return x


@triton.jit
def _sat16(v):
    """fp32 -> fp16, saturating at +-65504 (the reference's fp16 of scales and norms)."""
    v = tl.maximum(v, -65504.0, propagate_nan=tl.PropagateNan.ALL)
    v = tl.minimum(v, 65504.0, propagate_nan=tl.PropagateNan.ALL)
    return v.to(tl.float16)


@triton.jit
def _widen(c, KIND: tl.constexpr, HW: tl.constexpr, DT: tl.constexpr):
    """Stored elements -> DT, exact. e4m3: the hardware cast (HW: c is fp8) or bit tricks on the
    byte (fp16 bits of value * 2^-8); e5m2: the high byte of an fp16; int8: the fp16 bits of 1152 +
    c (integer add, no int-to-float conversion); floats cast."""
    if KIND == 1:
        if HW:
            x = c.to(tl.float16)
        else:
            b = c.to(tl.int16)
            x = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(tl.float16, bitcast=True) * 256.0
        out = x.to(DT)
    elif KIND == 2:
        out = (c.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(DT)
    elif KIND == 3:
        out = ((c.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0).to(DT)
    else:
        out = c.to(DT)
    return out


@triton.jit
def _words24(row, D: tl.constexpr, DP: tl.constexpr):
    """3-bit codes: each row's little-endian 24-bit words (bytes 3g..3g+2, eight codes each), int32
    [BN, DP / 8] (words past D read as 0)."""
    g = tl.arange(0, DP // 8)
    m = (g < D // 8)[None, :]
    w = tl.load(row + 3 * g[None, :], mask=m, other=0).to(tl.int32)
    w |= tl.load(row + 3 * g[None, :] + 1, mask=m, other=0).to(tl.int32) << 8
    w |= tl.load(row + 3 * g[None, :] + 2, mask=m, other=0).to(tl.int32) << 16
    return w


@triton.jit
def _unpack(row, D: tl.constexpr, DP: tl.constexpr, BITS: tl.constexpr):
    """Packed codes of each row (``row``: [BN, 1] pointers to the rows' first byte) -> int32 [BN, DP]
    (columns past D read as 0). 4 bits: element 2j in the low nibble of byte j; 3 bits: element
    8g + i at bit 3i of the little-endian 24-bit word in bytes 3g..3g+2."""
    if BITS == 4:
        j = tl.arange(0, DP // 2)
        b = tl.load(row + j[None, :], mask=(j < D // 2)[None, :], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(b & 15, b >> 4), [b.shape[0], DP])
    else:
        w = _words24(row, D, DP)
        even = tl.join(tl.join(w & 7, (w >> 12) & 7), tl.join((w >> 6) & 7, (w >> 18) & 7))
        odd = tl.join(tl.join((w >> 3) & 7, (w >> 15) & 7), tl.join((w >> 9) & 7, (w >> 21) & 7))
        codes = tl.reshape(tl.join(even, odd), [w.shape[0], DP])
    return codes


@triton.jit
def _pack_store(dst, codes, R: tl.constexpr, DP: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, ok):
    """int32 codes [R, DP] packed as :func:`_unpack` reads them, stored at ``dst`` ([R, 1] row
    pointers); rows where ``ok`` [R, 1] is false are skipped."""
    if BITS == 4:
        lo, hi = tl.split(tl.reshape(codes, [R, DP // 2, 2]))
        j = tl.arange(0, DP // 2)[None, :]
        tl.store(dst + j, (lo | (hi << 4)).to(tl.uint8), mask=ok & (j < D // 2))
    else:
        shift = 3 * tl.arange(0, 8)
        w = tl.sum(tl.reshape(codes, [R, DP // 8, 8]) << shift[None, None, :], axis=2)
        g = tl.arange(0, DP // 8)[None, :]
        m = ok & (g < D // 8)
        tl.store(dst + 3 * g, (w & 255).to(tl.uint8), mask=m)
        tl.store(dst + 3 * g + 1, ((w >> 8) & 255).to(tl.uint8), mask=m)
        tl.store(dst + 3 * g + 2, ((w >> 16) & 255).to(tl.uint8), mask=m)


# -- quantize-on-write ------------------------------------------------------------------------------


@triton.jit
def _rows(n0, N, H, SLOTS, HP: tl.constexpr, R: tl.constexpr):
    """The R = tokens x HP rows of one program: row ``r`` is head ``r % HP`` of token ``n0 + r //
    HP``; returns its token (int64), head, slot (int64) and whether it is written."""
    r = tl.arange(0, R)
    n = n0 + r // HP
    h = r % HP
    slot = tl.load(SLOTS + n, mask=n < N, other=-1).to(tl.int64)
    return n.to(tl.int64), h, slot, (h < H) & (n < N) & (slot >= 0)


@triton.jit
def _write_scaled(
    X, P, S, n, h, slot, ok, qmax, sx_n, sx_h, sp_slot, sp_h, ss_slot, ss_h,
    D: tl.constexpr, R: tl.constexpr, KIND: tl.constexpr, SC: tl.constexpr, GS: tl.constexpr,
    NGP: tl.constexpr, GSP: tl.constexpr,
    ENC_INT8: tl.constexpr, ENC_HW: tl.constexpr, ENC_FMAX: tl.constexpr, ENC_MANT: tl.constexpr,
    ENC_EMIN: tl.constexpr, ENC_NAN: tl.constexpr, ENC_NEG_ZERO: tl.constexpr, ENC_QTY: tl.constexpr,
):  # fmt: skip
    """Rows (token, head) as an [R, NGP, GSP] tile (channel ``g * GS + j``): copied (FLOAT), or
    fp8/int8 codes with no scale, the static scale S[h * ss_h], or per-group scales made here
    (amax / qmax, 1 where amax is 0) and stored to S at the slot."""
    g = tl.arange(0, NGP)[None, :, None]
    j = tl.arange(0, GSP)[None, None, :]
    d = g * GS + j
    row = ok[:, None, None]
    mask = row & (j < GS) & (d < D)
    x = tl.load(X + n[:, None, None] * sx_n + h[:, None, None] * sx_h + d, mask=mask, other=0.0)
    dst = P + slot[:, None, None] * sp_slot + h[:, None, None] * sp_h + d
    if KIND == 0:
        tl.store(dst, x.to(P.dtype.element_ty), mask=mask)
    else:
        xf = x.to(tl.float32)
        if SC == 1:
            s = tl.load(S + h * ss_h, mask=ok, other=1.0)[:, None, None]
        elif SC == 2:
            amax = tl.max(tl.abs(xf), axis=2)
            s2 = tl.where(amax > 0.0, tl.math.div_rn(amax, qmax), 1.0)
            g2 = tl.arange(0, NGP)[None, :]
            sdst = S + slot[:, None] * ss_slot + h[:, None] * ss_h + g2
            tl.store(sdst, s2, mask=ok[:, None] & (g2 * GS < D))
            s = s2[:, :, None]
        else:
            s = tl.full([R, 1, 1], 1.0, tl.float32)
        q = _encode(xf, s, ENC_INT8, ENC_HW, ENC_FMAX, ENC_MANT, ENC_EMIN, ENC_NAN, ENC_NEG_ZERO, ENC_QTY)
        tl.store(dst, q, mask=mask)


@triton.jit
def _write_tq_keys(
    X, P, NRM, CB, BND, SIGNS, n, h, slot, ok, rot, sx_n, sx_h, sp_slot, sp_h, sn_slot, sn_h,
    D: tl.constexpr, R: tl.constexpr, BITS: tl.constexpr, LOG: tl.constexpr, NC: tl.constexpr,
):  # fmt: skip
    """TurboQuant keys, row by row: unit vector, rotation, code per channel (boundaries <= y),
    packed codes and the fp16 norm (over the centroids' norm with norm correction)."""
    d = tl.arange(0, D)[None, :]
    x = tl.load(X + n[:, None] * sx_n + h[:, None] * sx_h + d, mask=ok[:, None], other=0.0).to(tl.float32)
    nrm = tl.math.sqrt_rn(tl.sum(x * x, axis=1))
    safe = tl.maximum(nrm, 1.1754943508222875e-38)
    unit = tl.where(nrm[:, None] > 0.0, tl.math.div_rn(x, safe[:, None]), 0.0)
    y = _fwht(unit * tl.load(SIGNS + d), R, D, LOG) * rot
    idx = tl.zeros([R, D], tl.int32)
    for i in tl.static_range((1 << BITS) - 1):
        idx += (y >= tl.load(BND + i)).to(tl.int32)
    if NC:
        c = tl.load(CB + idx)
        nrm = tl.math.div_rn(nrm, tl.math.sqrt_rn(tl.sum(c * c, axis=1)))
    tl.store(NRM + slot * sn_slot + h * sn_h, _sat16(nrm), mask=ok)
    _pack_store(P + slot[:, None] * sp_slot + h[:, None] * sp_h, idx, R, D, D, BITS, ok[:, None])


@triton.jit
def _write_tq_values(
    X, P, VS, VZ, n, h, slot, ok, sx_n, sx_h, sp_slot, sp_h, ss_slot, ss_h,
    D: tl.constexpr, DP: tl.constexpr, R: tl.constexpr, BITS: tl.constexpr,
):  # fmt: skip
    """TurboQuant values, row by row: min/max, fp16 scale and zero-point, codes
    ``clamp(floor((x - zero) / scale + 0.5), 0, 2^b - 1)`` (0 where the scale is 0), packed."""
    d = tl.arange(0, DP)[None, :]
    m = ok[:, None] & (d < D)
    x = tl.load(X + n[:, None] * sx_n + h[:, None] * sx_h + d, mask=m, other=0.0).to(tl.float32)
    top: tl.constexpr = (1 << BITS) - 1
    lo = tl.min(tl.where(m, x, float("inf")), axis=1)
    hi = tl.max(tl.where(m, x, float("-inf")), axis=1)
    scale16 = _sat16(tl.math.div_rn(hi - lo, top * 1.0))
    zero16 = _sat16(lo)
    s = scale16.to(tl.float32)[:, None]
    z = zero16.to(tl.float32)[:, None]
    q = tl.floor(tl.math.div_rn(x - z, tl.where(s > 0.0, s, 1.0)) + 0.5)
    q = tl.minimum(tl.maximum(tl.where(s > 0.0, q, 0.0), 0.0), top * 1.0).to(tl.int32)
    tl.store(VS + slot * ss_slot + h * ss_h, scale16, mask=ok)
    tl.store(VZ + slot * ss_slot + h * ss_h, zero16, mask=ok)
    _pack_store(P + slot[:, None] * sp_slot + h[:, None] * sp_h, q, R, DP, D, BITS, ok[:, None])


@triton.jit
def _write_kernel(
    K, V, SLOTS, KP, VP, KS, VS, VZ, CB, BND, SIGNS,
    N, H, qmax, rot, sk_n, sk_h, sv_n, sv_h, skp_slot, skp_h, svp_slot, svp_h, sks_slot, sks_h,
    svs_slot, svs_h,
    D: tl.constexpr, DP: tl.constexpr, HP: tl.constexpr, BT: tl.constexpr,
    K_KIND: tl.constexpr, V_KIND: tl.constexpr, K_SC: tl.constexpr, V_SC: tl.constexpr,
    K_NGP: tl.constexpr, K_GS: tl.constexpr, K_GSP: tl.constexpr,
    V_NGP: tl.constexpr, V_GS: tl.constexpr, V_GSP: tl.constexpr, LOG: tl.constexpr, NC: tl.constexpr,
    ENC_INT8: tl.constexpr, ENC_HW: tl.constexpr, ENC_FMAX: tl.constexpr, ENC_MANT: tl.constexpr,
    ENC_EMIN: tl.constexpr, ENC_NAN: tl.constexpr, ENC_NEG_ZERO: tl.constexpr, ENC_QTY: tl.constexpr,
):  # fmt: skip
    """Tokens ``BT * program_id(0) ..`` (every head): keys and values into their slots SLOTS[n]
    (skipped when negative). KS is the key scale (static or dynamic plane) or, for TurboQuant codes,
    the k_norm plane; VS and VZ the value scale / zero-point planes."""
    R: tl.constexpr = BT * HP
    n, h, slot, ok = _rows(tl.program_id(0) * BT, N, H, SLOTS, HP, R)
    if K_KIND >= 4:
        _write_tq_keys(K, KP, KS, CB, BND, SIGNS, n, h, slot, ok, rot, sk_n, sk_h, skp_slot, skp_h,
                       sks_slot, sks_h, D, R, 4 if K_KIND == 4 else 3, LOG, NC)  # fmt: skip
    else:
        _write_scaled(K, KP, KS, n, h, slot, ok, qmax, sk_n, sk_h, skp_slot, skp_h, sks_slot, sks_h,
                      D, R, K_KIND, K_SC, K_GS, K_NGP, K_GSP, ENC_INT8, ENC_HW, ENC_FMAX, ENC_MANT,
                      ENC_EMIN, ENC_NAN, ENC_NEG_ZERO, ENC_QTY)  # fmt: skip
    if V_KIND >= 4:
        _write_tq_values(V, VP, VS, VZ, n, h, slot, ok, sv_n, sv_h, svp_slot, svp_h, svs_slot, svs_h,
                         D, DP, R, 4 if V_KIND == 4 else 3)  # fmt: skip
    else:
        _write_scaled(V, VP, VS, n, h, slot, ok, qmax, sv_n, sv_h, svp_slot, svp_h, svs_slot, svs_h,
                      D, R, V_KIND, V_SC, V_GS, V_NGP, V_GSP, ENC_INT8, ENC_HW, ENC_FMAX, ENC_MANT,
                      ENC_EMIN, ENC_NAN, ENC_NEG_ZERO, ENC_QTY)  # fmt: skip


_write_launch = Launcher(_write_kernel)


def _scale_strides(t: torch.Tensor | None) -> tuple[int, int]:
    """(slot, head) strides of a scale: a plane [slots, H, ...], or a static [1] / [H] scale."""
    if t is None:
        return 0, 0
    if t.dim() >= 2:
        return t.stride(0), t.stride(1)
    return 0, (1 if t.numel() > 1 else 0)


def _scale_planes(
    fmt: KVFormat,
    planes: dict[str, torch.Tensor],
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    scheme: KVScheme | None,
    who: str,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """What scales the keys and values (static per layer, stored per token, or TurboQuant's key
    norm) and the values' zero points, as both kernels read them."""
    ks = {STATIC: k_scale, DYNAMIC: planes.get("k_scale"), NORM: planes.get("k_norm")}.get(fmt.k_scale)
    vs = v_scale if fmt.v_scale == STATIC else planes.get("v_scale")
    if fmt.k_scale == STATIC and (ks is None or vs is None):
        raise ValueError(f"{who}: {scheme} needs its static k_scale and v_scale")
    return ks, vs, planes.get("v_zero")


def write_kv(
    scheme: KVScheme | None,
    planes: dict[str, torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tables: TQTables | None = None,
) -> None:
    """Quantize keys and values [N, H, D] (fp16/bf16/fp32) into ``planes`` (the cache's planes flat,
    [slots, H, *shape]) at ``slots`` [N] (negative: skipped). ``k_scale``/``v_scale``: the static
    fp32 [1] or [H] scales (static schemes); ``tables``: TurboQuant's, for rotated keys. One launch,
    no host synchronisation."""
    N, H, D = k.shape
    if N == 0:
        return
    fmt = kv_format(scheme, D)
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    slots = slots.reshape(-1)
    if slots.shape[0] != N:
        raise ValueError(f"write_kv: {N} tokens but {slots.shape[0]} slots")
    meta = _encode_meta(fmt.k_kind if fmt.k_kind in (E4M3, E5M2, INT8) else fmt.v_kind, k.device)
    hw = meta["ENC_HW"]
    kp, vp = _as_kernel_plane(planes["k"], hw, True), _as_kernel_plane(planes["v"], hw, True)
    ks, vs, vz = _scale_planes(fmt, planes, k_scale, v_scale, scheme, "write_kv")
    rotated = fmt.k_kind in (U4, U3)
    if rotated and tables is None:
        raise ValueError(f"write_kv: {scheme} needs TurboQuant's tables (code book, rotation signs)")
    dummy = kp
    sks = _scale_strides(ks)
    svs = _scale_strides(vs)
    DP = max(2, next_power_of_2(D))
    kg, vg = fmt.k_group, fmt.v_group
    HP = next_power_of_2(H)
    BT = max(1, WRITE_ROWS // HP)
    _write_launch((cdiv(N, BT),),
        k, v, slots, kp, vp,
        ks if ks is not None else dummy, vs if vs is not None else dummy, vz if vz is not None else dummy,
        tables.centroids if rotated else dummy, tables.bounds if rotated else dummy,
        tables.signs if rotated else dummy,
        N, H, float(fmt.qmax), 1.0 / math.sqrt(D), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kp.stride(0), kp.stride(1), vp.stride(0), vp.stride(1), *sks, *svs,
        D=D, DP=DP, HP=HP, BT=BT, K_KIND=fmt.k_kind, V_KIND=fmt.v_kind,
        K_SC=fmt.k_scale, V_SC=fmt.v_scale,
        K_NGP=next_power_of_2(cdiv(D, kg)), K_GS=kg, K_GSP=next_power_of_2(kg),
        V_NGP=next_power_of_2(cdiv(D, vg)), V_GS=vg, V_GSP=next_power_of_2(vg),
        LOG=_log2(DP), NC=bool(getattr(scheme, "norm_correction", False)),
        num_warps=4 if BT * HP * DP <= 4096 else 8, **meta,
    )  # fmt: skip


# -- decode attention ------------------------------------------------------------------------------


@triton.jit
def _dequant(
    row, srow, D: tl.constexpr, DP: tl.constexpr, KIND: tl.constexpr, SC: tl.constexpr, GS: tl.constexpr,
    HW: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """A tile of float / fp8 / int8 rows ([BN, 1] row pointers) in DT, columns past D zero; per-group
    scales (``srow``: [BN, 1] pointers to each row's scales) dequantize it element-wise, other scales
    are left to the caller."""
    d = tl.arange(0, DP)[None, :]
    if D == DP:
        c = tl.load(row + d)
    else:
        c = tl.load(row + d, mask=d < D)
    if SC == 2 and GS < D:
        if DP % GS == 0:  # one scale per group loaded, broadcast over its GS channels
            NG: tl.constexpr = DP // GS
            BN: tl.constexpr = c.shape[0]
            j = tl.arange(0, NG)[None, :]
            s = tl.load(srow + j, mask=j * GS < D, other=0.0)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], [BN, NG, GS]), [BN, DP])
        else:
            s = tl.load(srow + d // GS, mask=d < D, other=0.0)
        x = (_widen(c, KIND, HW, tl.float32) * s).to(DT)
    else:
        x = _widen(c, KIND, HW, DT)
    if D != DP:
        x = tl.where(d < D, x, 0.0)
    return x


@triton.jit
def _pair_table(CB, BITS: tl.constexpr, CODEBOOK: tl.constexpr):
    """int32 [2^(2 * BITS)]: entry ``i`` holds the fp16 bits of the element of code ``i & (2^BITS -
    1)`` in its low half and of code ``i >> BITS`` in its high half; elements are CB's centroids
    (CODEBOOK) or the codes themselves (values). Built once per program."""
    i = tl.arange(0, 1 << (2 * BITS))
    lo = i & ((1 << BITS) - 1)
    hi = i >> BITS
    if CODEBOOK:
        a = tl.load(CB + lo).to(tl.float16)
        b = tl.load(CB + hi).to(tl.float16)
    else:
        a = lo.to(tl.float16)
        b = hi.to(tl.float16)
    a32 = a.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return a32 | (b.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _pairs(row, D: tl.constexpr, DP: tl.constexpr, BITS: tl.constexpr):
    """The pair index (codes of elements 2j and 2j + 1, the first in the low bits) of each row's
    pairs, int32 [BN, DP / 2]: a 4-bit byte as it is; 3-bit groups cut into four 6-bit fields."""
    if BITS == 4:
        j = tl.arange(0, DP // 2)
        if D == DP:
            pairs = tl.load(row + j[None, :]).to(tl.int32)
        else:
            pairs = tl.load(row + j[None, :], mask=(j < D // 2)[None, :], other=0).to(tl.int32)
    else:
        w = _words24(row, D, DP)
        q = tl.join(tl.join(w & 63, (w >> 12) & 63), tl.join((w >> 6) & 63, (w >> 18) & 63))
        pairs = tl.reshape(q, [w.shape[0], DP // 2])
    return pairs


@triton.jit
def _lookup(pairs, tab, DT: tl.constexpr):
    """Pair indices [BN, NP] -> elements [BN, 2 NP] in DT through a :func:`_pair_table` (one
    gather from shared memory per two elements, no int-to-float conversion)."""
    BN: tl.constexpr = pairs.shape[0]
    NP: tl.constexpr = pairs.shape[1]
    w = tl.reshape(tl.gather(tab, tl.reshape(pairs, [BN * NP]), 0), [BN, NP])
    lo = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.reshape(tl.join(lo, hi), [BN, 2 * NP]).to(DT)


@triton.jit
def _code_words(row, D: tl.constexpr, DP: tl.constexpr, PER: tl.constexpr):
    """Codes as 16-bit words of ``PER`` (4: 4-bit codes, 2: bytes), uint16 [BN, DP / PER] (``row``:
    [BN, 1] pointers to the rows' first byte): word w holds channels PER w .. PER w + PER - 1, channel
    PER w + n in bits (16 / PER) n onwards; words past D / PER read as 0."""
    w = tl.arange(0, DP // PER)
    ptr = row.to(tl.pointer_type(tl.uint16))
    if D == DP:
        c = tl.load(ptr + w[None, :])
    else:
        c = tl.load(ptr + w[None, :], mask=(w < D // PER)[None, :], other=0)
    return c


@triton.jit
def _centroid_code(w, N: tl.constexpr, CB, CBITS: tl.constexpr, DT: tl.constexpr):
    """Key decode (portable): the centroid of code N of each 16-bit word, read from the code book
    in global memory (a small table the cache keeps)."""
    return tl.load(CB + ((w >> (4 * N)) & 15)).to(DT)


@triton.jit
def _uint_code(w, N: tl.constexpr, DT: tl.constexpr):
    """Value decode (portable): code N of each 16-bit word in DT, exact. fp16: the code ORed into
    the mantissa of 1024, minus 1024 (integer ops and one subtraction, no conversion)."""
    c = (w >> (4 * N)) & 15
    if DT == tl.float16:
        v = (c | 0x6400).to(tl.float16, bitcast=True) - 1024.0
    else:
        v = c.to(DT)
    return v


@triton.jit
def _byte_code(w, N: tl.constexpr, KIND: tl.constexpr, HW: tl.constexpr, DT: tl.constexpr):
    """Value decode (portable): byte N of each 16-bit word (an e4m3 or e5m2 code) in DT, exact,
    as :func:`_widen` widens it."""
    c = (w >> (8 * N)) & 0xFF
    if KIND == 1 and HW:
        out = c.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16).to(DT)
    else:
        out = _widen(c, KIND, False, DT)
    return out


@triton.jit
def _tile_keys(
    KP, KS, slot, h, skp_slot, skp_h, sks_slot, sks_h, CB, ktab,
    D: tl.constexpr, DP: tl.constexpr, KIND: tl.constexpr, SC: tl.constexpr, GS: tl.constexpr,
    HW: tl.constexpr, DT: tl.constexpr, PAIRS: tl.constexpr,
):  # fmt: skip
    """Keys of one tile as the score's dot operand [BN, DP] in DT: values, or codes whose
    per-token/static factor the caller applies to the logits (TurboQuant: centroids, through the
    pair table in fp16 or one fp32 gather per element)."""
    row = KP + slot[:, None] * skp_slot + h * skp_h
    if KIND >= 4:
        if PAIRS:
            k = _lookup(_pairs(row, D, DP, 4 if KIND == 4 else 3), ktab, DT)
        else:
            k = tl.load(CB + _unpack(row, D, DP, 4 if KIND == 4 else 3)).to(DT)
    else:
        k = _dequant(row, KS + slot[:, None] * sks_slot + h * sks_h, D, DP, KIND, SC, GS, HW, DT)
    return k


@triton.jit
def _tile_values(
    VP, VS, slot, h, svp_slot, svp_h, svs_slot, svs_h, vtab,
    D: tl.constexpr, DP: tl.constexpr, KIND: tl.constexpr, SC: tl.constexpr, GS: tl.constexpr,
    HW: tl.constexpr, DT: tl.constexpr, PAIRS: tl.constexpr,
):  # fmt: skip
    """Values of one tile as the second dot's operand [BN, DP] in DT (codes where the scale is
    applied to the probabilities or the accumulator)."""
    row = VP + slot[:, None] * svp_slot + h * svp_h
    if KIND >= 4:
        if PAIRS:
            v = _lookup(_pairs(row, D, DP, 4 if KIND == 4 else 3), vtab, DT)
        else:
            v = _unpack(row, D, DP, 4 if KIND == 4 else 3).to(DT)
    else:
        v = _dequant(row, VS + slot[:, None] * svs_slot + h * svs_h, D, DP, KIND, SC, GS, HW, DT)
    return v


@triton.jit
def _tile_meta(
    n0, L, lo, bt, mrow, KS, VS, VZ, h, sbt_t, sm_t, sks_slot, sks_h, svs_slot, svs_h,
    BN: tl.constexpr, BS: tl.constexpr, IDX: tl.constexpr, HAS_MASK: tl.constexpr, K_TOK: tl.constexpr,
    V_TOK: tl.constexpr,
):  # fmt: skip
    """Tokens ``n0 .. n0 + BN``: which are attended (``live``), their slots, and their per-token
    key factor (fp32 scale or fp16 norm), value scale and zero-point (0 where not live or unused).
    ``bt``/``mrow``: the sequence's block-table and mask rows. Past the sequence every load is
    masked off, so the prefetch of the tile after the last costs nothing."""
    i = tl.arange(0, BN)
    t = n0 + i
    live = (t < L) & (t >= lo)
    if BS % BN == 0:  # the tile lies in one page: one block-table entry, consecutive slots
        blk = tl.maximum(tl.load(bt + (n0 // BS) * sbt_t, mask=n0 < L, other=0), 0)
        slot = blk.to(IDX) * BS + (n0 % BS) + i
    elif BN % BS == 0:  # whole pages
        blk = tl.load(bt + (n0 // BS + i // BS) * sbt_t, mask=live, other=0)
        slot = blk.to(IDX) * BS + i % BS
    else:
        blk = tl.load(bt + (t // BS) * sbt_t, mask=live, other=0)
        slot = blk.to(IDX) * BS + t % BS
    if HAS_MASK:
        live = live & (tl.load(mrow + t * sm_t, mask=live, other=0) != 0)
    kt = tl.zeros([BN], tl.float32)
    vt = tl.zeros([BN], tl.float32)
    vz = tl.zeros([BN], tl.float32)
    if K_TOK:
        kt = tl.load(KS + slot * sks_slot + h * sks_h, mask=live, other=0.0).to(tl.float32)
    if V_TOK:
        vt = tl.load(VS + slot * svs_slot + h * svs_h, mask=live, other=0.0).to(tl.float32)
    if V_TOK == 2:
        vz = tl.load(VZ + slot * svs_slot + h * svs_h, mask=live, other=0.0).to(tl.float32)
    return live, slot, kt, vt, vz


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """fp32-accumulated dot; IEEE (fp32 operands) keeps full fp32 products (no TF32)."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _dot_acc(a, b, acc, IEEE: tl.constexpr):
    """``acc + a . b`` accumulated in the matrix unit."""
    if IEEE:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _word_scores(kw, q0, q1, q2, q3, CB, CBITS: tl.constexpr, KDEC: tl.constexpr, DT: tl.constexpr,
                 TRANS: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """Scores of a tile of 4-bit key words [BN, DP / 4]: one dot per code position n against q's
    channels 4w + n (``qn``: [BG, DP / 4]); [BN, BG] when TRANS, else [BG, BN]."""
    if TRANS:
        s = _dot(KDEC(kw, 0, CB, CBITS, DT), tl.trans(q0), IEEE)
        s = _dot_acc(KDEC(kw, 1, CB, CBITS, DT), tl.trans(q1), s, IEEE)
        s = _dot_acc(KDEC(kw, 2, CB, CBITS, DT), tl.trans(q2), s, IEEE)
        s = _dot_acc(KDEC(kw, 3, CB, CBITS, DT), tl.trans(q3), s, IEEE)
    else:
        s = _dot(q0, tl.trans(KDEC(kw, 0, CB, CBITS, DT)), IEEE)
        s = _dot_acc(q1, tl.trans(KDEC(kw, 1, CB, CBITS, DT)), s, IEEE)
        s = _dot_acc(q2, tl.trans(KDEC(kw, 2, CB, CBITS, DT)), s, IEEE)
        s = _dot_acc(q3, tl.trans(KDEC(kw, 3, CB, CBITS, DT)), s, IEEE)
    return s


@triton.jit
def _tok(x, TRANS: tl.constexpr):
    """A per-token vector [BN] broadcast along the score tile's token axis."""
    if TRANS:
        out = x[:, None]
    else:
        out = x[None, :]
    return out


@triton.jit
def _row(x, TRANS: tl.constexpr):
    """A per-query-head vector [BG] broadcast along the score tile's head axis."""
    if TRANS:
        out = x[None, :]
    else:
        out = x[:, None]
    return out


@triton.jit
def _finish(acc, m, den, SINKS, hq, gmask, HAS_SINKS: tl.constexpr):
    """Normalised output rows [BG, DP] from one split's (or the merged) max, sum and accumulator;
    a sink adds exp(sink) to the denominator only. A row with nothing to attend gives 0."""
    if HAS_SINKS:
        sk = tl.load(SINKS + hq, mask=gmask, other=0.0).to(tl.float32) * 1.4426950408889634
        mx = tl.maximum(m, sk)
        a = tl.math.exp2(m - mx)
        den = den * a + tl.math.exp2(sk - mx)
        acc = acc * a[:, None]
    return tl.where(den[:, None] > 0.0, acc / tl.where(den > 0.0, den, 1.0)[:, None], 0.0)


@triton.jit
def _decode_kernel(
    Q, KP, VP, KS, VS, VZ, CB, SIGNS, BT, LENS, MASK, SINKS, PM, PL, PO, OUT,
    sm_scale, qk_mult, cap_in, cap_out, rot, window, max_len, H,
    sq_b, sq_h, skp_slot, skp_h, svp_slot, svp_h, sks_slot, sks_h, svs_slot, svs_h,
    sbt_b, sbt_t, slen, sm_b, sm_t, sp_b, sp_h, sp_s, so_b, so_h,
    G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BN: tl.constexpr,
    BS: tl.constexpr, K_KIND: tl.constexpr, V_KIND: tl.constexpr, K_SC: tl.constexpr,
    V_SC: tl.constexpr, K_GS: tl.constexpr, V_GS: tl.constexpr, LOG: tl.constexpr, HW: tl.constexpr,
    KDT: tl.constexpr, VDT: tl.constexpr, IEEE: tl.constexpr, PAIRS: tl.constexpr, IDX: tl.constexpr,
    HAS_MASK: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, DIRECT: tl.constexpr,
    K_TOK: tl.constexpr, V_TOK: tl.constexpr, TRANS: tl.constexpr, KW: tl.constexpr, VW: tl.constexpr,
    KDEC: tl.constexpr, VDEC: tl.constexpr, CBITS: tl.constexpr, VB: tl.constexpr, BDEC: tl.constexpr,
    LAUNCH: tl.constexpr,
):  # fmt: skip
    """Program (KV head h, split sp, sequence b): the G query heads of h over the split's tiles.
    DIRECT (one split): the output itself; else the split's max, sum and accumulator (base 2).
    ``LAUNCH``: the vendor's signal that the combine may launch (it waits for this grid's end).
    KW / VW: 4-bit key / value codes read as 16-bit words and decoded by KDEC / VDEC; VB: fp8
    values (one scale per token or tensor) read as 16-bit words of two and decoded by BDEC,
    one accumulator per byte, so the words reach the dot through 16-bit transposing loads."""
    LAUNCH()
    h = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    S = tl.num_programs(1)
    b64 = b.to(tl.int64)
    pos = tl.load(LENS + b * slen).to(tl.int32) - 1  # the query's position
    L = tl.minimum(pos + 1, max_len)  # keys past max_len are never read (the torch path's bound)
    lo = tl.where(window > 0, tl.maximum(pos + 1 - window, 0), 0)
    t0 = (lo // BN) * BN
    per = tl.cdiv(tl.cdiv(tl.maximum(L - t0, 0), BN), S) * BN
    start = t0 + sp * per
    end = tl.minimum(start + per, L)

    TOK: tl.constexpr = 0 if TRANS else 1  # the token axis of a score tile
    g = tl.arange(0, BG)
    gmask = g < G
    hq = h * G + g
    d = tl.arange(0, DP)
    q = tl.load(Q + b64 * sq_b + hq[:, None] * sq_h + d[None, :], mask=gmask[:, None] & (d < D)[None, :],
                other=0.0).to(tl.float32)  # fmt: skip
    if K_KIND >= 4:  # rotated keys: score qR against the centroids
        q = _fwht(q * tl.load(SIGNS + d)[None, :], BG, DP, LOG) * rot
    # the softmax scale goes into q before the 16-bit cast (an fp16 q then overflows only past
    # 65504 / scale)
    qd = (q * sm_scale).to(KDT)
    if KW:  # q's channels 4w + n, n = 0..3, each scored against code n of the key words
        qa, qb = tl.split(tl.reshape(qd, [BG, DP // 4, 2, 2]))
        q0, q2 = tl.split(qa)
        q1, q3 = tl.split(qb)
    if K_SC == 1:  # a static key scale multiplies every logit
        ksc = tl.load(KS + h * sks_h)
        qk_mult = qk_mult * ksc
        cap_in = cap_in * ksc

    ktab = 0
    vtab = 0
    if PAIRS:
        if K_KIND >= 4 and not KW:
            ktab = _pair_table(CB, 4 if K_KIND == 4 else 3, True)
        if V_KIND >= 4 and not VW:
            vtab = _pair_table(CB, 4 if V_KIND == 4 else 3, False)

    # the running max (log2 units) starts finite: a tile without a live token then leaves every
    # accumulator as it was, with no NaN from (-inf) - (-inf)
    m = tl.full([BG], -1.0e30, tl.float32)
    # the sums of the probabilities (and, for TurboQuant values, of probability x zero-point) are
    # kept per score element and reduced once after the loop: no exchange between threads per tile
    if TRANS:
        dsum = tl.zeros([BN, BG], tl.float32)
    else:
        dsum = tl.zeros([BG, BN], tl.float32)
    zsum = dsum
    # per-token data (slots, mask, scales) of the next tile is loaded one iteration ahead, so its
    # latency hides behind this tile's work (the pipeliner stages only the dots' operands)
    live, slot, kt, vt, vz = _tile_meta(
        start, L, lo, BT + b64 * sbt_b, MASK + b64 * sm_b, KS, VS, VZ, h, sbt_t, sm_t, sks_slot, sks_h,
        svs_slot, svs_h, BN, BS, IDX, HAS_MASK, K_TOK, V_TOK,
    )  # fmt: skip
    # TRANS: scores as [BN, BG] (keys the dot's M side, q^T resident), the accumulator as [DP, BG];
    # VW: four accumulators [BG, DP / 4] (channels 4w + n), the probabilities the dots' left side
    if TRANS and not (VW or VB):
        acc = tl.zeros([DP, BG], tl.float32)
    else:
        acc = tl.zeros([BG, DP], tl.float32)
    a0 = tl.zeros([BG, DP // 4], tl.float32)
    a1 = tl.zeros([BG, DP // 4], tl.float32)
    a2 = tl.zeros([BG, DP // 4], tl.float32)
    a3 = tl.zeros([BG, DP // 4], tl.float32)
    b0 = tl.zeros([BG, DP // 2], tl.float32)
    b1 = tl.zeros([BG, DP // 2], tl.float32)
    for n0 in range(start, end, BN):
        nxt = _tile_meta(
            n0 + BN, L, lo, BT + b64 * sbt_b, MASK + b64 * sm_b, KS, VS, VZ, h, sbt_t, sm_t, sks_slot, sks_h,
            svs_slot, svs_h, BN, BS, IDX, HAS_MASK, K_TOK, V_TOK,
        )  # fmt: skip
        if KW:
            kw = _code_words(KP + slot[:, None] * skp_slot + h * skp_h, D, DP, 4)
            s = _word_scores(kw, q0, q1, q2, q3, CB, CBITS, KDEC, KDT, TRANS, IEEE)
        else:
            k = _tile_keys(KP, KS, slot, h, skp_slot, skp_h, sks_slot, sks_h, CB, ktab,
                           D, DP, K_KIND, K_SC, K_GS, HW, KDT, PAIRS)  # fmt: skip
            if TRANS:
                s = _dot(k, tl.trans(qd), IEEE)
            else:
                s = _dot(qd, tl.trans(k), IEEE)
        if SOFTCAP:
            if K_TOK:  # per-token key scales, TurboQuant key norms
                s = s * _tok(kt, TRANS)
            e = tl.math.exp2((2.0 * 1.4426950408889634) * (s * cap_in))
            s = (1.0 - 2.0 / (e + 1.0)) * cap_out
        elif K_TOK:  # the logit factor joins the per-token one (a product per token, not per score)
            s = s * _tok(kt * qk_mult, TRANS)
        else:
            s = s * qk_mult
        s = tl.where(_tok(live, TRANS), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=TOK))
        alpha = tl.math.exp2(m - m_new)
        p = tl.math.exp2(s - _row(m_new, TRANS))
        dsum = dsum * _row(alpha, TRANS) + p
        if V_TOK == 2:  # TurboQuant values: scale on the probabilities, zero-point as a row sum
            zsum = zsum * _row(alpha, TRANS) + p * _tok(vz, TRANS)
        if V_TOK:
            p = p * _tok(vt, TRANS)
        if VW:  # the words are the dots' right side as stored (their decode needs no transpose)
            vw = _code_words(VP + slot[:, None] * svp_slot + h * svp_h, D, DP, 4)
            pv = p.to(VDT)
            if TRANS:
                pv = tl.trans(pv)
            a0 = _dot_acc(pv, VDEC(vw, 0, VDT), a0 * alpha[:, None], IEEE)
            a1 = _dot_acc(pv, VDEC(vw, 1, VDT), a1 * alpha[:, None], IEEE)
            a2 = _dot_acc(pv, VDEC(vw, 2, VDT), a2 * alpha[:, None], IEEE)
            a3 = _dot_acc(pv, VDEC(vw, 3, VDT), a3 * alpha[:, None], IEEE)
        elif VB:  # the words the dots' right side as stored, the probabilities their left side
            vw = _code_words(VP + slot[:, None] * svp_slot + h * svp_h, D, DP, 2)
            pv = p.to(VDT)
            if TRANS:
                pv = tl.trans(pv)
            b0 = _dot_acc(pv, BDEC(vw, 0, V_KIND, HW, VDT), b0 * alpha[:, None], IEEE)
            b1 = _dot_acc(pv, BDEC(vw, 1, V_KIND, HW, VDT), b1 * alpha[:, None], IEEE)
        else:
            v = _tile_values(VP, VS, slot, h, svp_slot, svp_h, svs_slot, svs_h, vtab,
                             D, DP, V_KIND, V_SC, V_GS, HW, VDT, PAIRS)  # fmt: skip
            if TRANS:
                acc = acc * alpha[None, :] + _dot(tl.trans(v), p.to(VDT), IEEE)
            else:
                acc = acc * alpha[:, None] + _dot(p.to(VDT), v, IEEE)
        m = m_new
        live, slot, kt, vt, vz = nxt
    if VW:  # channel 4w + n from accumulator n
        acc = tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), [BG, DP])
    elif VB:  # channel 2w + n from accumulator n
        acc = tl.reshape(tl.join(b0, b1), [BG, DP])
    elif TRANS:
        acc = tl.trans(acc)
    den = tl.sum(dsum, axis=TOK)
    if V_SC == 1:
        acc = acc * tl.load(VS + h * svs_h)
    elif V_SC == 4:
        acc = acc + tl.sum(zsum, axis=TOK)[:, None]

    if DIRECT:
        o = _finish(acc, m, den, SINKS, hq, gmask, HAS_SINKS)
        optr = OUT + b64 * so_b + hq[:, None] * so_h + d[None, :]
        tl.store(optr, o.to(OUT.dtype.element_ty), mask=gmask[:, None] & (d < D)[None, :])
    else:
        part = b64 * sp_b + hq * sp_h + sp * sp_s
        tl.store(PM + part, m, mask=gmask)
        tl.store(PL + part, den, mask=gmask)
        tl.store(PO + part[:, None] * DP + d[None, :], acc, mask=gmask[:, None])


_decode_launch = Launcher(_decode_kernel)

#: the portable decoders of the word paths (4-bit key centroids, 4-bit value codes, fp8 values)
PORTABLE_DECODERS = (_centroid_code, _uint_code, _byte_code)
#: ``QUANTRT_KV_TQ_DECODE=pairs``: 4-bit TurboQuant codes through the shared-memory pair tables
#: even where decoders are given (read once, as ``TRITON_INTERPRET``; for side-by-side timings)
_TQ_WORDS = os.environ.get("QUANTRT_KV_TQ_DECODE", "words").strip().lower() != "pairs"
#: ``QUANTRT_KV_BYTE_WORDS=0``: 8-bit values read as single bytes into the dot (the path before the
#: byte-pair words; for side-by-side timings)
_BYTE_WORDS = os.environ.get("QUANTRT_KV_BYTE_WORDS", "1").strip() != "0"
#: ``QUANTRT_KV_EARLY_COMBINE=0``: the split combine launched after the decode even where the
#: vendor gives a grid sync (for side-by-side timings and for ruling it out)
_EARLY = os.environ.get("QUANTRT_KV_EARLY_COMBINE", "1").strip() != "0"


def _words(plane: torch.Tensor, D: int, per_word: int = 4) -> bool:
    """Whether a plane of codes (``per_word`` to 16 bits) reads as aligned 16-bit words."""
    return D % per_word == 0 and plane.data_ptr() % 2 == 0 and all(s % 2 == 0 for s in plane.stride()[:2])


def byte_words(fmt: KVFormat, q_dtype: torch.dtype, vp: torch.Tensor, D: int, decoders: Any) -> bool:
    """Whether a decode reads its values as byte-pair words (``_decode_kernel``'s VB): fp8 values
    with one scale per token or tensor, 16-bit queries, rows that make whole aligned 16-bit words,
    and decoders given by the backend (``QUANTRT_KV_BYTE_WORDS=0``: never). int8 values stay byte
    by byte: read as words they ran 1.35-1.4x slower on the H100 (docs/performance.md)."""
    return (
        _BYTE_WORDS
        and decoders is not None
        and fmt.v_kind in (E4M3, E5M2)
        and not (fmt.v_scale == DYNAMIC and fmt.v_group < D)
        and q_dtype != torch.float32
        and _words(vp, D, 2)
    )


@triton.jit
def _no_grid_sync():
    """The portable stand-in for a vendor's grid dependency hooks (:func:`decode_kv`'s
    ``grid_sync``): nothing to signal or wait for, the combine launching after the decode."""
    pass


@triton.jit
def _combine_kernel(
    PM, PL, PO, SINKS, OUT, S, sp_b, sp_h, so_b, so_h,
    D: tl.constexpr, DP: tl.constexpr, SC: tl.constexpr, HAS_SINKS: tl.constexpr, WAIT: tl.constexpr,
):  # fmt: skip
    """Program (query head, sequence): the splits merged by log-sum-exp, SC at a time with one
    round of loads each (an online merge: up to SC splits cost one round trip), normalised, stored.
    ``WAIT``: the vendor's wait for the decode grid where the combine launched before it ended."""
    WAIT()
    hq = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, DP)
    base = b * sp_b + hq * sp_h
    c = tl.arange(0, SC)
    mx = tl.full([1], float("-inf"), tl.float32)
    den = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, DP], tl.float32)
    for c0 in range(0, S, SC):
        ok = c0 + c < S
        pm = tl.load(PM + base + c0 + c, mask=ok, other=float("-inf"))
        pl = tl.load(PL + base + c0 + c, mask=ok, other=0.0)
        po = tl.load(PO + (base + c0 + c)[:, None] * DP + d[None, :], mask=ok[:, None], other=0.0)
        m_new = tl.maximum(mx, tl.max(pm, axis=0))  # finite: a split's max starts at -1e30
        a = tl.math.exp2(mx - m_new)
        w = tl.math.exp2(pm - m_new)
        den = den * a + tl.sum(w * pl, axis=0)
        acc = acc * a[:, None] + tl.sum(po * w[:, None], axis=0)[None, :]
        mx = m_new
    one = tl.arange(0, 1)
    o = _finish(acc, mx, den, SINKS, hq + one, one < 1, HAS_SINKS)
    dst = OUT + b * so_b + hq * so_h + d[None, :] + one[:, None]
    tl.store(dst, o.to(OUT.dtype.element_ty), mask=(d < D)[None, :])


_combine_launch = Launcher(_combine_kernel)


def decode_kv(
    q: torch.Tensor,
    scheme: KVScheme | None,
    planes: dict[str, torch.Tensor],
    block_size: int,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    *,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tables: TQTables | None = None,
    config: DecodeConfig | None = None,
    decoders: tuple[Any, Any] | None = None,
    grid_sync: tuple[Any, Any] | None = None,
) -> torch.Tensor:
    """Decode attention, q [B, Hq, D] (fp16/bf16/fp32) -> [B, Hq, D] in q's dtype, over the pages'
    flat ``planes`` ([slots, H, *shape]) through ``block_table`` [B, >= cdiv(max_len, block_size)]
    (int32/int64), ``seq_lens`` [B] int32 on q's device (read by the kernel), ``mask`` [B, >= max_len]
    bool. Semantics as ``quantrt.kv.kernels``; ``tables``: TurboQuant's (rotated keys); ``config``:
    the launch shape (default :func:`decode_config`); ``decoders``: the (key, value) decodes of
    4-bit TurboQuant codes read as 16-bit words, exact ones a backend makes fast for its GPU
    (``backends/cuda/triton_kv_decode.py``; :data:`PORTABLE_DECODERS` run anywhere, and stand in
    for any under the interpreter, which runs no inline assembly), None for the shared-memory pair
    tables; ``grid_sync``: a vendor's (signal, wait) that let the split combine launch before the
    decode grid ends (NVIDIA's programmatic dependent launch, ``backends/cuda/triton_grid.py``;
    ``QUANTRT_KV_EARLY_COMBINE=0`` ignores it), None to launch it after. No host synchronisation."""
    B, Hq, D = q.shape
    kp, vp = planes["k"], planes["v"]
    H = kp.shape[1]
    if Hq % H:
        raise ValueError(f"decode_kv: {Hq} query heads are not a multiple of {H} KV heads")
    G = Hq // H
    fmt = kv_format(scheme, D)
    rotated = fmt.k_kind in (U4, U3)
    if rotated and tables is None:
        raise ValueError(f"decode_kv: {scheme} needs TurboQuant's tables (code book, rotation signs)")
    if rotated and D < 16:
        raise ValueError(f"decode_kv: rotated keys need head_dim >= 16 (the dot's depth), found {D}")
    if q.dtype not in _DOT_DTYPES:
        raise ValueError(f"decode_kv: q must be float16, bfloat16 or float32, found {q.dtype}")
    cfg = config or decode_config(B, H, max_len, D, device_sms(q.device), fmt)
    cfg.check()
    out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    hw = hw_fp8(q.device)
    kp, vp = _as_kernel_plane(kp, hw), _as_kernel_plane(vp, hw)
    ks, vs, vz = _scale_planes(fmt, planes, k_scale, v_scale, scheme, "decode_kv")
    S = max(1, min(cfg.num_splits, cdiv(max(max_len, 1), cfg.block_n)))
    direct = S == 1
    DP = max(16, next_power_of_2(D))
    if direct:
        pm = pl = po = out
    else:
        pm = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
        po = torch.empty(B, Hq, S, DP, dtype=torch.float32, device=q.device)
    kdt, vdt = dot_dtypes(q.dtype, fmt, planes["k"].dtype)
    cb = tables.centroids_as(kdt) if rotated else kp
    words = _TQ_WORDS and decoders is not None
    kw = words and fmt.k_kind == U4 and _words(kp, D)
    vw = words and fmt.v_kind == U4 and _words(vp, D)
    vb = byte_words(fmt, q.dtype, vp, D, decoders)
    kdec, vdec, bdec = PORTABLE_DECODERS if decoders is None or _interpreted() else decoders
    dummy = kp
    early = not direct and early_sync(grid_sync) is not None
    sks = _scale_strides(ks)
    svs = _scale_strides(vs)
    has_cap = bool(softcap)
    _decode_launch((H, S, B),
        q, kp, vp, ks if ks is not None else dummy, vs if vs is not None else dummy,
        vz if vz is not None else dummy, cb, tables.signs if rotated else dummy,
        block_table, seq_lens, mask if mask is not None else block_table,
        sinks if sinks is not None else q, pm, pl, po, out,
        float(scale), LOG2E, 1.0 / softcap if has_cap else 0.0, float(softcap * LOG2E) if has_cap else 0.0,
        1.0 / math.sqrt(D), int(window or 0), int(max_len), H,
        q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), vp.stride(0), vp.stride(1), *sks, *svs,
        block_table.stride(0), block_table.stride(1), seq_lens.stride(0),
        mask.stride(0) if mask is not None else 0, mask.stride(1) if mask is not None else 0,
        pm.stride(0) if not direct else 0, pm.stride(1) if not direct else 0, 1 if not direct else 0,
        out.stride(0), out.stride(1),
        G=G, BG=max(16, next_power_of_2(G)), D=D, DP=DP, BN=cfg.block_n, BS=block_size,
        K_KIND=fmt.k_kind, V_KIND=fmt.v_kind, K_SC=fmt.k_scale, V_SC=fmt.v_scale,
        K_GS=fmt.k_group, V_GS=fmt.v_group, LOG=_log2(DP), HW=hw, KDT=_DOT_DTYPES[kdt], VDT=_DOT_DTYPES[vdt],
        IEEE=q.dtype == torch.float32, PAIRS=q.dtype != torch.float32,
        KW=kw, VW=vw, KDEC=kdec, VDEC=vdec, CBITS=tables.centroid_bits() if kw else (), VB=vb, BDEC=bdec,
        IDX=tl.int64 if _wide(planes) else tl.int32,
        K_TOK=fmt.k_scale == NORM or (fmt.k_scale == DYNAMIC and fmt.k_group == D),
        V_TOK=2 if fmt.v_scale == AFFINE else int(fmt.v_scale == DYNAMIC and fmt.v_group == D),
        TRANS=cfg.transposed,
        HAS_MASK=mask is not None, SOFTCAP=has_cap, HAS_SINKS=sinks is not None, DIRECT=direct,
        LAUNCH=grid_sync[0] if early else _no_grid_sync,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if not direct:
        combine_splits(pm, pl, po, out, sinks, grid_sync if early else None)
    return out


def early_sync(grid_sync: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
    """``grid_sync`` where the split combine may launch before its decode ends: a vendor gave one,
    ``QUANTRT_KV_EARLY_COMBINE`` is not 0 and the kernels are compiled (not interpreted); else
    None. Every decode that feeds :func:`combine_splits` asks here."""
    return grid_sync if _EARLY and grid_sync is not None and not _interpreted() else None


def combine_splits(
    pm: torch.Tensor,
    pl: torch.Tensor,
    po: torch.Tensor,
    out: torch.Tensor,
    sinks: torch.Tensor | None,
    grid_sync: tuple[Any, Any] | None,
) -> None:
    """Merge the splits of a decode into ``out`` [B, Hq, D]: each split's max (log2 units) and
    sum ``pm``/``pl`` [B, Hq, S] and unnormalised rows ``po`` [B, Hq, S, DP] (fp32, contiguous);
    ``sinks`` join the denominators. ``grid_sync``: the vendor's (signal, wait) when the decode
    that fills them signalled early (the combine then launches before it ends), else None."""
    B, Hq, S = pm.shape
    _combine_launch((Hq, B),
        pm, pl, po, sinks if sinks is not None else pm, out, S, pm.stride(0), pm.stride(1),
        out.stride(0), out.stride(1),
        D=out.shape[-1], DP=po.shape[-1], SC=min(MERGE_SPLITS, next_power_of_2(S)), HAS_SINKS=sinks is not None,
        WAIT=grid_sync[1] if grid_sync is not None else _no_grid_sync, num_warps=4,
        **({"launch_pdl": True} if grid_sync is not None else {}),
    )  # fmt: skip
