"""4-bit weight decodes for NVIDIA GPUs as inline PTX, for the portable Triton kernels' K loops
(``backends/triton/moe.py`` takes them in place of its portable decodes).

Each asm block takes four code bytes in one 32-bit register and yields their 16-bit values packed
two to a register (int4: one nibble per byte, e2m1: both), with packed (x2) arithmetic, where the portable decodes spend integer ops, conversions and fp32
multiplies on every element: the K loop of a small batch is bound by these instructions, not by
memory. Both are exact:

- :func:`int4_minus`: ``q - z`` of one nibble per byte in bf16/fp16. ``prmt`` spreads two bytes
  into the halves of a register, ``lop3`` keeps the nibble and ORs in the mantissa of 128 (bf16) or
  1024 (fp16), one packed ``fma`` subtracts ``magic + z`` (an integer: exact).
- :func:`e2m1_scaled`: e2m1 value times its group scale, in bf16, both nibbles of four code bytes
  in one block. The masked magnitude bits are ``prmt`` selectors as they lie, into two 8-entry byte
  tables (the bf16 high and low bytes of 0, 0.5, 1, 1.5, 2, 3, 4, 6); ``prmt``'s sign-replicate mode
  makes the sign bits byte masks ORed into the high bytes; one packed ``fma`` per two values
  multiplies by the scale: value (2 significant bits) times an e4m3 or e8m0 scale (at most 4) is
  exact in bf16, as the fp32 product the portable path rounds. NVFP4's scales arrive re-encoded
  at load (``bf16_byte_scales``: one shift makes a scale's bf16, times 2^-117, always normal) and
  take tables of the values times 2^117, where an e4m3 byte would cost a conversion through fp16
  and fp32 per scale.

fp32 activations (and fp16 ones for e2m1, whose scales may leave fp16's range) take the portable
decode; the Triton interpreter cannot run PTX, so the CPU tests run the portable decodes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantrt.backends.triton.lut4 import _scale
from quantrt.backends.triton.moe import BF16_BYTE_LIFT, E5M3_LIFT, _fp4_decode, _nibble_minus


def _int4_asm(high: bool, magic: int, one: int, fma: str) -> tl.constexpr:
    """The int4 block: two bytes spread into a register's halves (``prmt``), the nibble kept and the
    16-bit float ``magic`` ORed in (``lop3``: (a & b) | c), then ``fma(v, one, -(magic + z))``."""
    return tl.constexpr(f"""{{
.reg .b32 r, t0, t1, m, g, one;
mov.b32 m, 0x000F000F; mov.b32 g, {magic:#010x}; mov.b32 one, {one:#010x};
{"shr.b32 r, $2, 4;" if high else "mov.b32 r, $2;"}
prmt.b32 t0, r, r, 0x1100; prmt.b32 t1, r, r, 0x3322;
lop3.b32 t0, t0, m, g, 0xEA; lop3.b32 t1, t1, m, g, 0xEA;
{fma} $0, t0, one, $3; {fma} $1, t1, one, $4;
}}""")


# bf16: 128 + q and 1.0; fp16: 1024 + q and 1.0 (both halves of a register)
_INT4_BF16_LO = _int4_asm(False, 0x43004300, 0x3F803F80, "fma.rn.bf16x2")
_INT4_BF16_HI = _int4_asm(True, 0x43004300, 0x3F803F80, "fma.rn.bf16x2")
_INT4_F16_LO = _int4_asm(False, 0x64006400, 0x3C003C00, "fma.rn.f16x2")
_INT4_F16_HI = _int4_asm(True, 0x64006400, 0x3C003C00, "fma.rn.f16x2")


def _e2m1_tables(lift: int) -> tuple[int, int, int, int]:
    """The bf16 high and low bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2^lift,
    as two 4-byte ``prmt`` tables each: (high 0..3, high 4..7, low 0..3, low 4..7)."""
    bits = [
        int(torch.tensor(m * 2.0**lift).to(torch.bfloat16).view(torch.int16)) & 0xFFFF for m in E2M1_VALUES
    ]
    hi = [b >> 8 for b in bits]
    lo = [b & 0xFF for b in bits]

    def word(b: list[int]) -> int:
        return b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24

    return word(hi[:4]), word(hi[4:]), word(lo[:4]), word(lo[4:])


def _e2m1_asm(lift: int) -> tl.constexpr:
    """Both nibbles of four code bytes b0..b3 in one block ($4): the magnitudes masked in place are
    prmt selectors as they lie (nibbles L0 H0 L1 H1 | L2 H2 L3 H3), four table lookups give the high
    and low bytes of all eight values (times 2^lift), the signs become byte masks by prmt's
    sign-replicate mode (the low nibbles' sign bits shifted to their byte's top first) and are ORed
    into the high bytes, four prmt pair the bytes into bf16x2 (L0 L1, L2 L3, H0 H1, H2 H3) and four
    packed fma apply the scales ($5 $6: the low nibbles', $7 $8: the high ones'; the -0 addend keeps
    -0's sign)."""
    h0, h1, l0, l1 = _e2m1_tables(lift)
    return tl.constexpr(f"""{{
.reg .b32 m, sb, rl, h0, h1, l0, l1, hb0, hb1, lb0, lb1, sg0, sg1, t, mk, sm, nz;
mov.b32 h0, {h0:#010x}; mov.b32 h1, {h1:#010x}; mov.b32 l0, {l0:#010x}; mov.b32 l1, {l1:#010x};
mov.b32 mk, 0x77777777; mov.b32 sm, 0x80808080; mov.b32 nz, 0x80008000;
and.b32 m, $4, mk;
shr.b32 sb, m, 16;
prmt.b32 hb0, h0, h1, m;
prmt.b32 lb0, l0, l1, m;
prmt.b32 hb1, h0, h1, sb;
prmt.b32 lb1, l0, l1, sb;
shl.b32 rl, $4, 4;
prmt.b32 sg0, rl, $4, 0xD9C8;
prmt.b32 sg1, rl, $4, 0xFBEA;
lop3.b32 hb0, sg0, sm, hb0, 0xEA;
lop3.b32 hb1, sg1, sm, hb1, 0xEA;
prmt.b32 t, lb0, hb0, 0x6240;
fma.rn.bf16x2 $0, t, $5, nz;
prmt.b32 t, lb1, hb1, 0x6240;
fma.rn.bf16x2 $1, t, $6, nz;
prmt.b32 t, lb0, hb0, 0x7351;
fma.rn.bf16x2 $2, t, $7, nz;
prmt.b32 t, lb1, hb1, 0x7351;
fma.rn.bf16x2 $3, t, $8, nz;
}}""")


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: e2m1 values times their e4m3/e8m0 scales decoded to bf16
_E2M1_PAIR_BF16 = _e2m1_asm(0)
#: the values times 2^117 against "bf16_byte" scales (backends/triton/moe.py bf16_byte_scales)
_E2M1_PAIR_BF16_LIFTED = _e2m1_asm(BF16_BYTE_LIFT)
#: and times 2^98 against the lane layout's e5m3 bytes (the same bf16 widening; moe.py E5M3_LIFT)
_E2M1_PAIR_BF16_E5M3 = _e2m1_asm(E5M3_LIFT)


@triton.jit
def int4_minus(w, z, HIGH: tl.constexpr, like):
    """``q - z`` for one nibble of each code byte (z: fp32 integers, broadcast), in like's dtype."""
    if like.dtype == tl.bfloat16:
        nz = (-(z + 128.0)).to(tl.bfloat16)
        if HIGH:
            v = tl.inline_asm_elementwise(_INT4_BF16_HI, "=r,=r,r,r,r", [w, nz], tl.bfloat16, True, 4)
        else:
            v = tl.inline_asm_elementwise(_INT4_BF16_LO, "=r,=r,r,r,r", [w, nz], tl.bfloat16, True, 4)
    elif like.dtype == tl.float16:
        nz = (-(z + 1024.0)).to(tl.float16)
        if HIGH:
            v = tl.inline_asm_elementwise(_INT4_F16_HI, "=r,=r,r,r,r", [w, nz], tl.float16, True, 4)
        else:
            v = tl.inline_asm_elementwise(_INT4_F16_LO, "=r,=r,r,r,r", [w, nz], tl.float16, True, 4)
    else:
        v = _nibble_minus(w, z, HIGH, like)
    return v


@triton.jit
def _broadcast_scales(sc, SKIND: tl.constexpr, G: tl.constexpr, T: tl.constexpr, shape: tl.constexpr):
    """A half tile's stored scale codes ([BN, BK/2/G] when T else [BK/2/G, BN]) as bf16 values,
    one per code (exact: 4 significant bits, in bf16's range). "bf16_byte" codes (SKIND 3) and the lane
    layout's e5m3 bytes (SKIND 4) widen by one shift into the bf16 of the scale times 2^-117 (2^-112); e8m0 exponents are placed as bf16 bits (2^-127
    as the subnormal it is); e4m3 goes through fp32 (:func:`.lut4._scale`)."""
    if SKIND == 3 or SKIND == 4:
        s = (sc.to(tl.int16) << 4).to(tl.bfloat16, bitcast=True)
    elif SKIND == 1:
        sub = tl.full(sc.shape, 0x40, tl.int16)  # e = 0: 2^-127, bf16's 0x0040; others are larger
        s = tl.maximum(sc.to(tl.int16) << 7, sub).to(tl.bfloat16, bitcast=True)
    else:
        s = _scale(sc, SKIND, False).to(tl.bfloat16)
    if T:
        s = tl.reshape(tl.broadcast_to(s[:, :, None], (shape[0], s.shape[1], G)), shape)
    else:
        s = tl.reshape(tl.broadcast_to(s[:, None, :], (s.shape[0], G, shape[1])), shape)
    return s


@triton.jit
def e2m1_scaled(w, sc_lo, sc_hi, G: tl.constexpr, SKIND: tl.constexpr, T: tl.constexpr, like):
    """Both nibbles of the e2m1 codes times their group scales, in like's dtype: (low, high).
    sc_lo/sc_hi: each half tile's stored e4m3/bf16_byte/e8m0/e5m3 scale codes."""
    if like.dtype == tl.bfloat16:
        s_lo = _broadcast_scales(sc_lo, SKIND, G, T, w.shape)
        s_hi = _broadcast_scales(sc_hi, SKIND, G, T, w.shape)
        if SKIND == 3:
            lo, hi = tl.inline_asm_elementwise(
                _E2M1_PAIR_BF16_LIFTED, "=r,=r,=r,=r,r,r,r,r,r", [w, s_lo, s_hi], (tl.bfloat16, tl.bfloat16),
                True, 4,
            )  # fmt: skip
        elif SKIND == 4:
            lo, hi = tl.inline_asm_elementwise(
                _E2M1_PAIR_BF16_E5M3, "=r,=r,=r,=r,r,r,r,r,r", [w, s_lo, s_hi], (tl.bfloat16, tl.bfloat16),
                True, 4,
            )  # fmt: skip
        else:
            lo, hi = tl.inline_asm_elementwise(
                _E2M1_PAIR_BF16, "=r,=r,=r,=r,r,r,r,r,r", [w, s_lo, s_hi], (tl.bfloat16, tl.bfloat16), True, 4
            )
    else:
        lo, hi = _fp4_decode(w, sc_lo, sc_hi, G, SKIND, T, like)
    return lo, hi
