"""TurboQuant's reference pieces against facts quantrt has no part in: the Lloyd-Max quantizer of a
Gaussian (Max 1960's tables), an orthogonal rotation, hand-packed bytes, and the value codec's
definition worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from quantrt.reference import turboquant as tq
from quantrt.schemes import TurboQuantScheme, parse_kv_scheme

# J. Max, "Quantizing for minimum distortion" (1960), Table I: output levels of the optimum
# quantizer of a unit normal, positive half
MAX_1960 = {
    3: [0.2451, 0.7560, 1.3440, 2.1520],
    4: [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326],
}


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_codebook_is_max_1960_scaled(bits: int, d: int) -> None:
    c, b = tq.codebook(d, bits)
    half = (c[2 ** (bits - 1) :] * math.sqrt(d)).tolist()
    assert half == pytest.approx(MAX_1960[bits], abs=1.5e-4)
    assert torch.equal(c, -c.flip(0))  # symmetric
    assert torch.allclose(b, (c[1:] + c[:-1]) / 2)


@pytest.mark.parametrize("d", [2, 64, 256])
def test_rotation_is_orthogonal_and_seeded(d: int) -> None:
    r = tq.rotation(d)
    assert torch.allclose(r @ r.T, torch.eye(d), atol=1e-6)
    assert torch.equal(r.abs(), torch.full((d, d), 1 / math.sqrt(d)))  # a signed Hadamard
    assert not torch.equal(r, tq.rotation(d, seed=1))


def test_pack_bits_by_hand() -> None:
    assert tq.pack_bits(torch.tensor([1, 2, 15, 0]), 4).tolist() == [0x21, 0x0F]
    codes = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0])
    word = sum(int(c) << (3 * i) for i, c in enumerate(codes))
    assert tq.pack_bits(codes, 3).tolist() == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    g = torch.Generator().manual_seed(0)
    for bits in (3, 4):
        c = torch.randint(0, 2**bits, (5, 3, 64), generator=g)
        assert torch.equal(tq.unpack_bits(tq.pack_bits(c, bits), bits), c)


def test_values_by_hand() -> None:
    s = TurboQuantScheme(4, 4, True)
    x = torch.tensor([[0.0, 1.5, 3.0, 0.7] * 2])  # one head of 8: lo 0, hi 3 -> scale 0.2
    p = tq.quantize_values(x, s)
    scale = torch.tensor(3.0 / 15).half()
    assert p["v_scale"].item() == scale.item() and p["v_zero"].item() == 0.0
    q = [math.floor(v / scale.float().item() + 0.5) for v in [0.0, 1.5, 3.0, 0.7]]
    assert tq.unpack_bits(p["v"], 4).tolist() == [q * 2]
    flat = torch.full((1, 8), -2.0)
    p = tq.quantize_values(flat, s)  # no range: scale 0, every code 0, read back exactly
    assert p["v_scale"].item() == 0 and torch.equal(tq.dequantize_values(p, s), flat)


@pytest.mark.parametrize("name", ["kv-tq-4bit-nc", "kv-tq-k3v4-nc", "kv-tq-3bit-nc", "kv-tq-k4v4"])
def test_keys_by_definition(name: str) -> None:
    s = parse_kv_scheme(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 2, 64, generator=g) * 3
    x[0, 0] = 0.0
    p = tq.quantize_keys(x, s)
    c, b = tq.codebook(64, s.key_bits)
    norm = x.norm(dim=-1)
    y = torch.where(norm[..., None] > 0, x / norm.clamp_min(1e-30)[..., None], 0.0) @ tq.rotation(64)
    idx = (y[..., None] >= b).sum(-1)  # how many boundaries lie at or below y
    assert torch.equal(tq.unpack_bits(p["k"], s.key_bits), idx)
    want = norm / c[idx].norm(dim=-1) if s.norm_correction else norm
    assert torch.equal(p["k_norm"], want.half())
    k = tq.dequantize_keys(p, s, 64)
    if s.norm_correction:  # read back with the written norm (to fp16)
        assert torch.allclose(k.norm(dim=-1), norm.half().float(), rtol=2e-3, atol=1e-6)
    assert float((k - x).norm() / x.norm()) < (0.12 if s.key_bits == 4 else 0.22)


def test_head_dim_limits() -> None:
    assert "power-of-two" in tq.check_head_dim(TurboQuantScheme(4, 4, True), 96)
    assert "multiple of 8" in tq.check_head_dim(TurboQuantScheme(8, 3), 20)
    assert tq.check_head_dim(TurboQuantScheme(8, 4), 80) is None
    with pytest.raises(ValueError, match="power-of-two"):
        tq.quantize_keys(torch.randn(2, 1, 96), TurboQuantScheme(4, 4, True))
