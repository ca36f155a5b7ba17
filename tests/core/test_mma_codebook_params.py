"""The scale preparation of ``cuda.mma_fp4`` (``backends/cuda/mma_codebook.py``) checked without a GPU:
an emulation of the kernel's decode (``Deq<T, E2M1>`` in ``kernels/wna16_common.cuh``: the e2m1
bits placed as a subnormal fp16/bf16, one rounding multiply by the stored scale, the column factor
on the fp32 sums) must equal code * scale * global computed exactly (float64, from the e2m1 table)
on every code and on the extreme e4m3 / e8m0 scales, and the fp32 reference dequantizer to its
own rounding."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.mma_codebook import bnb4_operands, book_pairs, fp4_operands
from quantrt.backends.cuda.wna16_layout import TG, repack_codes
from quantrt.backends.triton.lut4_kernel import prepare_bnb4
from quantrt.canonical import CanonicalWeight
from quantrt.schemes import parse_scheme

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)


def decode_bits(codes: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """The kernel's Fp4Bits: nibble (s, e1 e0 m) -> sign at bit 15, magnitude at bits 9..11 (fp16) or 6..8 (bf16)."""
    c = codes.to(torch.int32)
    shift = 9 if act == torch.float16 else 6
    bits = ((c & 7) << shift) | ((c & 8) << 12)
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(act)  # as a signed 16-bit pattern


def exact(canon: CanonicalWeight) -> torch.Tensor:
    """code * scale (* global) in float64: e2m1 from its table, e4m3 / e8m0 scales, no rounding."""
    N, K, G = canon.N, canon.K, canon.scheme.group_size
    q = canon["qweight"].to(torch.int64)
    codes = torch.stack((q & 0xF, q >> 4), dim=-1).reshape(N, K)
    v = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
    sc = canon["scales"]
    if canon.scheme.family == "nvfp4":
        s = sc.view(torch.float8_e4m3fn).double()
        s = s * canon["global_scale"].double()[canon.slice_index()][:, None]
    else:
        s = torch.ldexp(torch.ones((), dtype=torch.float64), sc.double() - 127)
    return v * s.repeat_interleave(G, dim=1)


def widen(b: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """The kernel's Fp4Scale: an e5m3 byte as fp16 bits 7..14, or bf16 bits 4..11 plus 224 in the exponent."""
    b = b.to(torch.int32)
    bits = b << 7 if act == torch.float16 else (b << 4) + 0x7000
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(act)


def emulate(canon: CanonicalWeight, act: torch.dtype) -> torch.Tensor:
    """W as the kernel forms it: (decoded code * widened scale byte) rounded to act, times the column factor."""
    N, K, G = canon.N, canon.K, canon.scheme.group_size
    q, sz, col = fp4_operands(canon)
    assert q.dtype == sz.dtype == torch.uint8 and col.dtype == torch.float32 and col.shape == (N,)
    codes = torch.stack((q & 0xF, q >> 4), dim=-1).reshape(N, K)
    s = widen(sz[: K // G, :N].t().repeat_interleave(G, dim=1), act)  # [N, K]
    w = decode_bits(codes, act) * s  # one rounding, as __hmul2
    return w.double() * col.double()[:, None]


def adversarial(scheme: str, N: int, K: int, seed: int) -> CanonicalWeight:
    s = parse_scheme(scheme)
    g = torch.Generator().manual_seed(seed)
    G = s.group_size
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    codes[0] = 8  # -0 everywhere
    codes[1] = torch.arange(K) % 16  # every code
    codes[2] &= 0xB  # |value| <= 1.5: times 2^127 (MXFP4 row 2) it stays finite in fp32
    qweight = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    if s.family == "nvfp4":
        sc = torch.randint(0, 0x7F, (N, K // G), generator=g, dtype=torch.uint8)
        sc[2] = 0x7E  # 448, the largest
        sc[3] = 1  # 2^-9, the smallest subnormal
        sc[4, ::2] = 1  # both in one row
        sc[4, 1::2] = 0x7E
        sc[5] = 0  # a row of zero scales
        return CanonicalWeight(s, N, K, {"qweight": qweight, "scales": sc.view(torch.float8_e4m3fn),
                                         "global_scale": torch.tensor([0.37])})  # fmt: skip
    sc = torch.randint(110, 135, (N, K // G), generator=g, dtype=torch.uint8)
    sc[2] = 254  # 2^127
    sc[3] = 0  # 2^-127
    sc[4, ::2] = 120
    sc[4, 1::2] = 127 + 3
    return CanonicalWeight(s, N, K, {"qweight": qweight, "scales": sc})


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4", "w4a4-nvfp4"])
def test_emulated_decode_is_exact(scheme: str, act: torch.dtype) -> None:
    N, K = 72, 384  # N not a multiple of the 64-column padding, K of 128-input chunks
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(3)) * 0.05
    w[:, 7] *= 40
    canon = reference.quantize(w, scheme, calib=torch.randn(16, K))
    got = emulate(canon, act)
    assert torch.equal(got, exact(canon))
    torch.testing.assert_close(got, reference.dequantize(canon).double(), rtol=2.0**-23, atol=0)


@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4"])
def test_extreme_codes_and_scales_bf16_exact(scheme: str) -> None:
    canon = adversarial(scheme, 70, 256, seed=1)
    got = emulate(canon, torch.bfloat16)
    assert torch.equal(got, exact(canon))
    torch.testing.assert_close(got, reference.dequantize(canon).double(), rtol=2.0**-23, atol=0)
    assert torch.equal(got[0], torch.zeros(256))


def test_fp16_nvfp4_exact_on_every_scale() -> None:
    """e4m3 times 2^7 is an exact e5m3 byte and the products stay >= 2^-17: fp16 is exact too."""
    canon = adversarial("w4a16-nvfp4", 70, 256, seed=2)
    assert torch.equal(emulate(canon, torch.float16), exact(canon))


def test_negative_and_negative_zero_e4m3_scales() -> None:
    """A negative block scale flips its codes' signs (exact); -0 zeroes the block like +0."""
    canon = adversarial("w4a16-nvfp4", 70, 256, seed=5)
    sc = canon["scales"].view(torch.uint8)
    sc[6, ::3] |= 0x80
    sc[7, 1] = 0x80
    for act in (torch.bfloat16, torch.float16):
        got = emulate(canon, act)
        assert torch.equal(got, exact(canon))
        assert bool((got[6] < 0).any() and (got[6] > 0).any())
        assert torch.equal(got[7, 16:32], torch.zeros(16, dtype=torch.float64))


def test_mxfp4_groups_far_below_their_column_maximum() -> None:
    """e8m0 exponents 0, 24, 26, 29 and 30 below the column's largest: bf16 is exact down to 2^-29
    and drops the rest; fp16 is exact down to 2^-24 and rounds below."""
    canon = adversarial("w4a16-mxfp4", 8, 256, seed=6)
    sc = canon["scales"]
    sc[:] = torch.tensor([140, 140 - 24, 140 - 26, 140 - 29, 140 - 30, 140, 140, 140], dtype=torch.uint8)
    ref, bf, hf = exact(canon), emulate(canon, torch.bfloat16), emulate(canon, torch.float16)
    assert torch.equal(bf[:, : 4 * 32], ref[:, : 4 * 32]) and torch.equal(bf[:, 5 * 32 :], ref[:, 5 * 32 :])
    assert torch.equal(bf[:, 4 * 32 : 5 * 32], torch.zeros(8, 32, dtype=torch.float64))
    assert torch.equal(hf[:, : 2 * 32], ref[:, : 2 * 32])
    assert float((hf - ref).abs().max() / ref.abs().max()) < 2.0**-24


def test_scale_layout_is_groups_by_padded_columns() -> None:
    canon = adversarial("w4a16-nvfp4", 70, 256, seed=3)
    _, sz, col = fp4_operands(canon)
    assert sz.shape == (2 * 128 // 16, 128) and sz.is_contiguous()  # 2 chunks of 128, 70 -> 128 columns
    assert torch.equal(sz[:, 70:], torch.zeros(16, 58, dtype=torch.uint8))
    assert torch.equal(col, torch.full((70,), 0.37) * 128)  # the global scale times 2^7


def test_nan_scale_codes_refused_naming_the_count() -> None:
    canon = adversarial("w4a16-mxfp4", 8, 64, seed=4)
    canon["scales"][1, 1] = 255
    with pytest.raises(ValueError, match="e8m0 scale code 255 is NaN \\(1 of 16"):
        fp4_operands(canon)


def test_column_factors_stay_normal_fp32() -> None:
    """A row of e8m0 code 0 (2^-127) would need a subnormal fp32 column factor, which a kernel
    built with flush-to-zero reads as 0: the factor stays >= 2^-126 and the scale byte takes the rest."""
    canon = adversarial("w4a16-mxfp4", 70, 256, seed=1)
    _, _, col = fp4_operands(canon)
    assert float(col.min()) >= 2.0**-126
    assert torch.equal(emulate(canon, torch.bfloat16)[3], exact(canon)[3])


def lut_view(packed: torch.Tensor, pairs: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """Dense weights [Npad, chunks*128] in ``act`` as the LUT4 kernel's mma sees them (``Deq<T, LUT4>``
    without the scale): per lane (g, t) and k16 tile kt, bytes 2h and 2h + 1 (h = kt % 2) of word
    kt/2 index the pair table for inputs (4kt, 4kt+1) and (4kt+2, 4kt+3)."""
    tiles = packed.shape[0] * TG
    chunks = packed.shape[1]
    p = torch.stack([packed[T // TG, :, T % TG] for T in range(tiles)])  # [tiles, chunks, 32, 16]
    words = p.reshape(tiles, chunks, 32, 4, 4).to(torch.int64)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
    table = pairs.to(torch.int64) & 0xFFFFFFFF
    out = torch.full((tiles * 8, chunks * 128), -1, dtype=torch.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for kt in range(8):
            s = words[:, :, lane, kt >> 1] >> (16 * (kt & 1))
            b0, b1 = table[s & 0xFF], table[(s >> 8) & 0xFF]
            for kk, half in enumerate((b0 & 0xFFFF, b0 >> 16, b1 & 0xFFFF, b1 >> 16)):
                cols = torch.arange(chunks) * 128 + t * 32 + 4 * kt + kk
                out[g::8][:, cols] = half
    assert (out >= 0).all()
    return (out - ((out >> 15) << 16)).to(torch.int16).view(act)


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_lut4_decodes_every_code_pair(act: torch.dtype) -> None:
    """Every code byte, against a book whose 16 values have distinct low and high bytes (so a wrong
    byte, half or pair order shows)."""
    book = torch.tensor([(-1) ** i * (1 + i / 16) * 2.0 ** (i - 8) for i in range(16)])
    N, K = 64, 256
    codes = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    codes[0] = torch.arange(128, dtype=torch.uint8)
    codes[1] = torch.arange(128, 256, dtype=torch.int64).to(torch.uint8)
    want = book.to(act)[torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(N, K).long()]
    got = lut_view(repack_codes(codes, 4, N, K, natural=True), book_pairs(book, act), act)
    assert torch.equal(got[:N, :K], want)


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", ["w4a16-nf4-g64", "w4a16-bnbfp4-g64-dq"])
def test_lut4_registers_and_scales_give_the_reference(scheme: str, act: torch.dtype) -> None:
    """The repacked codes read through the pair table, times the stored scales and the column
    factor, equal the reference dequantizer to the activation dtype's roundings."""
    N, K = 40, 384
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.05
    canon = reference.quantize(w, scheme)
    codes, sz, col, pairs = bnb4_operands(canon, act)
    book = prepare_bnb4(canon)[2]
    assert torch.equal(lut_view(repack_codes(codes, 4, N, K, natural=True), pairs, act)[:N, :K], book.to(act)[
        torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(N, K).long()])  # fmt: skip
    vals = book.to(act)[torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(N, K).long()]
    s = sz[: K // 64, :N].t().repeat_interleave(64, dim=1)
    got = (vals * s).double() * col.double()[:, None]  # one rounding multiply, as __hmul2
    ref = reference.dequantize(canon).double()
    step = 2.0 ** (-8 if act == torch.bfloat16 else -11)
    assert float(((got - ref).abs() / ref.abs().amax(dim=1, keepdim=True)).max()) < 2 * step
    assert float((got - ref).norm() / ref.norm()) < step


def test_launch_rows_per_code_book_kind() -> None:
    """bitsandbytes code books take their own sweep where the table has one (their 32 KiB table
    changes what fits), else fp4's rows; fp4's rows keep at least 2 n8 tiles (byte scales)."""
    from quantrt.backends.cuda.mma_codebook import CudaMmaBnb4, CudaMmaFp4

    base = [{"max_m": 1, "mt": 1, "nt": 1, "swap": True}, {"max_m": 16, "mt": 1, "nt": 4}]
    own = [{"max_m": 1, "mt": 1, "nt": 8, "wn": 2, "swap": True}]
    assert [r["nt"] for r in CudaMmaFp4().tile_rows({"small_m": base})] == [2, 4]
    assert [r["nt"] for r in CudaMmaBnb4().tile_rows({"small_m": base})] == [2, 4]
    assert CudaMmaBnb4().tile_rows({"small_m": base, "small_m_bnb4": own}) == [own[0], base[1]]
    assert [r["nt"] for r in CudaMmaFp4().tile_rows({"small_m": base, "small_m_bnb4": own})] == [2, 4]
