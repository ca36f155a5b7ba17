"""KV-cache reference: per-tensor and per-head scales, saturating fp8 and int8 storage."""

from __future__ import annotations

import pytest
import torch

from quantrt.reference import kv
from quantrt.schemes import KV_CATALOG, KVCacheScheme, parse_kv_scheme

_QMAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int8": 127.0}
_FMT = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def test_scales_tensor_and_head(gen: torch.Generator) -> None:
    x = torch.randn(2, 5, 3, 8, generator=gen)  # [batch, tokens, kv_heads, head_dim]
    x[1, 4, 2, 7] = 50.0
    x[:, :, 1, :] = 0.0  # head 1 all zero -> scale 1
    for dtype, qmax in _QMAX.items():
        t = kv.kv_scales(x, KVCacheScheme(dtype, "tensor"))
        assert t.dtype == torch.float32 and t.tolist() == [pytest.approx(50.0 / qmax, rel=1e-7)]
        h = kv.kv_scales(x, KVCacheScheme(dtype, "head"))
        assert h.shape == (3,)
        for head in range(3):
            amax = float(x[:, :, head, :].abs().max())
            assert h[head].item() == pytest.approx(amax / qmax if amax else 1.0, rel=1e-7)


def test_e4m3_hand_values() -> None:
    s = KVCacheScheme("fp8_e4m3")
    scale = torch.tensor([0.5])
    x = torch.tensor([[[224.0, -300.0, 0.5, 8.5, 2.0**-10]]])  # [1, 1 head, 5]
    q = kv.quantize_kv(x, s, scale)
    assert q.dtype == torch.float8_e4m3fn
    # /0.5: 448 (max), -600 -> saturates at -448, 1.0, 17 -> 16 (tie to even), 2^-9 (smallest subnormal)
    assert q.float().tolist() == [[[448.0, -448.0, 1.0, 16.0, 2.0**-9]]]
    assert kv.dequantize_kv(q, s, scale).tolist() == [[[224.0, -224.0, 0.5, 8.0, 2.0**-10]]]


def test_int8_hand_values() -> None:
    s = KVCacheScheme("int8", "head")
    scale = torch.tensor([1.0, 2.0])
    x = torch.tensor([[0.5, 1.5, -2.5, 300.0], [3.0, -5.0, -300.0, 1.0]])  # [2 heads, 4]
    q = kv.quantize_kv(x, s, scale)
    assert q.dtype == torch.int8
    # head 0 (s=1): .5 -> 0, 1.5 -> 2, -2.5 -> -2, 300 -> 127; head 1 (s=2): 1.5 -> 2, -2.5 -> -2, -150 -> -128, .5 -> 0
    assert q.tolist() == [[0, 2, -2, 127], [2, -2, -128, 0]]
    assert kv.dequantize_kv(q, s, scale).tolist() == [[0.0, 2.0, -2.0, 127.0], [4.0, -4.0, -256.0, 0.0]]


_STATIC = [
    t for t in KV_CATALOG if isinstance(parse_kv_scheme(t), KVCacheScheme) and not parse_kv_scheme(t).dynamic
]
_DYNAMIC = [
    t for t in KV_CATALOG if isinstance(parse_kv_scheme(t), KVCacheScheme) and parse_kv_scheme(t).dynamic
]


@pytest.mark.parametrize("text", _DYNAMIC)
def test_dynamic_scales_per_token_and_group(gen: torch.Generator, fp8_round, text: str) -> None:
    s = parse_kv_scheme(text)
    x = torch.randn(3, 4, 64, generator=gen) * torch.tensor([0.01, 1.0, 30.0, 1e3])[None, :, None]
    x[1, 2] = 0.0  # an all-zero token head: scale 1
    scale = kv.kv_scales(x, s)
    g = 1 if s.granularity == "token" else 64 // s.group_size
    assert scale.shape == (3, 4, g)
    q = kv.quantize_kv(x, s, scale)
    dq = kv.dequantize_kv(q, s, scale)
    qmax = _QMAX[s.dtype]
    for t in range(3):
        for h in range(4):
            for j in range(g):
                cols = slice(j * 64 // g, (j + 1) * 64 // g)
                amax = float(x[t, h, cols].abs().max())
                sh = scale[t, h, j]
                assert sh.item() == pytest.approx(amax / qmax if amax else 1.0, rel=1e-7)
                y = (x[t, h, cols] / sh).double()
                expect = torch.round(y).clamp(-128, 127) if s.dtype == "int8" else fp8_round(y, _FMT[s.dtype])
                assert torch.equal(q[t, h, cols].double(), expect)
                assert torch.equal(dq[t, h, cols].double(), (expect * sh.double()).float().double())
    with pytest.raises(ValueError, match="expected scales of shape"):
        kv.quantize_kv(x, s, scale[:, :, :1].expand(3, 4, g + 1))


@pytest.mark.parametrize("text", _STATIC)
def test_round_trip_matches_loop(gen: torch.Generator, fp8_round, text: str) -> None:
    s = parse_kv_scheme(text)
    x = torch.randn(3, 4, 6, generator=gen) * torch.tensor([0.01, 1.0, 30.0, 1e3])[None, :, None]
    scale = kv.kv_scales(x, s)
    q = kv.quantize_kv(x, s, scale)
    dq = kv.dequantize_kv(q, s, scale)
    assert dq.dtype == torch.float32 and dq.shape == x.shape
    for h in range(4):
        sh = scale[h if s.granularity == "head" else 0]
        y = x[:, h, :] / sh  # fp32, as the reference divides
        if s.dtype == "int8":
            expect = torch.round(y.double()).clamp(-128, 127)
            assert bool(((dq[:, h, :] - x[:, h, :]).abs() <= sh * 0.5 * (1 + 1e-5)).all())
        else:
            expect = fp8_round(y.double(), _FMT[s.dtype])
        assert torch.equal(q[:, h, :].double(), expect)
        assert torch.equal(dq[:, h, :].double(), (expect * sh.double()).float().double())


def test_per_head_scale_shapes_and_errors(gen: torch.Generator) -> None:
    s = KVCacheScheme("fp8_e4m3", "head")
    x = torch.randn(2, 4, 8, generator=gen)
    scale = kv.kv_scales(x, s)
    q = kv.quantize_kv(x, s, scale)
    assert torch.equal(kv.quantize_kv(x, s, scale.view(4, 1, 1)).view(torch.uint8), q.view(torch.uint8))
    with pytest.raises(ValueError, match="expected 4 scale value"):
        kv.quantize_kv(x, s, torch.ones(3))
    with pytest.raises(ValueError, match="expected 1 scale value"):
        kv.quantize_kv(x, KVCacheScheme("int8"), torch.ones(4))
    with pytest.raises(ValueError, match=r"cache entries must be torch\.float8_e4m3fn"):
        kv.dequantize_kv(q.float(), s, scale)
    with pytest.raises(ValueError, match=r"\[\.\.\., num_kv_heads, head_dim\]"):
        kv.kv_scales(torch.ones(8), s)
