"""4-bit weight decodes for NVIDIA GPUs as inline PTX, for the portable Triton kernels' K loops
(``backends/triton/moe.py`` takes them in place of its portable decodes).

Each asm block takes four code bytes in one 32-bit register and yields four 16-bit values in two,
with packed (x2) arithmetic, where the portable decodes spend integer ops, conversions and fp32
multiplies on every element: the K loop of a small batch is bound by these instructions, not by
memory. Both are exact:

- :func:`int4_minus`: ``q - z`` of one nibble per byte in bf16/fp16. ``prmt`` spreads two bytes
  into the halves of a register, ``lop3`` keeps the nibble and ORs in the mantissa of 128 (bf16) or
  1024 (fp16), one packed ``fma`` subtracts ``magic + z`` (an integer: exact).
- :func:`e2m1_scaled`: e2m1 value times its group scale, in bf16. The three magnitude bits of four
  codes become one ``prmt`` selector into two 8-entry byte tables (the bf16 high and low bytes of
  0, 0.5, 1, 1.5, 2, 3, 4, 6), the sign bits are ORed into the high bytes, and one packed ``fma``
  multiplies by the scale: value (2 significant bits) times an e4m3 or e8m0 scale (at most 4) is
  exact in bf16, as the fp32 product the portable path rounds.

fp32 activations (and fp16 ones for e2m1, whose scales may leave fp16's range) take the portable
decode; the Triton interpreter cannot run PTX, so the CPU tests run the portable decodes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantrt.backends.triton.lut4 import _scale
from quantrt.backends.triton.moe import _fp4_decode, _nibble_minus


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

# e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bf16 0x0000 0x3F00 0x3F80 0x3FC0 0x4000 0x4040
# 0x4080 0x40C0: high bytes {0x3F3F3F00, 0x40404040}, low bytes {0xC0800000, 0xC0804000}
_E2M1_BF16 = """{
.reg .b32 r, x, y, sel, hi, lo, sg, t, ha, hb, la, lb, mk, sm, nz;
mov.b32 ha, 0x3F3F3F00; mov.b32 hb, 0x40404040; mov.b32 la, 0xC0800000; mov.b32 lb, 0xC0804000;
mov.b32 mk, 0x07070707; mov.b32 sm, 0x80808080; mov.b32 nz, 0x80008000;
SHIFT
and.b32 x, r, mk;
shr.b32 y, x, 4;
or.b32 y, x, y;
prmt.b32 sel, y, y, 0x0020;
prmt.b32 hi, ha, hb, sel;
prmt.b32 lo, la, lb, sel;
shl.b32 t, r, 4;
lop3.b32 hi, t, sm, hi, 0xEA;
prmt.b32 t, lo, hi, 0x5140;
fma.rn.bf16x2 $0, t, $3, nz;
prmt.b32 t, lo, hi, 0x7362;
fma.rn.bf16x2 $1, t, $4, nz;
}"""
_E2M1_BF16_LO = tl.constexpr(_E2M1_BF16.replace("SHIFT", "mov.b32 r, $2;"))
_E2M1_BF16_HI = tl.constexpr(_E2M1_BF16.replace("SHIFT", "shr.b32 r, $2, 4;"))


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
def e2m1_scaled(w, sc, HIGH: tl.constexpr, G: tl.constexpr, SKIND: tl.constexpr, T: tl.constexpr, like):
    """One nibble of the e2m1 codes times its group scale (sc: the stored e4m3/e8m0 scale codes of
    the half tile, [BN, BK/2/G] when T else [BK/2/G, BN]), in like's dtype."""
    if like.dtype == tl.bfloat16:
        s = _scale(sc, SKIND, False).to(tl.bfloat16)  # exact: 4 significant bits, in bf16's range
        if T:
            BN: tl.constexpr = w.shape[0]
            NGH: tl.constexpr = s.shape[1]
            s = tl.reshape(tl.broadcast_to(s[:, :, None], (BN, NGH, G)), w.shape)
        else:
            NGH2: tl.constexpr = s.shape[0]
            BN2: tl.constexpr = w.shape[1]
            s = tl.reshape(tl.broadcast_to(s[:, None, :], (NGH2, G, BN2)), w.shape)
        if HIGH:
            v = tl.inline_asm_elementwise(_E2M1_BF16_HI, "=r,=r,r,r,r", [w, s], tl.bfloat16, True, 4)
        else:
            v = tl.inline_asm_elementwise(_E2M1_BF16_LO, "=r,=r,r,r,r", [w, s], tl.bfloat16, True, 4)
    else:
        v = _fp4_decode(w, sc, HIGH, G, SKIND, T, like)
    return v
