"""Fused MoE grouped GEMM in Triton, portable across GPU vendors: one launch per projection over
every expert, the weights dequantized inside the K loop.

The routing comes sorted by expert and padded per expert to tiles of ``block_m`` assignments
(:meth:`quantrt.moe.ExpertBatch.aligned`): ``sorted_ids`` int32 [P] (the sentinel ``A`` pads),
``block_expert`` int32 [P / block_m] and ``num_padded`` int32 [1]. Program ``(tile, n-tile, k-split)``
computes ``block_m`` assignments of one expert times ``block_n`` output columns::

    y[a, n] = (x[row(a)] . W[e, n] + bias[e, n]) * (topk_weight[a] if weighted else 1)

``row(a) = a // row_div`` (``row_div`` = top_k when the first projection gathers token rows, 1 when
the input holds one row per assignment). Tiles at or past ``num_padded`` return at once; sentinel
rows are neither read (their row index is clamped to 0) nor stored. The grid holds a bound on the
used tiles known without reading the ids, ``cdiv(A + min(E, A) * (block_m - 1), block_m)``: at most
``min(E, A)`` experts have assignments, each wasting under one tile.

Rows of assignments to experts this rank does not hold (id ``E``) are zero. They sit at the tail of
the expert-sorted order (``order[offsets[E]:]``), so ``cdiv(N, block_n)`` extra programs store
zeros into exactly those rows, looping from ``offsets[E]`` to ``A``: nothing to do (one load) without
expert parallelism, and no output memset ever (``out`` may hold anything).

Weight kinds (``MoeWeights.kind``), all with an fp32 accumulator, bias and routing weight in the
epilogue, masked stores:

* ``int``: integer weight-only, 4 or 8 bits, symmetric (implicit zero 2^(b-1)) or with integer
  zero-points. 8-bit codes uint8 [E, N, K]; 4-bit codes re-paired by :func:`pair_nibbles` (byte j of
  each block of ``2 * pair`` k holds k = j and j + pair), so each nibble meets a contiguous run of x
  and one dot. ``q - z`` is an exact integer in x's dtype (the magic-number decode for 16-bit
  floats); group scales [E, N, K/G] (``block_k`` divides G) multiply each tile's fp32 partial sum,
  channel scales [E, N] the accumulator once after the loop.
* ``fp4``: NVFP4 / MXFP4 weight-only, codes paired as int4's, 1-byte scales [E, N, K/G] (e4m3 bits
  or :func:`bf16_byte_scales`' bytes, e8m0 exponents), NVFP4's global scale as an fp32 row scale
  [E, N]; value * scale is decoded exactly in fp32 (:func:`.lut4._values`, :func:`_fp4_scale`) and
  cast to x's dtype before the dots. Or (``layout`` "lane") the bytes of the CUDA tensor-core
  kernel's repack, so one copy of the experts serves both kernels: column tiles of 8 x 64 bytes per
  128-input chunk (:func:`_lane_cols`), x reordered per chunk (:func:`lane_order`) so each chunk is the
  paired layout with span 64, e5m3 scale bytes [E, groups, Npad] read through strides, the column
  factors as the row scale.
* ``rowwise``: W8A8 fp8 (or int8) codes [E, N, K] with one weight scale per row [E, N] and activation
  scales per input row (``act_scale_mode`` "row") or per expert ("expert": x holds one row per
  assignment, quantized with its expert's scale by :func:`quantize_per_expert`); both scales in the
  epilogue. fp8 partial sums are promoted to fp32 every K tile (``max_num_imprecise_acc``).
* ``block``: DeepSeek-style fp8 with (bn, bk) weight-scale blocks [E, ceil(N/bn), ceil(K/bk)] and
  per-token-group activation scales [rows, ceil(K/bk)]; every K tile's dot is scaled before it is
  accumulated (``block_n`` divides bn, ``block_k`` divides bk).

``split_k`` > 1 spreads the K tiles over programs that store fp32 partial sums, one plane per split
(no atomics, no memset), summed in a fixed order and rounded once by one more launch (small batches
of long K, where the tiles alone cannot fill the GPU); results are deterministic either way.
Nothing here synchronises with the host or autotunes; every launch shape comes
from the caller's :class:`MoeTile`, so a call captures into a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from . import act_quant
from .act_quant import _dynamic_scale, _encode
from .launch import Launcher, cdiv, next_power_of_2
from .lut4 import SCALE_KINDS, _scale, _values

#: MoeWeights.kind -> the kernel's KIND constexpr
KINDS = {"int": 0, "fp4": 1, "rowwise": 2, "block": 3}
#: fp4 scale kinds -> the kernel's SKIND constexpr: lut4's, and "bf16_byte" (NVFP4's e4m3 scales
#: re-encoded at load by :func:`bf16_byte_scales`)
FP4_SCALE_KINDS = {**SCALE_KINDS, "bf16_byte": 3, "e5m3": 4}
#: a "bf16_byte" scale byte c stands for the bf16 whose bits are c << 4, times 2^BF16_BYTE_LIFT
BF16_BYTE_LIFT = 117
#: an "e5m3" byte (the lane layout's, from ``cuda.mma_codebook.fp4_operands``) is the same bf16 times
#: 2^112; the products it scales carry 2^-14 there (the column factor holds 2^14), hence 112 - 14
E5M3_LIFT = 98
#: code layouts: "paired" (:func:`pair_nibbles`) and "lane" (the CUDA tensor-core kernel's, see
#: :func:`lane_positions`)
LAYOUTS = ("paired", "lane")
#: the lane layout: inputs per chunk, and bytes from one chunk of a column to the next
LANE_CHUNK = 128
LANE_CHUNK_STRIDE = tl.constexpr(2048)
#: activation-scale modes of the rowwise kind -> the kernel's ACT constexpr
ACT_SCALE_MODES = {"none": 0, "row": 1, "expert": 2}


@dataclass(frozen=True)
class MoeTile:
    """One launch shape: ``block_m`` assignments (all of one expert) x ``block_n`` columns per program,
    ``block_k`` inputs per K step, ``group_m`` M-tiles sweeping N together (L2 reuse of a weight tile),
    ``split_k`` programs per tile splitting K (fp32 partial planes when > 1); ``swap`` (weight-only kinds):
    each program computes the transposed tile W . x^T, the dequantized weights as the MMA's A
    operand (from registers) and the few rows of a small batch as its narrow N."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False

    def check(self, min_block_k: int) -> None:
        for name, lo in (("block_m", 16), ("block_n", 16), ("block_k", min_block_k)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < lo or v & (v - 1):
                raise ValueError(f"MoeTile: {name} must be a power of two >= {lo}, found {v!r}")
        for name in ("group_m", "split_k", "num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"MoeTile: {name} must be a positive integer, found {v!r}")


@dataclass(frozen=True)
class MoeWeights:
    """Every expert of one projection in the layout the kernel reads (see the module docstring).

    ``w``: codes [E, N, Kw] with unit stride along K; ``scales``: int group [E, N, K/G] or channel
    [E, N] (the activation dtype or fp32), fp4 uint8 [E, N, K/G], rowwise fp32 [E, N], block fp32
    [E, ceil(N/bn), ceil(K/bk)]; ``zeros``: like the int scales (asymmetric int only);
    ``row_scale``: fp32 [E, N] (NVFP4's global scale) or None.
    """

    kind: str
    w: torch.Tensor
    scales: torch.Tensor
    E: int
    N: int
    K: int
    zeros: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None
    bits: int = 4
    group: int = 0  # int: the scale group along K (0: channel scales); fp4: 16 or 32
    block: tuple[int, int] = (0, 0)  # block kind: (bn, bk)
    scale_kind: str = "e4m3"  # fp4: "e4m3" or "bf16_byte" (NVFP4), "e8m0" (MXFP4), "e5m3" (lane)

    pair: int = 0  # 4-bit codes: the pairing span of :func:`pair_nibbles` (0 for 8-bit codes)
    layout: str = "paired"  # fp4: "lane" reads the CUDA kernel's lane order (:func:`lane_positions`)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS or (self.layout == "lane" and (self.kind != "fp4" or self.pair != 64)):
            raise ValueError(f"MoeWeights: layout {self.layout!r} (lane: fp4 codes with pair 64)")
        four = self.kind == "fp4" or (self.kind == "int" and self.bits == 4)
        if four != (self.pair > 0) or (four and (self.pair < 8 or self.pair & (self.pair - 1))):
            raise ValueError(
                f"MoeWeights: {self.kind} {self.bits}-bit codes need pair "
                f"{'a power of two >= 8 (pair_nibbles)' if four else '0'}, found {self.pair}"
            )

    def min_block_k(self) -> int:
        """A K tile holds whole pairing blocks (2 * pair k) of 4-bit codes (one lane chunk exactly);
        tl.dot needs K >= 16 per dot, and 8-bit operands want K >= 32 on NVIDIA."""
        if self.pair:
            return max(32, 2 * self.pair)
        return 16 if self.kind == "int" and self.bits == 8 else 32


def pair_nibbles(codes: torch.Tensor, K: int, span: int) -> torch.Tensor:
    """Canonical 4-bit codes (uint8 [E, N, ceil(K/2)], even k in the low nibble) re-paired for the
    kernel: K padded with code 0 to a multiple of ``2 * span``, and in each block of ``2 * span`` k,
    byte j holds k = j (low nibble) and k = j + span (high nibble).

    Why: a K tile then reads x in runs of ``span`` consecutive k for each nibble (vector loads and
    one dot per nibble), where the canonical pairing needs x split into even and odd k (strided loads).
    One expert at a time, so the unpacked copy stays one expert's size."""
    E, N, KB = codes.shape
    if KB != (K + 1) // 2:
        raise ValueError(f"pair_nibbles: codes hold {KB} bytes per row, K={K} needs {(K + 1) // 2}")
    Kp = cdiv(max(K, 1), 2 * span) * 2 * span
    out = torch.empty(E, N, Kp // 2, dtype=torch.uint8, device=codes.device)
    for e in range(E):
        c = codes[e]
        v = torch.stack((c & 0xF, c >> 4), -1).reshape(N, 2 * KB)[:, :K]
        v = torch.nn.functional.pad(v, (0, Kp - K)).reshape(N, Kp // (2 * span), 2, span)
        out[e] = (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(N, Kp // 2)
    return out


def bf16_byte_scales(
    codes: torch.Tensor, scales: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's e4m3 scale bytes [..., K/G] re-encoded for the K loop, with the canonical e2m1 codes
    [..., K/2] they scale: ``(codes, bytes)`` holding the same products code x scale.

    Byte c is the scale's magnitude times 2^-117 as the bf16 whose bits are ``c << 4``: every e4m3
    magnitude (2^-9 .. 448, at most 4 significant bits) lands on a normal bf16 whose low four bits are
    zero and whose top four are too, so the K loop widens a scale with one shift instead of decoding e4m3
    through fp16 and fp32; the 2^117 rides on the e2m1 values' table (:mod:`..cuda.triton_decode`).
    A negative scale's group has its codes' sign bits flipped instead (e2m1 is sign-magnitude: the
    same products). Scale codes must not be NaN (0x7F, 0xFF: the caller refuses them)."""
    if group % 2 or codes.shape[-1] * 2 != scales.shape[-1] * group:
        raise ValueError(
            f"bf16_byte_scales: {list(codes.shape)} code bytes do not hold {list(scales.shape)} groups of {group}"
        )
    if codes.dim() > 2:  # one leading slice (an expert) at a time: the fp32 copies stay its size
        parts = [bf16_byte_scales(c, sc, group) for c, sc in zip(codes, scales, strict=True)]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    s = scales.view(torch.uint8).view(torch.float8_e4m3fn).float()
    lifted = (s.abs() * 2.0**-BF16_BYTE_LIFT).to(torch.bfloat16).view(torch.int16).to(torch.int32)
    if lifted.numel() and (bool(((lifted & 0xF) != 0).any()) or int(lifted.max()) >> 4 > 255):
        raise ValueError("bf16_byte_scales: a scale outside e4m3's magnitudes (NaN codes?)")
    flip = (s < 0).repeat_interleave(group // 2, dim=-1).to(torch.uint8) * 0x88
    return codes ^ flip, (lifted >> 4).to(torch.uint8)


def lane_positions() -> torch.Tensor:
    """int64 [128]: the input of a chunk that each position of a "lane" K tile multiplies.

    The lane layout is the CUDA tensor-core kernel's (``backends/cuda/wna16_layout.py``): per 8 output
    columns and chunk of 128 inputs, column g's 64 code bytes lie at 64 g (tiles of 8 columns side by
    side in groups of 4, 512 bytes each); byte 16 t + 4 j + i holds inputs 32 t + 8 j + 2 (u % 4) + u // 4
    of nibble slot u = 2 i (low) and 2 i + 1 (high). Position p < 64 is the low nibble of byte p and
    p >= 64 the high nibble of byte p - 64, so with x's inputs put in this order a chunk is
    :func:`pair_nibbles`'s layout with span 64, and both nibbles of a byte share one scale group."""
    p = torch.arange(LANE_CHUNK)
    h, b = p // 64, p % 64
    t, j, i = b // 16, (b % 16) // 4, b % 4
    u = 2 * i + h
    return 32 * t + 8 * j + 2 * (u % 4) + u // 4


def lane_order(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] -> [rows, chunks * 128]: each chunk's inputs in :func:`lane_positions`' order,
    K padded with zeros to whole chunks."""
    rows, K = x.shape
    chunks = cdiv(max(K, 1), LANE_CHUNK)
    pos = _lane_positions_on(x.device)
    if K != chunks * LANE_CHUNK:
        x = torch.nn.functional.pad(x, (0, chunks * LANE_CHUNK - K))
    return x.reshape(rows, chunks, LANE_CHUNK)[:, :, pos].reshape(rows, chunks * LANE_CHUNK)


_POSITIONS: dict[torch.device, torch.Tensor] = {}


def _lane_positions_on(device: torch.device) -> torch.Tensor:
    got = _POSITIONS.get(device)
    if got is None:
        got = _POSITIONS[device] = lane_positions().to(device)
    return got


# -- the grouped GEMM ----------------------------------------------------------------------------


@triton.jit
def _swizzle(pid, num_m, num_n, GM: tl.constexpr):
    """Grouped tile order: GM M-tiles sweep N together, so each weight tile is reused from L2."""
    per_group = GM * num_n
    first_m = (pid // per_group) * GM
    rows = tl.minimum(num_m - first_m, GM)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _paired_k(t, BK: tl.constexpr, P: tl.constexpr):
    """The k of the low nibbles of K tile ``t``'s code bytes (paired layout, see :func:`pair_nibbles`):
    byte j of the tile holds k and k + P; runs of P consecutive k, so x loads stay vectorised."""
    j = tl.arange(0, BK // 2)
    return t * BK + (j // P) * (2 * P) + j % P


@triton.jit
def _xt(x_rows, k, K, stride_xk, T: tl.constexpr, MASK: tl.constexpr):
    """x at inputs ``k`` of the tile's rows: [BM, len(k)], or [len(k), BM] when T (x_rows is then a
    [1, BM] pointer row); inputs past K read 0 when MASK."""
    if T:
        ptrs = x_rows + k[:, None] * stride_xk
        keep = (k < K)[:, None]
    else:
        ptrs = x_rows + k[None, :] * stride_xk
        keep = (k < K)[None, :]
    if MASK:
        x = tl.load(ptrs, mask=keep, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _lane_cols(n, KW):
    """Byte offsets of columns ``n``' first chunk in the lane layout (KW code bytes per column)."""
    return (n // 32) * (KW * 32) + ((n // 8) % 4) * 512 + (n % 8) * 64


@triton.jit
def _load_codes(
    w_cols, t, KW, ROWS: tl.constexpr, T: tl.constexpr, EVEN_K: tl.constexpr, STEP: tl.constexpr = 0
):  # fmt: skip
    """ROWS code bytes of K tile ``t`` per output column: [ROWS, BN] (w_cols a [1, BN] pointer row),
    or [BN, ROWS] when T (w_cols [BN, 1]); bytes past KW read 0. STEP: bytes from one K tile of a
    column to the next (0: ROWS, contiguous columns; the lane layout's chunk stride otherwise, with
    K padded to whole tiles: EVEN_K)."""
    if STEP == 0:
        kb = t * ROWS + tl.arange(0, ROWS)
    else:
        kb = t * STEP + tl.arange(0, ROWS)
    if T:
        ptrs = w_cols + kb[None, :]
        keep = (kb < KW)[None, :]
    else:
        ptrs = w_cols + kb[:, None]
        keep = (kb < KW)[:, None]
    if EVEN_K:
        w = tl.load(ptrs)
    else:
        w = tl.load(ptrs, mask=keep, other=0)
    return w


@triton.jit
def _mma(x, w, acc, T: tl.constexpr, IEEE: tl.constexpr):
    """acc + x . w ([BM, BN]), or acc + w . x ([BN, BM], swapped: the weights are the MMA's A
    operand, which tensor cores take from registers, and the few rows of x fill its narrow N)."""
    if T:
        if IEEE:
            acc = tl.dot(w, x, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)
    elif IEEE:
        acc = tl.dot(x, w, acc, input_precision="ieee")
    else:
        acc = tl.dot(x, w, acc)
    return acc


@triton.jit
def _nibble_minus(w, z, HIGH: tl.constexpr, like):
    """``q - z`` for one nibble ``q`` of each code byte, exact in ``like``'s dtype (z: fp32, integers,
    broadcast over the tile). 16-bit floats take the magic-number decode: the nibble ORed into the
    mantissa of 128 (bf16) or 1024 (fp16) is that constant plus q, and ``constant + z`` is subtracted:
    two integer ops and one subtraction per element, no conversion instructions."""
    b = w.to(tl.uint16)
    if HIGH:
        q = b >> 4
    else:
        q = b & 0xF
    if like.dtype == tl.bfloat16:
        v = (q | 0x4300).to(tl.bfloat16, bitcast=True) - (z + 128.0).to(tl.bfloat16)
    elif like.dtype == tl.float16:
        v = (q | 0x6400).to(tl.float16, bitcast=True) - (z + 1024.0).to(tl.float16)
    else:
        v = q.to(like.dtype) - z.to(like.dtype)
    return v


@triton.jit
def _int_step(
    acc, x_rows, w_cols, s_cols, z_cols, t, K, KW, stride_xk,
    G: tl.constexpr, BITS: tl.constexpr, P: tl.constexpr, BK: tl.constexpr, GROUPED: tl.constexpr,
    HAS_Z: tl.constexpr, T: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, DEC4: tl.constexpr,
):  # fmt: skip
    """K tile ``t`` of integer codes: acc += (x . (q - z)) * s. ``q - z`` is an exact integer in x's
    dtype (|q - z| <= 2^b), so the tile's dot runs on it and the group scale (BK divides G: one per
    column for the tile) multiplies the tile's fp32 partial sum, BM x BN products rather than the
    BK x BN of scaling the weights. Channel scales: the caller applies them once after the loop.
    w_cols/s_cols/z_cols: pointer rows over the tile's columns ([1, BN], or [BN, 1] when T)."""
    g = (t * BK) // G  # BK divides G: one scale (and zero) per column for the whole tile
    if HAS_Z:
        if GROUPED:
            z = tl.load(z_cols + g).to(tl.float32)
        else:
            z = tl.load(z_cols).to(tl.float32)
    else:
        z = tl.full(w_cols.shape, 2.0 ** (BITS - 1), tl.float32)
    zero = tl.zeros(acc.shape, tl.float32)
    if BITS == 4:
        k_lo = _paired_k(t, BK, P)
        x_lo = _xt(x_rows, k_lo, K, stride_xk, T, not EVEN_K)
        x_hi = _xt(x_rows, k_lo + P, K, stride_xk, T, not EVEN_K)
        w = _load_codes(w_cols, t, KW, BK // 2, T, EVEN_K)
        part = _mma(x_lo, DEC4(w, z, False, x_lo), zero, T, IEEE)
        part = _mma(x_hi, DEC4(w, z, True, x_lo), part, T, IEEE)
    else:
        xk = _xt(x_rows, t * BK + tl.arange(0, BK), K, stride_xk, T, not EVEN_K)
        w = _load_codes(w_cols, t, KW, BK, T, EVEN_K)
        part = _mma(xk, w.to(xk.dtype) - z.to(xk.dtype), zero, T, IEEE)  # |q - z| <= 256: exact
    if GROUPED:
        acc += part * tl.load(s_cols + g).to(tl.float32)
    else:
        acc += part
    return acc


@triton.jit
def _fp4_half(w, s, HIGH: tl.constexpr, G: tl.constexpr, SKIND: tl.constexpr, T: tl.constexpr):
    """One nibble of the e2m1 codes [BK/2, BN] (T: [BN, BK/2]) -> value * scale in fp32, exact; s is
    the half's group scales [BK/2/G, BN] (T: [BN, BK/2/G]) as :func:`.lut4._scale` returns them."""
    v = _values(w, w, 1, HIGH, True)
    if SKIND != 0:
        v = v * 16384.0  # e2m1's 2^-14 decode factor (folded into the e4m3 scale)
    # (no early returns: the compiler, unlike the interpreter, goes on past a return in a static if)
    if T:
        BN: tl.constexpr = w.shape[0]
        NGH: tl.constexpr = s.shape[1]
        if NGH == 1:
            v = v * s
        else:
            v = tl.reshape(tl.reshape(v, (BN, NGH, G)) * s[:, :, None], w.shape)
    else:
        NGH2: tl.constexpr = s.shape[0]
        BN2: tl.constexpr = w.shape[1]
        if NGH2 == 1:
            v = v * s
        else:
            v = tl.reshape(tl.reshape(v, (NGH2, G, BN2)) * s[:, None, :], w.shape)
    return v


@triton.jit
def _fp4_decode(w, sc_lo, sc_hi, G: tl.constexpr, SKIND: tl.constexpr, T: tl.constexpr, like):
    """The portable e2m1 decode of both nibbles: value * scale in fp32 (exact), cast to like's
    dtype; sc_lo/sc_hi hold each half tile's stored scale codes. Returns (low, high)."""
    lo = _fp4_half(w, _fp4_scale(sc_lo, SKIND), False, G, SKIND, T).to(like.dtype)
    hi = _fp4_half(w, _fp4_scale(sc_hi, SKIND), True, G, SKIND, T).to(like.dtype)
    return lo, hi


@triton.jit
def _fp4_scale(c, SKIND: tl.constexpr):
    """Stored fp4 scale codes -> fp32, exact (e4m3 times e2m1's 2^14, as :func:`.lut4._scale`)."""
    if SKIND == 3:  # bf16_byte: the bf16 of bits c << 4 (as fp32: the same bits << 16), times 2^117
        s = (c.to(tl.int32) << 20).to(tl.float32, bitcast=True) * (2.0**117)
    elif SKIND == 4:  # e5m3: the same bf16 times 2^112, and the products' 2^-14 (E5M3_LIFT)
        s = (c.to(tl.int32) << 20).to(tl.float32, bitcast=True) * (2.0**98)
    else:
        s = _scale(c, SKIND, True)
    return s


@triton.jit
def _fp4_step(
    acc, x_rows, w_cols, s_cols, t, K, KW, stride_xk, stride_sk,
    G: tl.constexpr, P: tl.constexpr, BK: tl.constexpr, SKIND: tl.constexpr, T: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, DECF: tl.constexpr, LANE: tl.constexpr,
):  # fmt: skip
    """K tile ``t`` of e2m1 codes (paired layout, or LANE: one lane chunk over x in lane order) with
    their group scales: value * scale in fp32 (exact), cast to x's dtype, one dot per nibble over
    contiguous runs of x."""
    k_lo = _paired_k(t, BK, P)
    x_lo = _xt(x_rows, k_lo, K, stride_xk, T, not EVEN_K)
    x_hi = _xt(x_rows, k_lo + P, K, stride_xk, T, not EVEN_K)
    if LANE:  # both nibbles of position j lie in group j // (G / 2) of the chunk (lane_positions)
        w = _load_codes(w_cols, t, KW, BK // 2, T, True, LANE_CHUNK_STRIDE)
        g_l = (t * (BK // G) + tl.arange(0, BK // G)) * stride_sk
        if T:
            s_l = tl.load(s_cols + g_l[None, :])
        else:
            s_l = tl.load(s_cols + g_l[:, None])
        w_lo, w_hi = DECF(w, s_l, s_l, G // 2, SKIND, T, x_lo)
    else:
        w = _load_codes(w_cols, t, KW, BK // 2, T, EVEN_K)
        s_lo, s_hi = _paired_scales(s_cols, t, K, G, P, BK, T, EVEN_K)
        w_lo, w_hi = DECF(w, s_lo, s_hi, G, SKIND, T, x_lo)
    acc = _mma(x_lo, w_lo, acc, T, IEEE)
    acc = _mma(x_hi, w_hi, acc, T, IEEE)
    return acc


@triton.jit
def _paired_scales(
    s_cols, t, K, G: tl.constexpr, P: tl.constexpr, BK: tl.constexpr, T: tl.constexpr, EVEN_K: tl.constexpr
):  # fmt: skip
    """The stored scales of K tile ``t``'s low and high nibble halves (paired layout: G divides P)."""
    NGH: tl.constexpr = BK // 2 // G  # scale groups per nibble half of the tile
    PG: tl.constexpr = P // G
    gg = tl.arange(0, NGH)
    g_lo = t * (BK // G) + (gg // PG) * (2 * PG) + gg % PG
    g_hi = g_lo + PG
    if T:
        g_lo2, g_hi2 = g_lo[None, :], g_hi[None, :]
    else:
        g_lo2, g_hi2 = g_lo[:, None], g_hi[:, None]
    if EVEN_K:
        s_lo = tl.load(s_cols + g_lo2)
        s_hi = tl.load(s_cols + g_hi2)
    else:
        s_lo = tl.load(s_cols + g_lo2, mask=g_lo2 < K // G, other=0)
        s_hi = tl.load(s_cols + g_hi2, mask=g_hi2 < K // G, other=0)
    return s_lo, s_hi


@triton.jit
def _codes_step(x_rows, w_cols, t, K, stride_xk, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """K tile ``t`` of 8-bit codes: x [BM, BK] and W read transposed as [BK, BN]."""
    kk = t * BK + tl.arange(0, BK)
    if EVEN_K:
        a = tl.load(x_rows + kk[None, :] * stride_xk)
        b = tl.load(w_cols + kk[:, None])
    else:
        a = tl.load(x_rows + kk[None, :] * stride_xk, mask=(kk < K)[None, :], other=0.0)
        b = tl.load(w_cols + kk[:, None], mask=(kk < K)[:, None], other=0.0)
    return a, b


@triton.jit
def _moe_kernel(
    X, XS, W, S, Z, R, B, TW, SID, BEXP, NPAD, ORDER, OFFS, Y,
    A, N, K, KW, E, num_m, row_div,
    stride_xm, stride_xk, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    stride_ze, stride_zn, stride_re, stride_be, stride_ym, stride_ys,
    KIND: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr, P: tl.constexpr, QN: tl.constexpr,
    QK: tl.constexpr, SKIND: tl.constexpr, GROUPED: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr,
    INT_DOT: tl.constexpr, HAS_R: tl.constexpr, HAS_B: tl.constexpr, WEIGHTED: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr, SPLIT_K: tl.constexpr,
    SWAP: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
    DEC4: tl.constexpr, DECF: tl.constexpr, LANE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    Y += pid_k.to(tl.int64) * stride_ys  # split K: each split's own fp32 plane of partial sums
    num_n = tl.cdiv(N, BN)
    n_gemm = num_m * num_n
    if pid >= n_gemm:
        # zero the rows of assignments to experts held elsewhere: order[offsets[E]:A]
        offs_n = (pid - n_gemm) * BN + tl.arange(0, BN)
        held = tl.load(OFFS + E).to(tl.int32)
        for r0 in range(held, A, BM):
            idx = r0 + tl.arange(0, BM)
            a_z = tl.load(ORDER + idx, mask=idx < A, other=0).to(tl.int64)
            ptrs = Y + a_z[:, None] * stride_ym + offs_n[None, :]
            zero = tl.zeros((BM, BN), dtype=Y.dtype.element_ty)
            tl.store(ptrs, zero, mask=(idx < A)[:, None] & (offs_n < N)[None, :])
        return
    pid_m, pid_n = _swizzle(pid, num_m, num_n, GM)
    if pid_m * BM >= tl.load(NPAD):
        return
    a = tl.load(SID + pid_m * BM + tl.arange(0, BM))
    mask_m = a < A
    a = tl.where(mask_m, a, 0).to(tl.int64)
    rows = a // row_div  # sentinel rows read row 0 and are never stored
    e = tl.load(BEXP + pid_m).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    rn = tl.minimum(offs_n, N - 1)  # clamped: unmasked loads, masked stores
    x_rows = X + rows[:, None] * stride_xm
    w_cols = W + e * stride_we + rn[None, :] * stride_wn
    n_k = tl.cdiv(K, BK)
    if KIND <= 1:  # weight-only: int or fp4 codes dequantized in the K loop
        if SWAP:  # the transposed tile acc [BN, BM] (see _mma), transposed back after the loop
            xt_rows = X + rows[None, :] * stride_xm
            cols = rn[:, None]
            acc = tl.zeros((BN, BM), dtype=tl.float32)
        else:
            xt_rows = x_rows
            cols = rn[None, :]
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        if LANE:
            wt_cols = W + e * stride_we + _lane_cols(cols, KW)
        else:
            wt_cols = W + e * stride_we + cols * stride_wn
        s_cols = S + e * stride_se + cols * stride_sn
        # tl.range's num_stages pipelines the code loads (cp.async): the launch option alone does that
        # only for loads that feed a dot directly, and these are decoded first
        if KIND == 0:
            z_cols = Z + e * stride_ze + cols * stride_zn
            for t in tl.range(pid_k, n_k, SPLIT_K, num_stages=STAGES):
                acc = _int_step(acc, xt_rows, wt_cols, s_cols, z_cols, t, K, KW, stride_xk, G, BITS, P, BK,
                                GROUPED, HAS_Z, SWAP, EVEN_K, IEEE, DEC4)  # fmt: skip
        else:
            for t in tl.range(pid_k, n_k, SPLIT_K, num_stages=STAGES):
                acc = _fp4_step(acc, xt_rows, wt_cols, s_cols, t, K, KW, stride_xk, stride_sk, G, P, BK, SKIND, SWAP,
                                EVEN_K, IEEE, DECF, LANE)  # fmt: skip
        if SWAP:
            acc = tl.trans(acc)
        if KIND == 0 and not GROUPED:
            acc = acc * tl.load(S + e * stride_se + rn * stride_sn).to(tl.float32)[None, :]
    elif KIND == 2:  # rowwise W8A8: both scales in the epilogue
        if INT_DOT:
            acc_i = tl.zeros((BM, BN), dtype=tl.int32)
            for t in range(pid_k, n_k, SPLIT_K):
                xa, wb = _codes_step(x_rows, w_cols, t, K, stride_xk, BK, EVEN_K)
                acc_i = tl.dot(xa, wb, acc_i, out_dtype=tl.int32)
            acc = acc_i.to(tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for t in range(pid_k, n_k, SPLIT_K):
                xa, wb = _codes_step(x_rows, w_cols, t, K, stride_xk, BK, EVEN_K)
                # promote the tensor cores' reduced-precision fp8 sums into fp32 every K tile
                acc = tl.dot(xa, wb, acc, max_num_imprecise_acc=BK)
        w_s = tl.load(S + e * stride_se + rn * stride_sn)
        if ACT == 1:
            x_s = tl.load(XS + rows * stride_xsm)
        else:
            x_s = tl.full((BM,), 1.0, tl.float32) * tl.load(XS + e)
        acc = acc * x_s[:, None] * w_s[None, :]
    else:  # block fp8: every K tile's dot scaled by its activation-group and weight-block scales
        nb = (pid_n * BN) // QN  # BN divides QN: the n-tile lies in one weight-scale row
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for t in range(pid_k, n_k, SPLIT_K):
            xa, wb = _codes_step(x_rows, w_cols, t, K, stride_xk, BK, EVEN_K)
            kb = (t * BK) // QK  # BK divides QK: the k-tile lies in one scale column
            x_s = tl.load(XS + rows * stride_xsm + kb * stride_xsk)
            w_s = tl.load(S + e * stride_se + nb * stride_sn + kb * stride_sk)
            acc += tl.dot(xa, wb) * (x_s * w_s)[:, None]
    if HAS_R:
        acc = acc * tl.load(R + e * stride_re + rn)[None, :]
    if HAS_B:
        if pid_k == 0:
            acc += tl.load(B + e * stride_be + rn).to(tl.float32)[None, :]
    if WEIGHTED:
        acc = acc * tl.load(TW + a, mask=mask_m, other=0.0)[:, None]
    y_ptrs = Y + a[:, None] * stride_ym + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)


_moe_launch = Launcher(_moe_kernel)


@triton.jit
def _split_sum_kernel(PART, OUT, N, plane, stride_om, S: tl.constexpr, R: tl.constexpr, BN: tl.constexpr):
    """Output row ``m``'s block of columns: the S split planes of its R assignment rows (a token's
    top_k, or 1) summed in a fixed order, rounded once."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = offs < N
    acc = tl.zeros((BN,), tl.float32)
    for s in tl.static_range(S):
        for j in tl.static_range(R):
            acc += tl.load(PART + s * plane + (row * R + j) * N + offs, mask=mask, other=0.0)
    tl.store(OUT + row * stride_om + offs, acc.to(OUT.dtype.element_ty), mask=mask)


_split_sum_launch = Launcher(_split_sum_kernel)


def sum_rows(y: torch.Tensor, R: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Each run of ``R`` rows of ``y`` [A, N] (a token's top_k assignment rows) summed in fp32 and
    rounded once: [A / R, N] in ``out_dtype`` (y's by default). One launch where torch's strided
    reduction over the middle dim of [A / R, R, N] reads y at a fraction of the memory's rate."""
    A, N = y.shape
    if R < 1 or A % R:
        raise ValueError(f"sum_rows: R={R} must divide the {A} rows")
    out = torch.empty(A // R, N, dtype=out_dtype or y.dtype, device=y.device)
    if A == 0 or N == 0:
        return out
    if y.stride(1) != 1 or y.stride(0) != N:
        y = y.contiguous()
    BN = min(next_power_of_2(N), 1024)
    _split_sum_launch((A // R, cdiv(N, BN)), y, out, N, A * N, out.stride(0), S=1, R=R, BN=BN)
    return out


def grid_tiles(A: int, E: int, block_m: int) -> int:
    """M-tiles the grid holds: a bound on the tiles ``aligned(block_m)`` can use, from A and E alone."""
    return cdiv(A + min(E, A) * (block_m - 1), block_m)


def moe_matmul(
    x: torch.Tensor,
    weights: MoeWeights,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    order: torch.Tensor,
    offsets: torch.Tensor,
    A: int,
    row_div: int,
    tile: MoeTile,
    out_dtype: torch.dtype,
    *,
    x_scale: torch.Tensor | None = None,
    act_scale_mode: str = "none",
    topk_weights: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    decoders: tuple[Any, Any] | None = None,
    reduce_rows: int = 1,
) -> torch.Tensor:
    """``y`` [A, N] in ``out_dtype`` (written into ``out`` when given: [A, N], unit column stride);
    with ``reduce_rows`` R > 1, [A / R, N]: each run of R assignment rows (a token's top_k) summed
    in fp32 and rounded once, by the launch that sums the K splits (fp32 planes even unsplit).

    x: [rows, K] (fp16/bf16/fp32 for the weight-only kinds, fp8/int8 codes for rowwise and block),
    any strides; ``row(a) = a // row_div``. ``sorted_ids``/``block_expert``/``num_padded``: the
    routing aligned to ``tile.block_m``; ``order``/``offsets``: the expert-sorted order and int64
    [E + 2] offsets (unheld assignments from ``offsets[E]``). ``x_scale``: rowwise "row" fp32 [rows]
    or [rows, 1], rowwise "expert" fp32 [>= E], block [rows, ceil(K/bk)]. ``topk_weights``: fp32 [A]
    contiguous (the routing weight multiplies each row). ``bias``: [E, N]. ``decoders``: the
    (int4, e2m1) decode functions of the K loop, exact ones a backend makes faster for its GPU
    (``backends/cuda/triton_decode.py``); None: the portable :func:`_nibble_minus`, :func:`_fp4_decode`.
    No host synchronisation.
    """
    E, N, K = weights.E, weights.N, weights.K
    dec4, decf = decoders or (_nibble_minus, _fp4_decode)
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"moe_matmul: x must be [rows, {K}], found {list(x.shape)}")
    if block_expert.shape[0] * tile.block_m != sorted_ids.shape[0]:
        raise ValueError(
            f"moe_matmul: routing aligned to {sorted_ids.shape[0] // max(1, block_expert.shape[0])}-row "
            f"tiles, the tile has block_m={tile.block_m}"
        )
    kind = KINDS[weights.kind]
    lane = weights.layout == "lane"
    if lane and tile.block_k != LANE_CHUNK:
        raise ValueError(f"moe_matmul: the lane layout takes block_k={LANE_CHUNK}, found {tile.block_k}")
    if weights.pair and tile.block_k % (2 * weights.pair):
        raise ValueError(
            f"moe_matmul: block_k={tile.block_k} must hold whole pairing blocks of 2 * {weights.pair} k"
        )
    if weights.kind == "int" and weights.group and weights.group % tile.block_k:
        raise ValueError(f"moe_matmul: block_k={tile.block_k} must divide the group size {weights.group}")
    if weights.kind == "block" and (weights.block[0] % tile.block_n or weights.block[1] % tile.block_k):
        raise ValueError(
            f"moe_matmul: block_n={tile.block_n} and block_k={tile.block_k} must divide the scale block "
            f"{weights.block}"
        )
    R = int(reduce_rows)
    if R < 1 or A % R:
        raise ValueError(f"moe_matmul: reduce_rows={reduce_rows} must divide the {A} assignments")
    split = tile.split_k > 1 or R > 1
    result = out if out is not None else torch.empty(A // R, N, dtype=out_dtype, device=x.device)
    if A == 0 or N == 0:
        return result
    y = torch.empty(tile.split_k, A, N, dtype=torch.float32, device=x.device) if split else result
    num_m = min(grid_tiles(A, E, tile.block_m), block_expert.shape[0])
    num_n = cdiv(N, tile.block_n)
    s = weights.scales
    z = weights.zeros
    r = weights.row_scale
    BK = tile.block_k
    grouped = weights.kind == "int" and weights.group > 0
    if weights.kind == "block":
        sn, sk = s.stride(1), s.stride(2)
    elif weights.kind in ("int", "fp4") and s.dim() == 3:
        sn, sk = s.stride(1), s.stride(2)
    else:
        sn, sk = s.stride(1), 0
    xs = x_scale if x_scale is not None else s
    if weights.kind == "block":
        xsm, xsk = xs.stride(0), xs.stride(1)
    else:
        xsm, xsk = xs.stride(0), 0
    if lane:  # x's inputs in the layout's order, K padded to whole chunks (lane_order)
        x = lane_order(x)
        K = x.shape[1]
    even_k = K % BK == 0
    G = weights.group if weights.kind in ("int", "fp4") else 0
    grid = (num_m * num_n + num_n, tile.split_k)
    _moe_launch(grid,
        x, xs, weights.w, s, z if z is not None else s, r if r is not None else s,
        bias if bias is not None else s, topk_weights if topk_weights is not None else s,
        sorted_ids, block_expert, num_padded, order, offsets, y,
        A, N, K, weights.w.shape[2], E, num_m, row_div,
        x.stride(0), x.stride(1), xsm, xsk, weights.w.stride(0), weights.w.stride(1), s.stride(0), sn, sk,
        z.stride(0) if z is not None else 0, z.stride(1) if z is not None else 0,
        r.stride(0) if r is not None else 0, bias.stride(0) if bias is not None else 0, y.stride(-2),
        A * N if split else 0,
        KIND=kind, BITS=weights.bits, G=max(G, 1), P=weights.pair or 1,
        QN=weights.block[0] or 1, QK=weights.block[1] or 1, SKIND=FP4_SCALE_KINDS[weights.scale_kind],
        GROUPED=grouped, HAS_Z=z is not None, ACT=ACT_SCALE_MODES[act_scale_mode],
        INT_DOT=weights.w.dtype == torch.int8, HAS_R=r is not None, HAS_B=bias is not None,
        WEIGHTED=topk_weights is not None,
        BM=tile.block_m, BN=tile.block_n, BK=BK, GM=tile.group_m, SPLIT_K=tile.split_k,
        SWAP=tile.swap and weights.kind in ("int", "fp4"), STAGES=tile.num_stages, EVEN_K=even_k,
        IEEE=x.dtype == torch.float32, DEC4=dec4, DECF=decf, LANE=lane,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
    if split:
        BN = min(next_power_of_2(N), 1024)
        _split_sum_launch(
            (A // R, cdiv(N, BN)), y, result, N, A * N, result.stride(0), S=tile.split_k, R=R, BN=BN
        )
    return result


# -- activations quantized per expert (per-tensor scales: static, or dynamic over the expert's rows) -


@triton.jit
def _expert_amax_kernel(
    X, IDS, AMAX, A, K, E, row_div, stride_xm, stride_xk,
    BA: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """BA assignments per program: max |x[row(a)]| over K, atomically maxed into AMAX[e(a)]."""
    offs_a = tl.program_id(0) * BA + tl.arange(0, BA)
    mask_a = offs_a < A
    e = tl.load(IDS + offs_a, mask=mask_a, other=E)
    rows = (tl.where(mask_a, offs_a, 0) // row_div).to(tl.int64)
    acc = tl.zeros((BA, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        m = mask_a[:, None] & (kk < K)[None, :]
        v = tl.load(X + rows[:, None] * stride_xm + kk[None, :] * stride_xk, mask=m, other=0.0)
        acc = tl.maximum(acc, tl.abs(v.to(tl.float32)))
    tl.atomic_max(AMAX + e, tl.max(acc, axis=1), mask=mask_a & (e < E))


_expert_amax_launch = Launcher(_expert_amax_kernel)


@triton.jit
def _expert_quant_kernel(
    X, IDS, SC, SO, Q, A, K, E, row_div, stride_xm, stride_xk, qmax,
    DYNAMIC: tl.constexpr, BA: tl.constexpr, BK: tl.constexpr,
    INT8: tl.constexpr, HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """Program (BA assignments, K block): codes of x[row(a)] with expert e(a)'s scale, into row a of Q.
    DYNAMIC: SC holds each expert's amax, the scale is made here as act_quant does and written to
    SO[e] by the K block 0 programs (every writer stores the same value); else SC holds the static
    scales. Unheld assignments are skipped (their rows are never read)."""
    offs_a = tl.program_id(0) * BA + tl.arange(0, BA)
    e = tl.load(IDS + offs_a, mask=offs_a < A, other=E)
    held = e < E
    ec = tl.where(held, e, 0)
    if DYNAMIC:
        s = _dynamic_scale(tl.load(SC + ec, mask=held, other=0.0), qmax, 1.0)
        if tl.program_id(1) == 0:
            tl.store(SO + ec, s, mask=held)
    else:
        s = tl.load(SC + ec, mask=held, other=1.0).to(tl.float32)
    kk = tl.program_id(1) * BK + tl.arange(0, BK)
    rows = (tl.where(held, offs_a, 0) // row_div).to(tl.int64)
    mask = held[:, None] & (kk < K)[None, :]
    x = tl.load(X + rows[:, None] * stride_xm + kk[None, :] * stride_xk, mask=mask, other=0.0)
    q = _encode(x.to(tl.float32), s[:, None], INT8, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
    tl.store(Q + offs_a.to(tl.int64)[:, None] * K + kk[None, :], q, mask=mask)


_expert_quant_launch = Launcher(_expert_quant_kernel)


def quantize_per_expert(
    x: torch.Tensor,
    ids: torch.Tensor,
    E: int,
    row_div: int,
    kind: str,
    static_scale: torch.Tensor | None = None,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations with one scale per expert, one row per assignment: ``(codes [A, K], scales)``.

    Row ``a`` holds ``x[a // row_div]`` quantized with expert ``ids[a]``'s scale: ``static_scale``
    fp32 [E] (calibrated), or, when None, the dynamic per-tensor scale of the rows routed to that
    expert (``amax / qmax``, 1 for an all-zero expert, as a linear layer fed only those rows would
    find it). ``ids``: int64 [A], ``E`` for assignments this rank does not hold (rows left unwritten).
    ``scales``: fp32 [E + 1] (dynamic; the last slot unused) or ``static_scale``. ``kind``: "fp8" or "int8". The codes
    are exactly act_quant's (and the reference's). No host synchronisation.
    """
    A = ids.shape[0]
    K = x.shape[1]
    if kind == "int8":
        q = torch.empty(A, K, dtype=torch.int8, device=x.device)
        meta = dict(INT8=True, HW_FP8=False, FMAX=127.0, MANT=0, EMIN=0, NAN=0, NEG_ZERO=False, QTY=tl.int8)
        qmax, out = act_quant.INT8_QMAX, q
    else:
        fmt = act_quant.FP8_FORMATS[fp8_dtype]
        q = torch.empty(A, K, dtype=fp8_dtype, device=x.device)
        hw = act_quant._use_hw_fp8_cast(x, fp8_dtype)
        meta = dict(
            INT8=False, HW_FP8=hw, FMAX=fmt.fmax, MANT=fmt.mant, EMIN=fmt.emin, NAN=fmt.nan,
            NEG_ZERO=fmt.neg_zero, QTY=fmt.tl_dtype,
        )  # fmt: skip
        qmax, out = act_quant.SCHEME_FP8_MAX, (q if hw else q.view(torch.uint8))
    if static_scale is None:  # [amax, scale] per expert (and one slot for unheld assignments)
        buf = torch.zeros(2, E + 1, dtype=torch.float32, device=x.device)
        sc, so = buf[0], buf[1]
    else:
        sc = so = static_scale
    if A == 0 or K == 0:
        return q, so
    BK = min(next_power_of_2(K), 1024)
    BA = max(1, 4096 // BK)  # from K only: one compile per K
    if static_scale is None:
        _expert_amax_launch(
            (cdiv(A, BA),), x, ids, sc, A, K, E, row_div, x.stride(0), x.stride(1), BA=BA, BK=BK, num_warps=4
        )
    _expert_quant_launch((cdiv(A, BA), cdiv(K, BK)),
        x, ids, sc, so, out, A, K, E, row_div, x.stride(0), x.stride(1), float(qmax),
        DYNAMIC=static_scale is None, BA=BA, BK=BK, num_warps=4, **meta,
    )  # fmt: skip
    return q, so
