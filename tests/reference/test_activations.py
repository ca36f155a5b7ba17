"""Activation quantization: int8 and fp8 per token, per tensor, per token group; static scales.

Expected values are hand-computed or recomputed in float64 with the fp8 rounding oracle of
conftest.py, group by group.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from quantrt import reference
from quantrt.canonical import CanonicalWeight
from quantrt.reference import activations
from quantrt.schemes import Scheme, catalog, parse_scheme


def _weight(text: str, K: int, **tensors: torch.Tensor) -> CanonicalWeight:
    """A canonical weight carrying only what activation quantization reads (the scheme, K, scales)."""
    return CanonicalWeight(parse_scheme(text), 1, K, dict(tensors) or {"scales": torch.ones(1)})


def test_int8_per_token_hand() -> None:
    # Row 0: amax 127 -> s = 1; round half to even: -0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    # Row 1: amax 254 -> s = 2; 3 / 2 = 1.5 -> 2 -> 4; -5 / 2 = -2.5 -> -2 -> -4.
    # Row 2: all zero -> s = 1, zeros back.
    x = torch.tensor([[127.0, -0.5, 1.5, 2.5], [254.0, 3.0, -5.0, -254.0], [0.0, 0.0, 0.0, 0.0]])
    out = activations.fake_quantize(x, _weight("w8a8-int-ch-sym", 4))
    assert out.tolist() == [[127.0, 0.0, 2.0, 2.0], [254.0, 4.0, -4.0, -254.0], [0.0, 0.0, 0.0, 0.0]]


def test_int8_dynamic_per_tensor_hand() -> None:
    # amax 254 over the whole tensor -> s = 2: 63.5 -> 64 (half to even), 0.5 -> 0, -127, 0.25 -> 0.
    x = torch.tensor([[127.0, 1.0], [-254.0, 0.5]])
    out = activations.fake_quantize(x, _weight("w8a8-int-ch-sym-dyn", 2))
    assert out.tolist() == [[128.0, 0.0], [-254.0, 0.0]]


def test_int8_static_hand() -> None:
    # input_scale 0.5: 100 / .5 = 200 -> 127; -100 / .5 = -200 -> -128; .25 / .5 = .5 -> 0; .75 / .5 = 1.5 -> 2.
    w = _weight("w8a8-int-ch-sym-static", 4, input_scale=torch.tensor([0.5]))
    out = activations.fake_quantize(torch.tensor([[100.0, -100.0, 0.25, 0.75]]), w)
    assert out.tolist() == [[63.5, -64.0, 0.0, 1.0]]


def _fp8_groups_loop(x: torch.Tensor, group: int, fp8_round) -> torch.Tensor:
    """float64 per-token-group fp8 fake quantization, one (row, group) at a time."""
    M, K = x.shape
    out = torch.empty(M, K, dtype=torch.float64)
    for m in range(M):
        for g0 in range(0, K, group):
            seg = x[m, g0 : g0 + group]
            amax = seg.abs().max()
            s = amax / 448 if amax > 0 else torch.tensor(1.0)  # s in fp32, as the scheme computes it
            out[m, g0 : g0 + group] = fp8_round((seg / s).double(), "e4m3") * s.double()
    return out


def test_fp8_per_token(gen: torch.Generator, fp8_round) -> None:
    x = torch.randn(6, 40, generator=gen) * torch.logspace(-3, 3, 6)[:, None]
    x[2] = 0.0
    out = activations.fake_quantize(x, _weight("w8a8-fp8-ch", 40))
    assert torch.equal(out.double(), _fp8_groups_loop(x, 40, fp8_round).float().double())
    assert bool((out[2] == 0).all())


def test_fp8_token_group_ragged(gen: torch.Generator, fp8_round) -> None:
    x = torch.randn(5, 300, generator=gen) * torch.linspace(0.01, 50, 300)  # 300 = 2 x 128 + 44
    x[1, 128:256] = 0.0  # an all-zero group
    w = _weight("w8a8-fp8-block128", 300)
    assert (w.scheme.act_granularity, w.scheme.act_group) == ("token_group", 128)
    out = activations.fake_quantize(x, w)
    assert torch.equal(out.double(), _fp8_groups_loop(x, 128, fp8_round).float().double())
    assert bool((out[1, 128:256] == 0).all())


def test_fp8_dynamic_and_static_per_tensor(gen: torch.Generator, fp8_round) -> None:
    x = torch.randn(4, 24, generator=gen) * 7
    dyn = Scheme("fp8_e4m3", 8, "tensor", scale_dtype="fp32", act="fp8_e4m3", act_granularity="tensor")
    s = x.abs().max() / 448
    out = activations.fake_quantize(x, CanonicalWeight(dyn, 1, 24, {"scales": torch.ones(1)}))
    assert torch.equal(out.double(), (fp8_round((x / s).double(), "e4m3") * s.double()).float().double())
    # A static scale smaller than amax/448 saturates the largest values at +-448 * s.
    s_static = torch.tensor([float(s) / 4])
    w = _weight("w8a8-fp8-tensor-static", 24, input_scale=s_static)
    out = activations.fake_quantize(x, w)
    lim = 448 * s_static.item()
    assert out.abs().max().item() == pytest.approx(lim, rel=1e-6)
    expect = fp8_round((x / s_static).double().clamp(-448, 448), "e4m3") * s_static.double()
    assert torch.equal(out.double(), expect.float().double())


def test_weight_only_passthrough_and_shape_error(gen: torch.Generator) -> None:
    x = torch.randn(3, 8, generator=gen)
    assert torch.equal(activations.fake_quantize(x, _weight("w4a16-int-g4-sym", 8)), x)
    with pytest.raises(ValueError, match=r"must be \[M, 8\], found \[3, 9\]"):
        activations.fake_quantize(torch.randn(3, 9, generator=gen), _weight("w8a8-int-ch-sym", 8))


def test_static_input_scales(gen: torch.Generator) -> None:
    calib = torch.randn(16, 32, generator=gen)
    calib[3, 7] = -9.0  # the largest magnitude
    int8 = activations.static_input_scales(parse_scheme("w8a8-int-tensor-sym-static"), calib, 32)
    fp8s = activations.static_input_scales(parse_scheme("w8a8-fp8-tensor-static"), calib, 32)
    assert int8["input_scale"].tolist() == [pytest.approx(9.0 / 127, rel=1e-7)]
    assert fp8s["input_scale"].tolist() == [pytest.approx(9.0 / 448, rel=1e-7)]
    assert int8["input_scale"].dtype == torch.float32 and int8["input_scale"].shape == (1,)
    zero = activations.static_input_scales(parse_scheme("w8a8-fp8-tensor-static"), torch.zeros(2, 32), 32)
    assert zero["input_scale"].tolist() == [1.0]


def test_static_scheme_needs_calib(gen: torch.Generator) -> None:
    w = torch.randn(8, 32, generator=gen)
    with pytest.raises(ValueError, match=r"static activation scales: pass calib activations \[M, 32\]"):
        reference.quantize(w, "w8a8-fp8-tensor-static")
    with pytest.raises(ValueError, match=r"calib activations must be \[\.\.\., 32\]"):
        reference.quantize(w, "w8a8-int-ch-sym-static", calib=torch.randn(4, 31, generator=gen))
    with pytest.raises(ValueError, match="no static activation scale"):
        activations.static_input_scales(parse_scheme("w8a8-fp8-ch"), torch.ones(1, 32), 32)
    with pytest.raises(ValueError, match="need the input_scale tensor"):
        activations.fake_quantize(torch.ones(1, 8), _weight("w8a8-fp8-tensor-static", 8))


def test_nvfp4_delegates_to_fp4(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
        seen["x"], seen["gs"] = x, input_global_scale
        return x * 2

    mod = types.ModuleType("quantrt.reference.fp4")
    mod.fake_quantize_nvfp4_activations = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "quantrt.reference.fp4", mod)
    monkeypatch.setattr(sys.modules["quantrt.reference"], "fp4", mod, raising=False)
    gs = torch.tensor([3.0])
    w = _weight("w4a4-nvfp4", 16, input_global_scale=gs)
    x = torch.ones(2, 16)
    assert torch.equal(activations.fake_quantize(x, w), x * 2)
    assert seen["gs"] is gs and torch.equal(seen["x"], x)


_ACT_SCHEMES = [s for s in catalog() if s.family in ("int", "fp8") and s.act is not None]


@pytest.mark.parametrize("scheme", _ACT_SCHEMES, ids=str)
def test_catalog_activation_schemes(gen: torch.Generator, rel_err, scheme: Scheme) -> None:
    N, K, M = 32, 256, 8
    w = torch.randn(N, K, generator=gen)
    x = torch.randn(M, K, generator=gen)
    cw = reference.quantize(w, scheme, calib=x)
    xq = reference.quantize_activations(x, cw)
    assert xq.shape == (M, K) and xq.dtype == torch.float32
    assert 0 < rel_err(xq, x) < 0.05  # quantized (not a pass-through), and 8-bit close
    y = reference.linear(x, cw)
    y_dense = x.double() @ w.double().T
    assert rel_err(y, y_dense) < (0.15 if scheme.bits == 4 else 0.06)
    if not scheme.act_dynamic:
        assert set(cw.tensors) >= {"input_scale"} and cw["input_scale"].shape == (1,)
