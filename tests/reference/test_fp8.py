"""FP8 weights: edge encodings, the reference dequant and the RTN quantizer.

Expected values come from hand arithmetic, float64 loops and a float64 fp8 rounding oracle
(``fp8_round`` in conftest.py) built from the format definitions, not from torch's fp8 casts.
"""

from __future__ import annotations

import math

import pytest
import torch

from quantrt import reference
from quantrt.canonical import CanonicalWeight
from quantrt.reference import fp8
from quantrt.schemes import Scheme, catalog, parse_scheme


def _bytes(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.uint8).view(dtype)


def test_e4m3_edge_codes_dequant() -> None:
    # 0x7E = +448 (max), 0xFE = -448, 0x01 = 2^-9 (smallest subnormal), 0x81 = -2^-9,
    # 0x7F / 0xFF = NaN (e4m3fn has no infinities), 0x38 = 1.0, 0x00 = 0; scale 2.
    q = _bytes([0x7E, 0xFE, 0x01, 0x81, 0x7F, 0xFF, 0x38, 0x00], torch.float8_e4m3fn)
    cw = CanonicalWeight(
        parse_scheme("w8a16-fp8-tensor"), 1, 8, {"qweight": q, "scales": torch.tensor([2.0])}
    )
    got = fp8.dequantize(cw)[0].tolist()
    expect = [896.0, -896.0, 2.0**-8, -(2.0**-8), math.nan, math.nan, 2.0, 0.0]
    for g, e in zip(got, expect):
        assert (math.isnan(g) and math.isnan(e)) or g == e


def test_e5m2_edge_codes_dequant() -> None:
    # 0x7B = 57344 (max), 0xFB = -57344, 0x01 = 2^-16, 0x3C = 1.0, 0x7E = NaN; scale 0.5.
    q = _bytes([0x7B, 0xFB, 0x01, 0x3C, 0x7E], torch.float8_e5m2)
    cw = CanonicalWeight(
        parse_scheme("w8a16-fp8e5m2-ch"), 1, 5, {"qweight": q, "scales": torch.tensor([[0.5]])}
    )
    got = fp8.dequantize(cw)[0].tolist()
    assert got[:4] == [28672.0, -28672.0, 2.0**-17, 0.5] and math.isnan(got[4])


def test_quantize_e4m3_edges_hand() -> None:
    # amax 448 -> scale exactly 1, so the codes are the values rounded to e4m3 (nearest, ties to even):
    # 1.5 * 2^-9 ties between 1 and 2 subnormal steps -> 2^-8; 2^-10 ties between 0 and 2^-9 -> 0;
    # 17 ties between 16 and 18 (step 2 in [16, 32)) -> 16 (even mantissa); 300 -> 288 (step 32).
    w = torch.tensor([[448.0, -448.0, 2.0**-9, 1.0, 1.5 * 2.0**-9, 2.0**-10, 17.0, 300.0]])
    cw = reference.quantize(w, "w8a16-fp8-tensor")
    assert cw["scales"].tolist() == [1.0]
    assert cw["qweight"].dtype == torch.float8_e4m3fn
    assert reference.dequantize(cw)[0].tolist() == [448.0, -448.0, 2.0**-9, 1.0, 2.0**-8, 0.0, 16.0, 288.0]


def test_quantize_e5m2_edges_hand() -> None:
    # amax 57344 -> scale 1; 2^-16 is the smallest subnormal; in [16, 32) the step is 4: 18 ties between
    # 16 and 20 -> 16 (even mantissa), 22 ties between 20 and 24 -> 24; 5 is exact (step 1 in [4, 8)).
    w = torch.tensor([[57344.0, -57344.0, 2.0**-16, 18.0, 22.0, 5.0, 0.0]])
    cw = reference.quantize(w, "w8a16-fp8e5m2-tensor")
    assert cw["scales"].tolist() == [1.0]
    assert cw["qweight"].dtype == torch.float8_e5m2
    assert reference.dequantize(cw)[0].tolist() == [57344.0, -57344.0, 2.0**-16, 16.0, 24.0, 5.0, 0.0]


def test_to_fp8_saturates_and_keeps_nan() -> None:
    x = torch.tensor([1000.0, -1e9, 449.0, float("nan")])
    out = fp8.to_fp8(x, torch.float8_e4m3fn).float()
    assert out[:3].tolist() == [448.0, -448.0, 448.0] and math.isnan(out[3].item())
    assert fp8.to_fp8(torch.tensor([1e6]), torch.float8_e5m2).float().tolist() == [57344.0]


def _check_codes_and_bound(w, cw, s_full, fmt, fp8_round) -> None:
    """Codes equal the oracle's rounding of w/s; dequant error within half an fp8 step."""
    q = cw["qweight"].double()
    assert torch.equal(q, fp8_round((w / s_full).double(), fmt))
    mant, emin = (3, -6) if fmt == "e4m3" else (2, -14)
    dq = reference.dequantize(cw).double()
    # Half a step of the fp8 grid at |w|, in w's units: relative 2^-(mant+1), or the subnormal half step.
    bound = torch.maximum(w.double().abs() * 2.0 ** -(mant + 1), s_full.double() * 2.0 ** (emin - mant - 1))
    assert bool(((dq - w.double()).abs() <= bound * (1 + 1e-6)).all())


def test_block_ragged_200x300(gen: torch.Generator, fp8_round) -> None:
    N, K, bn, bk = 200, 300, 128, 128
    w = torch.randn(N, K, generator=gen) * torch.linspace(0.01, 3.0, K)
    cw = reference.quantize(w, "w8a8-fp8-block128")
    s = cw["scales"]
    assert s.shape == (2, 3) and s.dtype == torch.float32
    s_full = torch.empty(N, K)
    for i in range(2):
        for j in range(3):
            blk = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].double()
            exact = blk.abs().max() / 448
            assert exact <= s[i, j].item() <= exact * (1 + 2**-23)
    for n in range(N):
        for k in range(K):
            s_full[n, k] = s[n // bn, k // bk]
    _check_codes_and_bound(w, cw, s_full, "e4m3", fp8_round)
    expect = cw["qweight"].double() * s_full.double()
    assert torch.equal(fp8.dequantize(cw).double(), expect.float().double())


def test_tensor_three_slices(gen: torch.Generator, fp8_round) -> None:
    sizes = (3, 5, 2)
    w = torch.cat([torch.randn(n, 40, generator=gen) * m for n, m in zip(sizes, (1.0, 100.0, 0.001))])
    cw = reference.quantize(w, "w8a16-fp8-tensor", output_sizes=sizes)
    assert cw["scales"].shape == (3,)
    starts = [0, 3, 8, 10]
    for i in range(3):
        exact = w[starts[i] : starts[i + 1]].double().abs().max() / 448
        assert exact <= cw["scales"][i].item() <= exact * (1 + 2**-23)
    s_full = torch.cat([cw["scales"][i].expand(sizes[i], 40) for i in range(3)])
    _check_codes_and_bound(w, cw, s_full, "e4m3", fp8_round)


@pytest.mark.parametrize("text,fmt", [("w8a16-fp8-ch", "e4m3"), ("w8a16-fp8e5m2-ch", "e5m2")])
def test_channel(gen: torch.Generator, fp8_round, text: str, fmt: str) -> None:
    w = torch.randn(7, 33, generator=gen) * torch.logspace(-4, 3, 7)[:, None]
    w[3] = 0.0  # an all-zero row gets scale 1 and zero codes
    cw = reference.quantize(w, text)
    s = cw["scales"]
    assert s.shape == (7, 1) and s[3, 0].item() == 1.0
    _check_codes_and_bound(w, cw, s.expand(7, 33), fmt, fp8_round)
    assert bool((reference.dequantize(cw)[3] == 0).all())


def test_bf16_scales_are_representable(gen: torch.Generator, fp8_round) -> None:
    scheme = parse_scheme("w8a16-fp8-ch-sbf16")
    assert scheme.scale_dtype == "bf16"
    w = torch.randn(16, 64, generator=gen)
    cw = reference.quantize(w, scheme)
    s = cw["scales"]
    assert torch.equal(s.to(torch.bfloat16).float(), s)
    assert bool((s.double() >= w.double().abs().amax(1, keepdim=True) / 448).all())
    _check_codes_and_bound(w, cw, s.expand(16, 64), "e4m3", fp8_round)


def test_errors(gen: torch.Generator) -> None:
    scheme = parse_scheme("w8a8-fp8-block128")
    with pytest.raises(ValueError, match=r"2-D \[N, K\] weight"):
        reference.quantize(torch.randn(2, 3, 4), scheme)
    with pytest.raises(ValueError, match="no act-order"):
        fp8.quantize(
            torch.randn(4, 8), scheme, g_idx=torch.zeros(8, dtype=torch.int32), output_sizes=(4,), calib=None
        )
    q = torch.zeros(200, 300).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"block scales must have shape \[2, 3\], found \[2, 2\]"):
        fp8.dequantize(CanonicalWeight(scheme, 200, 300, {"qweight": q, "scales": torch.ones(2, 2)}))
    with pytest.raises(ValueError, match=r"qweight must be torch\.float8_e4m3fn"):
        fp8.dequantize(CanonicalWeight(scheme, 200, 300, {"qweight": q.float(), "scales": torch.ones(2, 3)}))


_BOUND = {"fp8_e4m3": 0.04, "fp8_e5m2": 0.08}


@pytest.mark.parametrize("scheme", [s for s in catalog() if s.family == "fp8"], ids=str)
def test_catalog_fp8_schemes(gen: torch.Generator, rel_err, fp8_round, scheme: Scheme) -> None:
    N, K = 160, 272  # ragged against 128x128 blocks
    w = torch.randn(N, K, generator=gen)
    cw = reference.quantize(w, scheme, calib=torch.randn(4, K, generator=gen))
    dq = reference.dequantize(cw)
    assert dq.shape == (N, K) and dq.dtype == torch.float32
    assert rel_err(dq, w) < _BOUND[scheme.weight]
    s = cw["scales"]
    if scheme.granularity == "block":
        s_full = s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    else:
        s_full = s.reshape(-1, 1).expand(N, K) if scheme.granularity == "channel" else s.expand(N, K)
    _check_codes_and_bound(w, cw, s_full, "e4m3" if scheme.weight == "fp8_e4m3" else "e5m2", fp8_round)
