"""bitsandbytes 4-bit reference: decoders against hand-computed numbers and float64 loops written here,
RTN and double quant against independent nearest-value searches, literal tables and error bounds.

The code books and the dynamic map are literals checked against bitsandbytes 0.50.2 (sources cited
where they appear); no expectation is computed by the code under test.
"""

from __future__ import annotations

import itertools
import math
import struct

import pytest
import torch

from quantrt.canonical import CanonicalWeight, canonical_specs
from quantrt.reference import bnb
from quantrt.reference import dequantize as ref_dequantize
from quantrt.reference import quantize as ref_quantize
from quantrt.schemes import Scheme, catalog, parse_scheme

NF4 = parse_scheme("w4a16-nf4-g64")
NF4_DQ = parse_scheme("w4a16-nf4-g64-dq")
FP4 = parse_scheme("w4a16-bnbfp4-g64")
FP4_DQ = parse_scheme("w4a16-bnbfp4-g64-dq")

# formats.md §3.8, equal to bitsandbytes 0.50.2 functional.get_4bit_type("nf4")
NF4_LITERAL = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip
# bitsandbytes 0.50.2 functional.get_4bit_type("fp4"): this list divided by 12 in fp32. Its "-0" is the
# Python integer -0, so entry 8 is +0.0 in the stored quant_map.
FP4_RAW = [0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3]

# bitsandbytes 0.50.2, bitsandbytes/functional.py::create_dynamic_map(signed=True, max_exponent_bits=7,
# total_bits=8), the map quantize_blockwise uses by default for double quant: all 256 fp32 values in
# order, printed (shortest round-trip form) from that release's function.
DYNAMIC_MAP_LITERAL = """
    -0.99296874 -0.9789063 -0.96484375 -0.9507812 -0.93671876 -0.92265624 -0.9085938 -0.89453125
    -0.8804687 -0.86640626 -0.85234374 -0.8382813 -0.82421875 -0.8101562 -0.79609376 -0.78203124
    -0.7679688 -0.75390625 -0.7398437 -0.72578126 -0.7117188 -0.6976563 -0.68359375 -0.6695312
    -0.65546876 -0.6414063 -0.6273438 -0.61328125 -0.5992187 -0.58515626 -0.5710938 -0.5570313
    -0.54296875 -0.5289062 -0.5148437 -0.50078124 -0.4867187 -0.47265625 -0.45859373 -0.44453126
    -0.43046874 -0.41640624 -0.40234375 -0.38828123 -0.37421876 -0.36015624 -0.34609374 -0.33203125
    -0.31796873 -0.30390626 -0.28984374 -0.27578127 -0.26171875 -0.24765624 -0.23359375 -0.21953125
    -0.20546874 -0.19140625 -0.17734376 -0.16328125 -0.14921875 -0.13515624 -0.12109375 -0.107031256
    -0.09859375 -0.09578126 -0.092968754 -0.09015625 -0.08734375 -0.08453125 -0.08171876 -0.07890625
    -0.07609375 -0.07328125 -0.070468746 -0.067656256 -0.06484375 -0.06203125 -0.059218753 -0.05640625
    -0.05359375 -0.05078125 -0.04796875 -0.04515625 -0.042343747 -0.03953125 -0.036718752 -0.03390625
    -0.03109375 -0.028281251 -0.02546875 -0.02265625 -0.019843752 -0.01703125 -0.01421875 -0.01140625
    -0.00971875 -0.009156249 -0.00859375 -0.00803125 -0.00746875 -0.00690625 -0.00634375 -0.00578125
    -0.0052187503 -0.0046562497 -0.00409375 -0.0035312497 -0.00296875 -0.00240625 -0.00184375
    -0.0012812499 -0.0009437501 -0.00083125 -0.00071875006 -0.0006062501 -0.00049375003 -0.00038125002
    -0.00026875004 -0.00015625001 -8.875e-05 -6.625e-05 -4.375e-05 -2.1249998e-05 -7.75e-06
    -3.2500002e-06 -5.5000004e-07 0.0 5.5000004e-07 3.2500002e-06 7.75e-06 2.1249998e-05 4.375e-05
    6.625e-05 8.875e-05 0.00015625001 0.00026875004 0.00038125002 0.00049375003 0.0006062501
    0.00071875006 0.00083125 0.0009437501 0.0012812499 0.00184375 0.00240625 0.00296875 0.0035312497
    0.00409375 0.0046562497 0.0052187503 0.00578125 0.00634375 0.00690625 0.00746875 0.00803125
    0.00859375 0.009156249 0.00971875 0.01140625 0.01421875 0.01703125 0.019843752 0.02265625
    0.02546875 0.028281251 0.03109375 0.03390625 0.036718752 0.03953125 0.042343747 0.04515625
    0.04796875 0.05078125 0.05359375 0.05640625 0.059218753 0.06203125 0.06484375 0.067656256
    0.070468746 0.07328125 0.07609375 0.07890625 0.08171876 0.08453125 0.08734375 0.09015625
    0.092968754 0.09578126 0.09859375 0.107031256 0.12109375 0.13515624 0.14921875 0.16328125
    0.17734376 0.19140625 0.20546874 0.21953125 0.23359375 0.24765624 0.26171875 0.27578127 0.28984374
    0.30390626 0.31796873 0.33203125 0.34609374 0.36015624 0.37421876 0.38828123 0.40234375 0.41640624
    0.43046874 0.44453126 0.45859373 0.47265625 0.4867187 0.50078124 0.5148437 0.5289062 0.54296875
    0.5570313 0.5710938 0.58515626 0.5992187 0.61328125 0.6273438 0.6414063 0.65546876 0.6695312
    0.68359375 0.6976563 0.7117188 0.72578126 0.7398437 0.75390625 0.7679688 0.78203124 0.79609376
    0.8101562 0.82421875 0.8382813 0.85234374 0.86640626 0.8804687 0.89453125 0.9085938 0.92265624
    0.93671876 0.9507812 0.96484375 0.9789063 0.99296874 1.0
"""


def dynamic_map_literal() -> list[float]:
    return [f32(float(v)) for v in DYNAMIC_MAP_LITERAL.split()]


def f32(x: float) -> float:
    """Round a Python float to the nearest fp32 (what one fp32 operation does to its exact result)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@pytest.fixture
def gen() -> torch.Generator:
    """Seeded per test (defined here so these tests do not depend on another module's fixtures)."""
    return torch.Generator().manual_seed(777)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref||_F / ||ref||_F`` in float64."""
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def table(scheme: Scheme) -> list[float]:
    return NF4_LITERAL if scheme.weight == "nf4" else [f32(v / 12) for v in FP4_RAW]


def half_max_gap(values: list[float]) -> float:
    v = sorted(set(values))
    return max(b - a for a, b in itertools.pairwise(v)) / 2


def nibble(packed: list[int], e: int) -> int:
    """Element e of a bnb buffer: the high nibble holds the even element."""
    byte = packed[e // 2]
    return byte >> 4 if e % 2 == 0 else byte & 0xF


def weight(scheme: Scheme, n: int, k: int, **tensors: torch.Tensor) -> CanonicalWeight:
    return CanonicalWeight(scheme, n, k, dict(tensors))


def assert_nearest(x: float, got: float, values: list[float], tol: float = 1e-6) -> None:
    best = min(abs(v - x) for v in values)
    assert abs(got - x) <= best + tol, (x, got, best)


# -- tables -----------------------------------------------------------------------------------------


def test_code_tables_are_the_published_ones() -> None:
    assert bnb.code_table("nf4").tolist() == NF4_LITERAL
    fp4 = bnb.code_table("fp4_bnb")
    assert fp4.tolist() == [f32(v / 12) for v in FP4_RAW]
    assert fp4.tolist()[:4] == [0.0, f32(0.0625 / 12), f32(2 / 3), 1.0]
    assert not torch.signbit(fp4).tolist()[8]  # bitsandbytes' "-0" is +0.0
    assert fp4.dtype == torch.float32
    with pytest.raises(ValueError, match="nf4 or fp4_bnb"):
        bnb.code_table("int4")


def test_dynamic_map_matches_bitsandbytes_literal() -> None:
    want = dynamic_map_literal()
    assert len(want) == 256 and want[127] == 0.0 and want[255] == 1.0
    got = bnb.dynamic_map()
    assert got.dtype == torch.float32 and got.shape == (256,)
    assert got.tolist() == want  # bit for bit: every literal is an fp32 value


# -- decoding ---------------------------------------------------------------------------------------


def test_byte_0x21_unpacks_high_nibble_first() -> None:
    assert bnb.unpack_bnb4(torch.tensor([0x21], dtype=torch.uint8), 2).tolist() == [2, 1]
    assert bnb.pack_bnb4(torch.tensor([2, 1])).tolist() == [0x21]
    q = torch.tensor([0x21], dtype=torch.uint8)
    absmax = torch.tensor([2.0])
    nf4 = bnb.dequantize(weight(NF4, 1, 2, qweight=q, code=bnb.code_table("nf4"), absmax=absmax))
    assert nf4.tolist() == [[-1.0501461029052734, -1.3923856019973755]]  # NF4[2] * 2, NF4[1] * 2
    fp4 = bnb.dequantize(weight(FP4, 1, 2, qweight=q, code=bnb.code_table("fp4_bnb"), absmax=absmax))
    assert fp4.tolist() == [[f32(8 / 12) * 2, f32(0.0625 / 12) * 2]]


def test_odd_element_count_pads_a_low_nibble() -> None:
    packed = bnb.pack_bnb4(torch.tensor([1, 2, 3]))
    assert packed.tolist() == [0x12, 0x30]
    assert bnb.unpack_bnb4(packed, 3).tolist() == [1, 2, 3]


@pytest.mark.parametrize("scheme", [NF4, FP4], ids=str)
def test_dequant_ragged_matches_float64_loops(scheme: Scheme, gen: torch.Generator) -> None:
    n, k = 5, 27  # 135 elements: blocks of 64, 64 and a ragged 7; an odd count, so a half-used last byte
    q = torch.randint(0, 256, (68,), generator=gen, dtype=torch.uint8)
    absmax = torch.rand(3, generator=gen) * 4
    code = table(scheme)
    w = bnb.dequantize(weight(scheme, n, k, qweight=q, code=torch.tensor(code), absmax=absmax))
    packed, am = q.tolist(), absmax.tolist()
    expect = [f32(code[nibble(packed, e)] * am[e // 64]) for e in range(n * k)]
    assert w.flatten().tolist() == expect


def test_double_quant_dequant_matches_float64_loops(gen: torch.Generator) -> None:
    n, k = 72, 260  # 18720 elements -> 293 absmax (292 full blocks and a ragged one) -> 2 nested blocks
    nb = -(-n * k // 64)
    assert nb == 293
    q = torch.randint(0, 256, (n * k // 2,), generator=gen, dtype=torch.uint8)
    codes8 = torch.randint(0, 256, (nb,), generator=gen, dtype=torch.uint8)
    nested_absmax = torch.tensor([0.75, 0.03125])
    offset = torch.tensor([0.8125])
    dmap = dynamic_map_literal()
    w = bnb.dequantize(
        weight(
            NF4_DQ,
            n,
            k,
            qweight=q,
            code=torch.tensor(NF4_LITERAL),
            absmax=codes8,
            nested_absmax=nested_absmax,
            nested_code=torch.tensor(dmap),
            offset=offset,
        )
    )
    c8, nam = codes8.tolist(), nested_absmax.tolist()
    # bitsandbytes' order in fp32: (nested_code[c] * nested_absmax[i // 256]) + offset
    am = [f32(f32(dmap[c8[i]] * nam[i // 256]) + offset.item()) for i in range(nb)]
    packed = q.tolist()
    expect = [f32(NF4_LITERAL[nibble(packed, e)] * am[e // 64]) for e in range(n * k)]
    assert w.flatten().tolist() == expect


# -- RTN --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [NF4, FP4], ids=str)
def test_rtn_ragged_last_block_and_nearest_codes(scheme: Scheme, gen: torch.Generator) -> None:
    n, k = 5, 27
    w = torch.randn(n, k, generator=gen)
    w.view(-1)[128:] *= 0.01  # the ragged block is much smaller: it must get its own absmax
    t = bnb.quantize(w, scheme, g_idx=None, output_sizes=(n,), calib=None)
    assert set(t) == {"qweight", "code", "absmax"}
    assert t["qweight"].shape == (68,) and t["qweight"][-1].item() & 0xF == 0
    flat = w.flatten().tolist()
    want_absmax = [max(abs(v) for v in flat[i : i + 64]) for i in range(0, 135, 64)]
    assert t["absmax"].tolist() == want_absmax
    code = table(scheme)
    assert t["code"].tolist() == code
    packed = t["qweight"].tolist()
    for e, v in enumerate(flat):
        assert_nearest(v / want_absmax[e // 64], code[nibble(packed, e)], code)
    d = bnb.dequantize(weight(scheme, n, k, **t))
    bound = [half_max_gap(code) * want_absmax[e // 64] * (1 + 1e-6) for e in range(n * k)]
    assert ((d - w).abs().flatten() <= torch.tensor(bound)).all()


@pytest.mark.parametrize("scheme", [NF4, FP4], ids=str)
def test_rtn_recovers_on_grid_weights_exactly(scheme: Scheme, gen: torch.Generator) -> None:
    code = table(scheme)
    top = code.index(1.0)
    idx = torch.randint(0, 16, (4, 64), generator=gen)
    idx[:, 5] = top  # every block (one row of 64 here) reaches +1, so absmax is recovered exactly
    scale = [2.0**-3, 1.0, 2.0**5, 2.0**-20]  # powers of two: w / absmax is exactly the code value
    w = torch.tensor([[code[int(i)] * scale[r] for i in idx[r]] for r in range(4)])
    t = bnb.quantize(w, scheme, g_idx=None, output_sizes=(4,), calib=None)
    assert t["absmax"].tolist() == scale
    got = bnb.unpack_bnb4(t["qweight"], 256).view(4, 64)
    assert [[code[int(c)] for c in row] for row in got] == [[code[int(i)] for i in row] for row in idx]
    assert torch.equal(bnb.dequantize(weight(scheme, 4, 64, **t)), w)


def test_rtn_ties_go_to_the_lower_value() -> None:
    # fp32-exact midpoints of neighbouring entries (absmax 1, so w / absmax is exact)
    cases = [
        (NF4, 0.03979014977812767, 7),  # between NF4[7] = 0 and NF4[8]: lower is 0
        (NF4, -0.045525018125772476, 6),  # between NF4[6] and NF4[7] = 0: lower is NF4[6]
        (NF4, -0.4599952697753906, 2),  # between NF4[2] and NF4[3]
        (FP4, 0.0026041667442768812, 0),  # between 0 and 0.0625/12: zero, always code 0
        (FP4, -0.0026041667442768812, 9),  # between -0.0625/12 and 0: the lower is -0.0625/12
        (FP4, 0.0, 0),
        (FP4, -0.0, 0),
    ]
    for scheme, x, want in cases:
        assert f32(x) == x
        w = torch.tensor([[1.0, x]])
        t = bnb.quantize(w, scheme, g_idx=None, output_sizes=(1,), calib=None)
        assert bnb.unpack_bnb4(t["qweight"], 2).tolist()[1] == want, (scheme, x)


def test_all_zero_block() -> None:
    w = torch.zeros(2, 64)
    w[1, 3] = 0.5
    for scheme, zero in ((NF4, 7), (FP4, 0)):
        t = bnb.quantize(w, scheme, g_idx=None, output_sizes=(2,), calib=None)
        assert t["absmax"].tolist() == [0.0, 0.5]
        assert (bnb.unpack_bnb4(t["qweight"], 64) == zero).all()
        assert torch.equal(bnb.dequantize(weight(scheme, 2, 64, **t)), w)


@pytest.mark.parametrize("scheme", [NF4_DQ, FP4_DQ], ids=str)
def test_double_quant_over_two_nested_blocks(scheme: Scheme, gen: torch.Generator) -> None:
    n, k = 72, 260  # 293 absmax values: a full nested block of 256 and a ragged one of 37
    w = torch.randn(n, k, generator=gen) * (1 + torch.rand(n, 1, generator=gen) * 3)
    t = bnb.quantize(w, scheme, g_idx=None, output_sizes=(n,), calib=None)
    assert {name: (tuple(v.shape), v.dtype) for name, v in t.items()} == {
        "qweight": ((n * k // 2,), torch.uint8),
        "code": ((16,), torch.float32),
        "absmax": ((293,), torch.uint8),
        "nested_absmax": ((2,), torch.float32),
        "nested_code": ((256,), torch.float32),
        "offset": ((1,), torch.float32),
    }
    dmap = dynamic_map_literal()
    assert t["nested_code"].tolist() == dmap
    flat = w.flatten().tolist()
    absmax = [max(abs(v) for v in flat[i : i + 64]) for i in range(0, n * k, 64)]
    offset = t["offset"].item()
    assert offset == pytest.approx(sum(absmax) / len(absmax), rel=1e-6)
    centred = [f32(a - offset) for a in absmax]
    nested = [max(abs(c) for c in centred[i : i + 256]) for i in range(0, 293, 256)]
    assert t["nested_absmax"].tolist() == nested
    c8 = t["absmax"].tolist()
    for i, c in enumerate(centred):
        assert_nearest(c / nested[i // 256], dmap[c8[i]], dmap)
    # error: the 4-bit step around the true absmax plus the absmax's own 8-bit error
    am_err = [half_max_gap(dmap) * nested[i // 256] * (1 + 1e-5) for i in range(293)]
    d = bnb.dequantize(weight(scheme, n, k, **t)).flatten()
    code_gap = half_max_gap(table(scheme))
    bound = torch.tensor([code_gap * absmax[e // 64] + am_err[e // 64] + 1e-6 for e in range(n * k)])
    assert ((d - w.flatten()).abs() <= bound).all()
    assert rel_err(d, w.flatten()) < 0.17


# -- the catalog, and bad input ---------------------------------------------------------------------

BNB_SCHEMES = [s for s in catalog() if s.family == "bnb4"]


@pytest.mark.parametrize("scheme", BNB_SCHEMES, ids=str)
def test_catalog_round_trip(scheme: Scheme, gen: torch.Generator) -> None:
    assert len(BNB_SCHEMES) == 4
    n, k = 96, 201  # 19296 elements: a ragged last block, and 302 absmax over two nested blocks
    w = torch.randn(n, k, generator=gen)
    cw = ref_quantize(w, scheme)
    specs = canonical_specs(scheme, n, k)
    assert set(cw.tensors) == set(specs)
    for name, spec in specs.items():
        assert (tuple(cw[name].shape), cw[name].dtype) == (spec.shape, spec.dtype), name
    d = ref_dequantize(cw)
    assert d.dtype == torch.float32 and d.shape == (n, k)
    assert 0 < rel_err(d, w) < (0.12 if scheme.weight == "nf4" else 0.17)
    assert torch.equal(ref_dequantize(ref_quantize(w.T.contiguous().T, scheme)), d)  # a non-contiguous view


def test_bad_inputs_give_clear_errors() -> None:
    with pytest.raises(ValueError, match="2-D"):
        bnb.quantize(torch.ones(64), NF4, g_idx=None, output_sizes=(1,), calib=None)
    with pytest.raises(ValueError, match="NaN or Inf"):
        bnb.quantize(torch.full((1, 64), math.nan), NF4, g_idx=None, output_sizes=(1,), calib=None)
    with pytest.raises(ValueError, match="g_idx"):
        bnb.quantize(
            torch.ones(1, 64), NF4, g_idx=torch.zeros(64, dtype=torch.int32), output_sizes=(1,), calib=None
        )
    good = bnb.quantize(torch.randn(3, 40), NF4_DQ, g_idx=None, output_sizes=(3,), calib=None)
    with pytest.raises(ValueError, match=r"'qweight': expected torch.uint8 \[60\], found torch.uint8 \[59\]"):
        bnb.dequantize(weight(NF4_DQ, 3, 40, **dict(good, qweight=good["qweight"][:59])))
    with pytest.raises(ValueError, match=r"'absmax': expected torch.uint8 \[2\], found torch.float32"):
        bnb.dequantize(weight(NF4_DQ, 3, 40, **dict(good, absmax=good["absmax"].float())))
    with pytest.raises(ValueError, match="missing canonical tensor 'nested_code'"):
        bnb.dequantize(weight(NF4_DQ, 3, 40, **{k: v for k, v in good.items() if k != "nested_code"}))
    with pytest.raises(ValueError, match=r"'absmax': expected torch.float32 \[2\]"):
        bnb.dequantize(weight(NF4, 3, 40, **good))
    with pytest.raises(ValueError, match="nf4 and fp4_bnb"):
        bnb.dequantize(weight(parse_scheme("w4a16-mxfp4"), 3, 64, **good))
