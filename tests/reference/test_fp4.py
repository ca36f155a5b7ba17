"""NVFP4 and MXFP4 references: decoders against hand-computed numbers and float64 loops written here,
RTN quantizers against independent nearest-value searches and error bounds.

Nothing here compares the code under test with itself: element, scale and rounding expectations
come from the format definitions (bit fields of e2m1, e4m3 and e8m0), written out in this file.
"""

from __future__ import annotations

import math

import pytest
import torch

from quantrt.canonical import CanonicalWeight, canonical_specs
from quantrt.reference import dequantize as ref_dequantize
from quantrt.reference import fp4
from quantrt.reference import quantize as ref_quantize
from quantrt.schemes import Scheme, catalog, parse_scheme

NV = parse_scheme("w4a16-nvfp4")
NV_A4 = parse_scheme("w4a4-nvfp4")
MX = parse_scheme("w4a16-mxfp4")


# -- independent definitions ----------------------------------------------------------------------


def e2m1_value(code: int) -> float:
    """e2m1 from its bit fields: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0."""
    sign, exp, man = code >> 3, (code >> 1) & 3, code & 1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return math.copysign(mag, -1.0 if sign else 1.0)


def e4m3_value(byte: int) -> float:
    """float8 e4m3fn from its bit fields: bias 7, 3 mantissa bits, subnormals m * 2^-9, S.1111.111 NaN."""
    sign, exp, man = byte >> 7, (byte >> 3) & 15, byte & 7
    if exp == 15 and man == 7:
        return math.nan
    mag = man * 2.0**-9 if exp == 0 else 2.0 ** (exp - 7) * (1 + man / 8)
    return -mag if sign else mag


E2M1_POS = [(e2m1_value(c), c) for c in range(8)]
E4M3_POS = [(e4m3_value(b), b) for b in range(0x7F)]  # 0 .. 448


def nearest_even(x: float, grid: list[tuple[float, int]]) -> tuple[float, int]:
    """The grid point nearest to x >= 0 (saturating at the top); a tie goes to the even code."""
    best = min(grid, key=lambda vc: (abs(vc[0] - x), vc[1] & 1))
    return best


@pytest.fixture
def gen() -> torch.Generator:
    """Seeded per test (defined here so these tests do not depend on another module's fixtures)."""
    return torch.Generator().manual_seed(4242)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref||_F / ||ref||_F`` in float64."""
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def rand_w(gen: torch.Generator, n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, generator=gen, dtype=torch.float32)


def weight(
    scheme: Scheme, n: int, k: int, sizes: tuple[int, ...] = (), **tensors: torch.Tensor
) -> CanonicalWeight:
    return CanonicalWeight(scheme, n, k, dict(tensors), sizes)


# -- e2m1, packing, e8m0 ---------------------------------------------------------------------------


def test_e2m1_decode_table_from_bit_fields() -> None:
    got = fp4.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert got.tolist() == magnitudes + [-m for m in magnitudes]
    assert got.tolist() == [e2m1_value(c) for c in range(16)]
    assert torch.signbit(got[8]) and not torch.signbit(got[0])  # 0x8 is -0


@pytest.mark.parametrize(
    ("x", "want"),
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
     (-0.25, -0.0), (-0.75, -1.0), (-1.25, -1.0), (-1.75, -2.0), (-2.5, -2.0), (-3.5, -4.0), (-5.0, -4.0),
     (0.26, 0.5), (0.74, 0.5), (1.26, 1.5), (2.6, 3.0), (4.9, 4.0), (5.1, 6.0),
     (6.0, 6.0), (6.5, 6.0), (7.99, 6.0), (1e30, 6.0), (-100.0, -6.0), (0.0, 0.0), (-0.0, -0.0)],
)  # fmt: skip
def test_e2m1_round_ties_to_even_and_saturates(x: float, want: float) -> None:
    got = fp4.e2m1_round(torch.tensor([x]))
    assert got.item() == want
    assert bool(torch.signbit(got[0])) == (math.copysign(1.0, want) < 0)


def test_e2m1_round_matches_brute_force(gen: torch.Generator) -> None:
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    xs = torch.cat(
        [
            torch.empty(400).uniform_(-8, 8, generator=gen),
            torch.tensor(mids + [-m for m in mids] + [v for v, _ in E2M1_POS]),
        ]
    )
    codes = fp4.e2m1_encode(xs)
    for x, c in zip(xs.tolist(), codes.tolist()):
        value, mag_code = nearest_even(abs(x), E2M1_POS)
        assert c == mag_code | (8 if x < 0 else 0), x
        assert e2m1_value(c) == math.copysign(value, x)


def test_byte_0x21_unpacks_low_nibble_first() -> None:
    codes = fp4.unpack_fp4(torch.tensor([[0x21]], dtype=torch.uint8))
    assert codes.tolist() == [[1, 2]]
    assert fp4.e2m1_decode(codes).tolist() == [[0.5, 1.0]]
    assert fp4.pack_fp4(torch.tensor([[1, 2]], dtype=torch.uint8)).tolist() == [[0x21]]


def test_pack_unpack_round_trip(gen: torch.Generator) -> None:
    codes = torch.randint(0, 16, (5, 64), generator=gen, dtype=torch.uint8)
    packed = fp4.pack_fp4(codes)
    assert packed.shape == (5, 32)
    expect = [[int(r[2 * j]) | int(r[2 * j + 1]) << 4 for j in range(32)] for r in codes]
    assert packed.tolist() == expect
    assert torch.equal(fp4.unpack_fp4(packed), codes)
    with pytest.raises(ValueError, match="even last dimension"):
        fp4.pack_fp4(codes[:, :3])


def test_e8m0_extremes_are_exact_and_255_is_nan() -> None:
    got = fp4.e8m0_decode(torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8))
    tiny = torch.tensor(2.0**-127, dtype=torch.float32)
    assert tiny.item() == 2.0**-127 and tiny.item() > 0  # a finite fp32 subnormal
    assert got[:6].tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert torch.isnan(got[6])
    every = torch.arange(255, dtype=torch.uint8)
    assert fp4.e8m0_decode(every).tolist() == [math.ldexp(1.0, e - 127) for e in range(255)]
    with pytest.raises(ValueError, match="uint8"):
        fp4.e8m0_decode(torch.tensor([3], dtype=torch.int32))


# -- NVFP4 decode ---------------------------------------------------------------------------------


def test_nvfp4_dequant_hand_computed() -> None:
    # bytes (low nibble first): 0x21 -> 0.5, 1.0 | 0x7F -> -6, 6 | 0x80 -> 0, -0 | 0x9A -> -1, -0.5
    q = torch.tensor([[0x21, 0x7F, 0x80, 0x9A, 0, 0, 0, 0]], dtype=torch.uint8)
    s = torch.tensor([[3.0]]).to(torch.float8_e4m3fn)
    g = torch.tensor([0.25])  # every element is scaled by 3 * 0.25 = 0.75
    w = fp4.dequantize(weight(NV, 1, 16, qweight=q, scales=s, global_scale=g))
    assert w.tolist() == [[0.375, 0.75, -4.5, 4.5, 0.0, -0.0, -0.75, -0.375] + [0.0] * 8]
    assert torch.signbit(w[0, 5]) and not torch.signbit(w[0, 4])


def test_nvfp4_largest_block_scale_448() -> None:
    q = torch.full((1, 8), 0x77, dtype=torch.uint8)  # code 7 = 6.0 everywhere
    s = torch.tensor([[0x7E]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert e4m3_value(0x7E) == 448.0
    w = fp4.dequantize(weight(NV, 1, 16, qweight=q, scales=s, global_scale=torch.tensor([1.0])))
    assert w.tolist() == [[2688.0] * 16]


def test_nvfp4_dequant_matches_float64_loops(gen: torch.Generator) -> None:
    sizes = (2, 3, 1)
    n, k = sum(sizes), 48
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    sbytes = torch.randint(0, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)  # every finite positive
    g = torch.tensor([0.013, 2.5e-3, 7.0])
    w = fp4.dequantize(
        weight(NV, n, k, sizes, qweight=q, scales=sbytes.view(torch.float8_e4m3fn), global_scale=g)
    )
    row_slice = [i for i, size in enumerate(sizes) for _ in range(size)]
    for r in range(n):
        for c in range(k):
            byte = int(q[r, c // 2])
            code = byte & 0xF if c % 2 == 0 else byte >> 4
            expect = e2m1_value(code) * e4m3_value(int(sbytes[r, c // 16])) * float(g[row_slice[r]])
            assert w[r, c].item() == f32(expect), (r, c)


# -- MXFP4 decode ---------------------------------------------------------------------------------


def test_mxfp4_dequant_hand_computed() -> None:
    q = torch.zeros(3, 16, dtype=torch.uint8)
    q[0, 0] = 0x21  # codes 1, 2 -> 0.5, 1.0; E = 128 -> x2
    q[1, 0] = 0x08  # code 8 (-0) then 0
    e = torch.tensor([[128], [0], [255]], dtype=torch.uint8)
    w = fp4.dequantize(weight(MX, 3, 32, qweight=q, scales=e))
    assert w[0, :3].tolist() == [1.0, 2.0, 0.0]
    assert w[1, 0].item() == 0.0 and torch.signbit(w[1, 0]) and not torch.signbit(w[1, 1])
    assert torch.isnan(w[2]).all()  # E = 255 is NaN for the whole block


def test_mxfp4_dequant_matches_float64_loops(gen: torch.Generator) -> None:
    n, k = 4, 64
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    e = torch.randint(0, 255, (n, k // 32), generator=gen, dtype=torch.uint8)
    e[0, 0], e[0, 1], e[1, 0] = 0, 254, 127
    w = fp4.dequantize(weight(MX, n, k, qweight=q, scales=e))
    for r in range(n):
        for c in range(k):
            byte = int(q[r, c // 2])
            code = byte & 0xF if c % 2 == 0 else byte >> 4
            expect = math.ldexp(e2m1_value(code), int(e[r, c // 32]) - 127)
            assert w[r, c].item() == f32(expect), (r, c)  # E = 254 with |e2m1| >= 2 is past fp32: inf
    assert torch.isinf(w[0, 32:]).any()


# -- NVFP4 RTN ------------------------------------------------------------------------------------


def test_nvfp4_rtn_recovers_on_grid_weights_exactly(gen: torch.Generator) -> None:
    n, k = 4, 32
    g0 = 2.0**-10
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[:, ::16] = 7  # every block reaches +6, so its amax is 6 * s * g
    sbytes = torch.randint(0x20, 0x7E, (n, k // 16), generator=gen, dtype=torch.uint8)
    sbytes[0, 0] = 0x7E  # one block at 448: the tensor amax is 6 * 448 * g0
    w = torch.tensor(
        [
            [e2m1_value(int(codes[r, c])) * e4m3_value(int(sbytes[r, c // 16])) * g0 for c in range(k)]
            for r in range(n)
        ]
    )
    t = fp4.quantize(w, NV, g_idx=None, output_sizes=(n,), calib=None)
    assert t["global_scale"].tolist() == [g0]
    assert torch.equal(t["scales"].view(torch.uint8), sbytes)
    nonzero = w != 0
    assert torch.equal(fp4.unpack_fp4(t["qweight"])[nonzero], codes[nonzero])
    assert torch.equal(
        fp4.dequantize(
            weight(NV, n, k, qweight=t["qweight"], scales=t["scales"], global_scale=t["global_scale"])
        ),
        w,
    )


def check_nvfp4_rtn(w: torch.Tensor, t: dict[str, torch.Tensor], sizes: tuple[int, ...]) -> None:
    """Global per slice, block scale a nearest e4m3 value, codes nearest e2m1 values (float64 search)."""
    n, k = w.shape
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for i, (start, size) in enumerate(zip(starts, sizes)):
        assert t["global_scale"][i].item() == f32(w[start : start + size].abs().max().item() / 2688.0)
    scales = t["scales"].view(torch.uint8)
    codes = fp4.unpack_fp4(t["qweight"])
    row_slice = [i for i, size in enumerate(sizes) for _ in range(size)]
    for r in range(n):
        g = t["global_scale"][row_slice[r]].item()
        for b in range(k // 16):
            block = w[r, 16 * b : 16 * b + 16].tolist()
            ideal = max(abs(v) for v in block) / (6.0 * g)
            got = e4m3_value(int(scales[r, b]))
            best = min(abs(v - ideal) for v, _ in E4M3_POS)
            assert abs(got - ideal) <= best * (1 + 1e-6) + 1e-12, (r, b, got, ideal)
            for j, v in enumerate(block):
                c = int(codes[r, 16 * b + j])
                if got == 0:
                    assert c == 0
                    continue
                x = v / (got * g)
                assert abs(e2m1_value(c) - x) <= min(abs(math.copysign(e, x) - x) for e, _ in E2M1_POS) + 1e-6
                assert (c >> 3) == (1 if x < 0 else 0) or e2m1_value(c) == 0


def test_nvfp4_rtn_global_scale_per_slice(gen: torch.Generator) -> None:
    sizes = (8, 4, 4)
    w = rand_w(gen, 16, 64)
    w[8:12] *= 1e3
    w[12:] *= 1e-3  # under one shared global these blocks would fall below e4m3's smallest step
    t = fp4.quantize(w, NV, g_idx=None, output_sizes=sizes, calib=None)
    assert t["global_scale"].shape == (3,)
    check_nvfp4_rtn(w, t, sizes)
    d = fp4.dequantize(weight(NV, 16, 64, sizes, **t))
    for a, b in ((0, 8), (8, 12), (12, 16)):
        assert rel_err(d[a:b], w[a:b]) < 0.12


def test_nvfp4_rtn_error_bound_and_zero_blocks(gen: torch.Generator) -> None:
    w = rand_w(gen, 6, 48)
    w[1, 16:32] = 0.0
    t = fp4.quantize(w, NV, g_idx=None, output_sizes=(6,), calib=None)
    check_nvfp4_rtn(w, t, (6,))
    assert t["scales"][1, 1].float().item() == 0.0
    assert (fp4.unpack_fp4(t["qweight"])[1, 16:32] == 0).all()
    d = fp4.dequantize(weight(NV, 6, 48, **t))
    step = t["scales"].float().repeat_interleave(16, dim=1) * t["global_scale"]
    assert ((d - w).abs() <= step * (1 + 1e-6)).all()  # never more than one block step off


def test_nvfp4_zero_weight_gets_finite_global() -> None:
    t = fp4.quantize(torch.zeros(2, 16), NV, g_idx=None, output_sizes=(2,), calib=None)
    assert t["global_scale"].tolist() == [1.0]
    assert (t["qweight"] == 0).all() and (t["scales"].float() == 0).all()


def test_w4a4_input_global_scale_and_missing_calib(gen: torch.Generator) -> None:
    w = rand_w(gen, 4, 32)
    calib = rand_w(gen, 5, 32)
    t = fp4.quantize(w, NV_A4, g_idx=None, output_sizes=(4,), calib=calib)
    assert t["input_global_scale"].shape == (1,)
    assert t["input_global_scale"].item() == f32(calib.abs().max().item() / 2688.0)
    with pytest.raises(ValueError, match="calib"):
        fp4.quantize(w, NV_A4, g_idx=None, output_sizes=(4,), calib=None)
    with pytest.raises(ValueError, match="K=32"):
        fp4.quantize(w, NV_A4, g_idx=None, output_sizes=(4,), calib=calib[:, :16])
    assert "input_global_scale" not in fp4.quantize(w, NV, g_idx=None, output_sizes=(4,), calib=calib)


# -- NVFP4 activations ----------------------------------------------------------------------------


def test_fake_quantize_activations_hand_computed() -> None:
    # g = 0.25: a group whose amax is 1.5 gets sb = e4m3(1.5 / (6 g)) = 1, so x / (sb g) = 4x
    row = [1.5, 0.75, 0.1875, 0.3, -0.09375, -0.5, 0.45, 0.0] + [0.0] * 8
    x = torch.tensor([row + [0.0] * 16 + [0.25, -0.5, 0.1]])  # K = 35: an all-zero group, a ragged one of 3
    got = fp4.fake_quantize_nvfp4_activations(x, torch.tensor([0.25]))
    # 4x = 6, 3, 0.75, 1.2, -0.375, -2, 1.8, 0 -> 6, 3, 1, 1, -0.5, -2, 2, 0 (0.75 ties to even 1), times 0.25
    assert got[0, :16].tolist() == [1.5, 0.75, 0.25, 0.25, -0.125, -0.5, 0.5, 0.0] + [0.0] * 8
    assert (got[0, 16:32] == 0).all()
    # ragged group: amax 0.5, 0.5 / 1.5 = 1/3 -> nearest e4m3 0.34375 (0.3125 is farther); step 0.0859375:
    # 0.25 -> 2.91 -> 3, -0.5 -> -5.82 -> -6, 0.1 -> 1.16 -> 1
    assert e4m3_value(0x2B) == 0.34375 and e4m3_value(0x2A) == 0.3125
    assert got[0, 32:].tolist() == [3 * 0.0859375, -6 * 0.0859375, 0.0859375]


def test_fake_quantize_activations_matches_float64_loops(gen: torch.Generator) -> None:
    x = torch.randn(3, 40, generator=gen) * torch.tensor([[1.0], [30.0], [0.01]])
    g = torch.tensor([f32(30.0 * 4 / 2688.0)])
    got = fp4.fake_quantize_nvfp4_activations(x, g)
    gv = g.item()
    for r in range(3):
        for start in range(0, 40, 16):
            group = x[r, start : start + 16].tolist()
            sb, _ = nearest_even(min(max(abs(v) for v in group) / (6 * gv), 448.0), E4M3_POS)
            for j, v in enumerate(group):
                mag, _ = nearest_even(abs(v) / (sb * gv), E2M1_POS) if sb else (0.0, 0)
                expect = math.copysign(mag, v) * sb * gv
                assert got[r, start + j].item() == pytest.approx(expect, rel=1e-6, abs=1e-30), (r, start + j)
    with pytest.raises(ValueError, match="positive"):
        fp4.fake_quantize_nvfp4_activations(x, torch.tensor([0.0]))


# -- MXFP4 RTN ------------------------------------------------------------------------------------


def test_mxfp4_shared_exponent_rule() -> None:
    amaxes = [1.0, 6.0, 7.9, 8.0, 0.0, 2.0**-140, 3.0e38]
    # floor(log2(amax)) - 2 + 127, clamped to 0..254; an all-zero block gets 0
    want = [125, 127, 127, 128, 0, 0, 127 + 127 - 2]
    w = torch.zeros(len(amaxes), 32)
    w[:, 5] = torch.tensor(amaxes)
    t = fp4.quantize(w, MX, g_idx=None, output_sizes=(len(amaxes),), calib=None)
    assert t["scales"][:, 0].tolist() == want
    codes = fp4.unpack_fp4(t["qweight"])[:, 5].tolist()
    # 1 / 2^-2 = 4 -> code 6; 6 -> 7; 7.9 saturates to 6 -> 7; 8 / 2 = 4 -> 6; zero; 2^-13 -> 0;
    # 3e38 / 2^125 = 7.05 saturates -> 7
    assert codes == [6, 7, 7, 6, 0, 0, 7]


def test_mxfp4_rtn_recovers_on_grid_weights_exactly(gen: torch.Generator) -> None:
    n, k = 3, 64
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[:, ::32] = torch.tensor([6, 7, 14, 15], dtype=torch.uint8)[
        torch.randint(0, 4, (n, 2), generator=gen)
    ]
    e = torch.randint(1, 250, (n, 2), generator=gen, dtype=torch.uint8)
    w = torch.tensor(
        [
            [math.ldexp(e2m1_value(int(codes[r, c])), int(e[r, c // 32]) - 127) for c in range(k)]
            for r in range(n)
        ]
    )
    t = fp4.quantize(w, MX, g_idx=None, output_sizes=(n,), calib=None)
    assert torch.equal(t["scales"], e)
    nonzero = w != 0
    assert torch.equal(fp4.unpack_fp4(t["qweight"])[nonzero], codes[nonzero])
    assert torch.equal(fp4.dequantize(weight(MX, n, k, **t)), w)


def test_mxfp4_rtn_bound_and_nearest(gen: torch.Generator) -> None:
    w = rand_w(gen, 5, 64) * 3.0
    t = fp4.quantize(w, MX, g_idx=None, output_sizes=(5,), calib=None)
    codes = fp4.unpack_fp4(t["qweight"])
    d = fp4.dequantize(weight(MX, 5, 64, **t))
    for r in range(5):
        for b in range(2):
            block = w[r, 32 * b : 32 * b + 32].tolist()
            _, ex = math.frexp(max(abs(v) for v in block))
            e = int(t["scales"][r, b])
            assert e == ex - 1 - 2 + 127
            unit = math.ldexp(1.0, e - 127)
            for j, v in enumerate(block):
                x = v / unit
                mag, _ = nearest_even(abs(x), E2M1_POS)
                assert e2m1_value(int(codes[r, 32 * b + j])) == math.copysign(mag, x)
                assert abs(d[r, 32 * b + j].item() - v) <= 2 * unit  # at most the 6..8 saturation gap


# -- the catalog, and bad input -------------------------------------------------------------------

FP4_SCHEMES = [s for s in catalog() if s.family in ("nvfp4", "mxfp4")]


@pytest.mark.parametrize("scheme", FP4_SCHEMES, ids=str)
def test_catalog_round_trip(scheme: Scheme, gen: torch.Generator) -> None:
    assert len(FP4_SCHEMES) == 3
    n, k = 24, 96
    w = rand_w(gen, n, k)
    cw = ref_quantize(w, scheme, calib=rand_w(gen, 4, k))
    specs = canonical_specs(scheme, n, k)
    assert set(cw.tensors) == set(specs)
    for name, spec in specs.items():
        assert (tuple(cw[name].shape), cw[name].dtype) == (spec.shape, spec.dtype), name
    d = ref_dequantize(cw)
    assert d.dtype == torch.float32 and d.shape == (n, k)
    assert 0 < rel_err(d, w) < (0.12 if scheme.family == "nvfp4" else 0.16)
    strided = ref_quantize(w.T.contiguous().T, scheme, calib=rand_w(gen, 4, k))  # a non-contiguous view
    assert torch.equal(ref_dequantize(strided), d)


@pytest.mark.parametrize(("scheme", "k", "block"), [(NV, 24, 16), (MX, 48, 32), (MX, 16, 32)])
def test_k_must_be_a_block_multiple(scheme: Scheme, k: int, block: int) -> None:
    with pytest.raises(ValueError, match=f"K={k} is not a multiple of the block size {block}"):
        fp4.quantize(torch.ones(2, k), scheme, g_idx=None, output_sizes=(2,), calib=None)
    with pytest.raises(ValueError, match=f"K={k} is not a multiple"):
        fp4.dequantize(weight(scheme, 2, k, qweight=torch.zeros(2, k // 2, dtype=torch.uint8)))


def test_bad_inputs_give_clear_errors() -> None:
    with pytest.raises(ValueError, match="2-D"):
        fp4.quantize(torch.ones(32), MX, g_idx=None, output_sizes=(1,), calib=None)
    with pytest.raises(ValueError, match="NaN or Inf"):
        fp4.quantize(torch.full((1, 32), math.inf), MX, g_idx=None, output_sizes=(1,), calib=None)
    with pytest.raises(ValueError, match="g_idx"):
        fp4.quantize(
            torch.ones(1, 32), MX, g_idx=torch.zeros(32, dtype=torch.int32), output_sizes=(1,), calib=None
        )
    with pytest.raises(ValueError, match="do not add up"):
        fp4.quantize(torch.ones(4, 32), NV, g_idx=None, output_sizes=(1, 2), calib=None)
    good = fp4.quantize(torch.ones(4, 32), NV, g_idx=None, output_sizes=(4,), calib=None)
    bad = dict(good, qweight=good["qweight"].T.contiguous())
    with pytest.raises(
        ValueError, match=r"'qweight'.*expected torch.uint8 \[4, 16\], found torch.uint8 \[16, 4\]"
    ):
        fp4.dequantize(weight(NV, 4, 32, **bad))
    with pytest.raises(ValueError, match=r"'scales'.*float8_e4m3fn"):
        fp4.dequantize(weight(NV, 4, 32, **dict(good, scales=good["scales"].view(torch.uint8))))
    with pytest.raises(ValueError, match=r"'global_scale'.*\[2\]"):
        fp4.dequantize(weight(NV, 4, 32, (2, 2), **good))
    with pytest.raises(ValueError, match="missing canonical tensor 'scales'"):
        fp4.dequantize(weight(MX, 4, 32, qweight=good["qweight"]))
    with pytest.raises(ValueError, match="nvfp4 and mxfp4"):
        fp4.quantize(
            torch.ones(1, 64), parse_scheme("w4a16-nf4-g64"), g_idx=None, output_sizes=(1,), calib=None
        )
