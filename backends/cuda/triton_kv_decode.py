"""4-bit TurboQuant code decodes for NVIDIA GPUs as inline PTX, for the decode attention kernel of
``backends/triton/kv.py`` (``decode_kv(decoders=DECODERS)``, in place of its portable decodes).

The kernel reads 4-bit codes as 16-bit words (four channels each) and asks for code ``n`` of every
word; each asm block takes two words in one register and yields two fp16 in one. A block is pure
and has one operand, so Triton moves the words' shared-memory load into the matrix operand's
register layout and decodes there: no table in shared memory, no round trip of the decoded tile.
The four blocks of one register repeat the same instructions but for their last, and ptxas merges
them, so a register of eight codes costs one decode. Both are exact:

- :func:`centroid_code` (keys): the code book compiled in as byte tables (the fp16 low and high
  bytes of the centroids) that ``prmt`` indexes with three-bit selectors, four codes per
  instruction. A symmetric code book (``c[15 - i] = -c[i]``, every TurboQuant one) is looked up by
  magnitude, eight entries, with the sign ORed into the high bytes; any other takes two lookups per
  byte plane and a select on the code's top bit.
- :func:`uint_code` (values): the code ORed into the mantissa of 1024 (``lop3``) and 1024
  subtracted by one packed fp16 subtraction.
- :func:`byte_code` (fp8 values, read as 16-bit words of two): byte n of both words gathered by
  one ``prmt`` and converted by ``cvt.rn.f16x2.e4m3x2`` (e5m2 likewise).

fp32 queries (fp32 dots) take the portable decodes; the Triton interpreter cannot run PTX, so the
CPU tests run the portable ones and tests/triton/test_kv_compiles.py checks these blocks under an
emulation of the instructions they use (and that ptxas takes them); tests/gpu/test_kv_cuda.py runs
them on the GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantrt.backends.triton.kv import _byte_code, _centroid_code, _uint_code

# output n: the lanes of code n of both words in the (low, high) byte-plane lookups
_OUT = ("prmt.b32 $0, la, ha, 0x6240;", "prmt.b32 $0, la, ha, 0x7351;", "prmt.b32 $0, lb, hb, 0x6240;",
        "prmt.b32 $0, lb, hb, 0x7351;")  # fmt: skip


@triton.constexpr_function
def _words(vals: list[int]) -> list[int]:
    """Bytes (four per word, first in the low byte) as 32-bit words."""
    return [sum(vals[4 * w + k] << (8 * k) for k in range(4)) for w in range(len(vals) // 4)]


@triton.constexpr_function
def symmetric(bits: tuple[int, ...]) -> bool:
    """Whether a 16-entry fp16 code book is ``c[15 - i] = -c[i]`` with ``c[8..15] >= +0``."""
    return all(bits[15 - i] == bits[i] ^ 0x8000 for i in range(16)) and all(b < 0x8000 for b in bits[8:])


@triton.constexpr_function
def key_asm(bits: tuple[int, ...], n: int) -> str:
    """The PTX block of code ``n`` of two 16-bit words ($1) for a 16-entry fp16 code book ``bits``.

    Selectors: bytes 0 and 2 of the register (codes 0, 1 of each word) for ``sa``, bytes 1 and 3
    for ``sb``; ``ma``/``mb`` the code's top bit replicated over its lane (``prmt`` sign mode).
    ``lop3`` tables: 0x82 ``(a ^ ~b) & c``, 0xF2 ``a | (~b & c)``, 0xD8 ``c ? b : a``."""
    head = """shl.b32 t, $1, 4;
prmt.b32 ma, t, $1, 0xEAC8;
prmt.b32 mb, t, $1, 0xFBD9;
"""
    if symmetric(bits):
        mag = bits[8:]  # index by magnitude: code i >= 8 -> i - 8, code i < 8 -> 7 - i, negative
        lo, hi = _words([b & 0xFF for b in mag]), _words([b >> 8 for b in mag])
        body = f""".reg .b32 t, ma, mb, f, i, sa, sb, la, ha, lb, hb, l0, l1, h0, h1;
mov.b32 l0, {lo[0]:#010x}; mov.b32 l1, {lo[1]:#010x}; mov.b32 h0, {hi[0]:#010x}; mov.b32 h1, {hi[1]:#010x};
{head}shr.b32 f, $1, 3;
and.b32 f, f, 0x11111111;
mul.lo.u32 f, f, 7;
lop3.b32 i, $1, f, 0x77777777, 0x82;
prmt.b32 sa, i, i, 0x0020;
prmt.b32 sb, i, i, 0x0031;
prmt.b32 la, l0, l1, sa; prmt.b32 ha, h0, h1, sa; lop3.b32 ha, ha, ma, 0x80808080, 0xF2;
prmt.b32 lb, l0, l1, sb; prmt.b32 hb, h0, h1, sb; lop3.b32 hb, hb, mb, 0x80808080, 0xF2;
"""
    else:
        lo, hi = _words([b & 0xFF for b in bits]), _words([b >> 8 for b in bits])
        tables = "\n".join(
            f"mov.b32 {p}{k}, {w:#010x};" for p, ws in (("l", lo), ("h", hi)) for k, w in enumerate(ws)
        )
        body = f""".reg .b32 t, ma, mb, i, sa, sb, a, b, la, ha, lb, hb, l0, l1, l2, l3, h0, h1, h2, h3;
{tables}
{head}and.b32 i, $1, 0x77777777;
prmt.b32 sa, i, i, 0x0020;
prmt.b32 sb, i, i, 0x0031;
prmt.b32 a, l0, l1, sa; prmt.b32 b, l2, l3, sa; lop3.b32 la, a, b, ma, 0xD8;
prmt.b32 a, h0, h1, sa; prmt.b32 b, h2, h3, sa; lop3.b32 ha, a, b, ma, 0xD8;
prmt.b32 a, l0, l1, sb; prmt.b32 b, l2, l3, sb; lop3.b32 lb, a, b, mb, 0xD8;
prmt.b32 a, h0, h1, sb; prmt.b32 b, h2, h3, sb; lop3.b32 hb, a, b, mb, 0xD8;
"""
    return "{\n" + body + _OUT[n] + "\n}"


@triton.constexpr_function
def value_asm(n: int) -> str:
    """The PTX block of code ``n`` of two 16-bit words ($1): 1024 + code in fp16 (``lop3`` 0xEA:
    ``(a & b) | c``), minus 1024."""
    src = f"shr.b32 t, $1, {4 * n};" if n else "mov.b32 t, $1;"
    return f"""{{
.reg .b32 t, m, g;
mov.b32 m, 0x000F000F; mov.b32 g, 0x64006400;
{src}
lop3.b32 t, t, m, g, 0xEA;
sub.rn.f16x2 $0, t, g;
}}"""


#: ``prmt`` selectors gathering byte n of both 16-bit words of a register into its low half
_BYTE_SEL = (0x0020, 0x0031)
#: the packed conversion of two e4m3 / e5m2 bytes to two fp16 (the kernel's KIND 1 / 2)
_CVT = {1: "e4m3x2", 2: "e5m2x2"}


@triton.constexpr_function
def byte_asm(kind: int, n: int) -> str:
    """The PTX block of byte ``n`` of two 16-bit words ($1) as two fp16 ($0), exact: the fp8 bytes
    gathered into one 16-bit pair and converted by ``cvt`` (two instructions)."""
    return f"""{{
.reg .b32 t;
.reg .b16 lo, hi;
prmt.b32 t, $1, 0, {_BYTE_SEL[n]:#06x};
mov.b32 {{lo, hi}}, t;
cvt.rn.f16x2.{_CVT[kind]} $0, lo;
}}"""


@triton.constexpr_function
def _compiled_book(bits: tuple[int, ...]) -> bool:
    return len(bits) == 16


@triton.jit
def centroid_code(w, N: tl.constexpr, CB, CBITS: tl.constexpr, DT: tl.constexpr):
    """The centroid of code N of each 16-bit word (uint16 w) in DT; ``CBITS``: the centroids' fp16
    bits (the code book compiled in), CB the same in global memory (the portable decode's)."""
    if DT == tl.float16 and _compiled_book(CBITS):
        c = tl.inline_asm_elementwise(key_asm(CBITS, N), "=r,r", [w], tl.float16, True, 2)
    else:
        c = _centroid_code(w, N, CB, CBITS, DT)
    return c


@triton.jit
def uint_code(w, N: tl.constexpr, DT: tl.constexpr):
    """Code N of each 16-bit word (uint16 w) in DT, exact."""
    if DT == tl.float16:
        v = tl.inline_asm_elementwise(value_asm(N), "=r,r", [w], tl.float16, True, 2)
    else:
        v = _uint_code(w, N, DT)
    return v


@triton.jit
def byte_code(w, N: tl.constexpr, KIND: tl.constexpr, HW: tl.constexpr, DT: tl.constexpr):
    """Byte N of each 16-bit word (uint16 w; an e4m3 or e5m2 value code) in DT, exact."""
    if DT == tl.float16:
        v = tl.inline_asm_elementwise(byte_asm(KIND, N), "=r,r", [w], tl.float16, True, 2)
    else:
        v = _byte_code(w, N, KIND, HW, DT)
    return v


#: ``decode_kv(decoders=DECODERS)``
DECODERS = (centroid_code, uint_code, byte_code)
