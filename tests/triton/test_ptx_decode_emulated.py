"""The PTX blocks of ``backends/cuda/triton_decode.py`` run through a small emulator of the PTX
instructions they use (``mov``, ``shr``/``shl``/``and``/``or``, ``prmt`` in its default mode,
``lop3`` and the packed ``fma``), as the PTX ISA documents them, against the decodes they stand
for: ``q - z`` of int4 nibbles in bf16 and fp16, and e2m1 value x scale in bf16, every nibble of
random bytes. It checks the selectors, masks and byte tables without a GPU; that the hardware
agrees is tests/gpu/test_moe_cuda.py's ``ptx`` tests."""

from __future__ import annotations

import operator
import struct

import numpy as np
import pytest
import torch
from ptx_emulator import lop3, prmt

pytest.importorskip("triton")
from quantrt.backends.cuda import triton_decode as td

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _f16x2(v: int, kind: str) -> tuple[float, float]:
    halves = (v & 0xFFFF, v >> 16)
    if kind == "bf16":
        return tuple(struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves)  # type: ignore[return-value]
    return tuple(float(np.frombuffer(np.uint16(h).tobytes(), np.float16)[0]) for h in halves)  # type: ignore[return-value]


def _bits(x: float, kind: str) -> int:
    t = torch.tensor([x], dtype=torch.float32).to(torch.bfloat16 if kind == "bf16" else torch.float16)
    return int(t.view(torch.int16).item()) & 0xFFFF


def run(asm: str, inputs: list[int], n_out: int = 2) -> list[int]:
    """Execute one block: $0 .. $(n_out - 1) the outputs, then the inputs (32-bit registers)."""
    regs: dict[str, int] = {}
    outs = [0] * n_out

    def val(tok: str) -> int:
        tok = tok.strip()
        if tok.startswith("$"):
            i = int(tok[1:])
            return outs[i] if i < n_out else inputs[i - n_out]
        if tok.lower().startswith("0x") or tok.isdigit():
            return int(tok, 0)
        return regs[tok]

    def put(tok: str, v: int) -> None:
        v &= 0xFFFFFFFF
        if tok.startswith("$"):
            outs[int(tok[1:])] = v
        else:
            regs[tok] = v

    for ins in asm.replace("\n", " ").split(";"):
        ins = ins.strip().strip("{}").strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        args = [x.strip() for x in rest.split(",")]
        if op == "mov.b32":
            put(args[0], val(args[1]))
        elif op == "prmt.b32":
            put(args[0], prmt(val(args[1]), val(args[2]), val(args[3])))
        elif op == "lop3.b32":
            put(args[0], lop3(val(args[1]), val(args[2]), val(args[3]), val(args[4])))
        elif op in ("shr.b32", "shl.b32", "and.b32", "or.b32"):
            a, b = val(args[1]), val(args[2])
            fn = {  # only the one op: a << (a mask) would build a huge int
                "shr.b32": operator.rshift,
                "shl.b32": operator.lshift,
                "and.b32": operator.and_,
                "or.b32": operator.or_,
            }
            put(args[0], fn[op](a, b))
        elif op in ("fma.rn.bf16x2", "fma.rn.f16x2"):
            kind = "bf16" if "bf16" in op else "f16"
            a, b, c = (_f16x2(val(x), kind) for x in args[1:4])
            lo, hi = (_bits(a[i] * b[i] + c[i], kind) for i in range(2))  # exact products here
            put(args[0], lo | (hi << 16))
        else:
            raise AssertionError(f"the emulator lacks {op}")
    return outs


def _pack(vals: list[float], kind: str) -> list[int]:
    b = [_bits(v, kind) for v in vals]
    return [b[0] | b[1] << 16, b[2] | b[3] << 16]


@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("high", [False, True], ids=["lo", "hi"])
def test_int4_minus(kind: str, high: bool) -> None:
    asm = {
        ("bf16", False): td._INT4_BF16_LO, ("bf16", True): td._INT4_BF16_HI,
        ("f16", False): td._INT4_F16_LO, ("f16", True): td._INT4_F16_HI,
    }[(kind, high)].value  # fmt: skip
    magic = 128.0 if kind == "bf16" else 1024.0
    rng = np.random.default_rng(1 + high + 2 * (kind == "f16"))
    for _ in range(300):
        b = [int(v) for v in rng.integers(0, 256, 4)]
        z = [int(v) for v in rng.integers(0, 17, 4)]  # GPTQ v1's zero may be 2^b
        o0, o1 = run(
            asm, [b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, *_pack([-(magic + x) for x in z], kind)]
        )
        got = [*_f16x2(o0, kind), *_f16x2(o1, kind)]
        want = [float(((x >> 4) if high else (x & 0xF)) - zz) for x, zz in zip(b, z, strict=True)]
        assert got == want, (b, z, got, want)


def test_e2m1_scaled() -> None:
    """Both nibbles of four bytes: outputs (L0 L1), (L2 L3), (H0 H1), (H2 H3), each nibble times its
    own scale (the low nibbles' and high nibbles' groups differ)."""
    asm = td._E2M1_PAIR_BF16.value
    rng = np.random.default_rng(7)
    for _ in range(400):
        b = [int(v) for v in rng.integers(0, 256, 4)]
        # e8m0-like powers of two and e4m3-like 4-significant-bit scales
        s = [float(2.0 ** int(rng.integers(-30, 30)) * rng.choice([1, 1.125, 1.5, 1.875])) for _ in range(8)]
        outs = run(
            asm, [b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, *_pack(s[:4], "bf16"), *_pack(s[4:], "bf16")], 4
        )
        got = [v for o in outs for v in _f16x2(o, "bf16")]
        codes = [x & 0xF for x in b] + [x >> 4 for x in b]
        want = [(-1.0 if c & 8 else 1.0) * E2M1[c & 7] * sc for c, sc in zip(codes, s, strict=True)]
        assert got == want, (b, s, got, want)
        neg_zero = [c == 8 for c in codes]  # -0 keeps its sign
        assert [str(g).startswith("-") for g, nz in zip(got, neg_zero, strict=True) if nz] == [True] * sum(
            neg_zero
        )


def test_e2m1_lifted_against_bf16_byte_scales() -> None:
    """NVFP4's path: e4m3 scales re-encoded by ``bf16_byte_scales`` (one per code byte here, group 2;
    negative ones flip their codes' signs), widened as the kernel does (bits ``c << 4``) and fed to the
    block with the tables times 2^117: every product equals e2m1 value x e4m3 scale, over every e4m3
    code but the NaNs, subnormal scales included."""
    from quantrt.backends.triton.moe import bf16_byte_scales

    asm = td._E2M1_PAIR_BF16_LIFTED.value
    e4m3 = [c for c in range(256) if c & 0x7F != 0x7F]
    rng = np.random.default_rng(11)
    for i in range(600):
        b = [int(v) for v in rng.integers(0, 256, 4)]
        sc = [e4m3[(4 * i + j) % len(e4m3)] for j in range(4)]  # every code, in turn
        codes, c = bf16_byte_scales(
            torch.tensor([b], dtype=torch.uint8), torch.tensor([sc], dtype=torch.uint8), 2
        )
        w = [int(v) for v in codes[0]]
        s16 = [int(v) << 4 for v in c[0]]
        pairs = [s16[0] | s16[1] << 16, s16[2] | s16[3] << 16]
        outs = run(asm, [w[0] | w[1] << 8 | w[2] << 16 | w[3] << 24, *pairs, *pairs], 4)
        got = [v for o in outs for v in _f16x2(o, "bf16")]
        scale = torch.tensor(sc, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
        codes_in = [x & 0xF for x in b] + [x >> 4 for x in b]
        want = [(-1.0 if q & 8 else 1.0) * E2M1[q & 7] * scale[j % 4] for j, q in enumerate(codes_in)]
        assert got == want, (b, sc, got, want)


def test_e2m1_lifted_against_e5m3_scales() -> None:
    """The lane layout's path: e5m3 scale bytes (``fp4_operands``: every normal byte in turn) widened
    as the kernel does (bits ``c << 4``) and fed to the block with the tables times 2^98: every product
    equals e2m1 value x e5m3 scale x 2^-14, as the CUDA kernel's decode gives it."""
    asm = td._E2M1_PAIR_BF16_E5M3.value
    e5m3 = list(range(0x08, 0x100))  # exponent field 1..31
    rng = np.random.default_rng(13)
    for i in range(500):
        b = [int(v) for v in rng.integers(0, 256, 4)]
        sc = [e5m3[(4 * i + j) % len(e5m3)] for j in range(4)]
        s16 = [c << 4 for c in sc]
        pairs = [s16[0] | s16[1] << 16, s16[2] | s16[3] << 16]
        outs = run(asm, [b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, *pairs, *pairs], 4)
        got = [v for o in outs for v in _f16x2(o, "bf16")]
        scale = [2.0 ** ((c >> 3) - 15) * (1 + (c & 7) / 8) * 2.0**-14 for c in sc]
        codes_in = [x & 0xF for x in b] + [x >> 4 for x in b]
        want = [(-1.0 if q & 8 else 1.0) * E2M1[q & 7] * scale[j % 4] for j, q in enumerate(codes_in)]
        assert got == want, (b, sc, got, want)
