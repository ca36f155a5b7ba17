"""The PTX bit instructions the hand-written decodes use, as PTX's ISA documents them, for the
emulator tests (tests/triton/test_ptx_decode_emulated.py, test_kv_compiles.py)."""

from __future__ import annotations


def prmt(a: int, b: int, c: int) -> int:
    """``prmt.b32 d, a, b, c``: four bytes picked from {b, a} by c's nibbles (bit 3: sign-replicate)."""
    src = a | (b << 32)
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def lop3(a: int, b: int, c: int, lut: int) -> int:
    """``lop3.b32 d, a, b, c, lut``: any three-input bitwise function, bit by bit."""
    out = 0
    for bit in range(32):
        idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out
