"""TurboQuant KV-cache reference: rotation, Lloyd-Max codebook, bit packing, quantize, dequantize.

Per token and KV head (``x`` a key or value vector of ``D`` channels), docs/schemes.md bit by bit:

- keys, ``key_bits`` 3 or 4: ``n = ||x||``; ``y = (x / n) @ R`` with ``R = diag(s) H / sqrt(D)``
  (``H`` the Sylvester Hadamard matrix, ``s`` seeded random signs); ``idx[d]`` = how many codebook
  boundaries are <= ``y[d]``; stored: the indices packed, and ``fp16(n)`` (``fp16(n / ||c||)`` with
  norm correction, ``c = centroids[idx]``). Read back: ``stored_norm * (c @ R^T)``.
- keys, ``key_bits`` 8: ``x`` cast to float8_e4m3fn (saturating), unrotated, no scale.
- values: ``lo = min(x)``, ``hi = max(x)``; ``scale = fp16((hi - lo) / (2^b - 1))``, ``zero =
  fp16(lo)``; ``q = clamp(floor((x - zero) / scale + 0.5), 0, 2^b - 1)`` (0 where scale is 0);
  read back ``q * scale + zero``.

Packing: 4 bits two per byte, element ``2j`` in the low nibble of byte ``j``; 3 bits eight per three
bytes, element ``8g + i`` at bits ``3i`` of the little-endian 24-bit word in bytes ``3g..3g+2``.

The codebook is the Lloyd-Max quantizer of N(0, 1/D) (what a rotated unit vector's coordinates
follow), solved with the Gaussian's closed-form integrals rather than a truncated numerical one, so
it is the fixed point itself; vLLM's trapezoid-rule codebook differs from it in the fifth digit.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from ..errors import ReferenceInputError
from ..schemes import TurboQuantScheme
from .fp8 import to_fp8

#: the seed of the rotation's signs (every cache, every layer: the rotation is not a secret)
ROTATION_SEED = 0
_FP16_MAX = 65504.0


def check_head_dim(scheme: TurboQuantScheme, head_dim: int) -> str | None:
    """Why this head_dim cannot hold the scheme, or None."""
    if scheme.key_bits != 8 and (head_dim < 2 or head_dim & (head_dim - 1)):
        return f"{scheme}: rotated keys need a power-of-two head_dim (a Hadamard matrix), found {head_dim}"
    bits = {scheme.value_bits} | ({scheme.key_bits} if scheme.key_bits != 8 else set())
    if 3 in bits and head_dim % 8:
        return f"{scheme}: 3-bit codes pack eight per three bytes, head_dim {head_dim} is not a multiple of 8"
    if head_dim % 2:
        return f"{scheme}: 4-bit codes pack two per byte, head_dim {head_dim} is odd"
    return None


def _check(scheme: TurboQuantScheme, x: torch.Tensor) -> None:
    if x.dim() < 2:
        raise ReferenceInputError(f"{scheme}: expected [..., num_kv_heads, head_dim], found {list(x.shape)}")
    why = check_head_dim(scheme, x.shape[-1])
    if why:
        raise ReferenceInputError(why)


@lru_cache(maxsize=16)
def rotation(head_dim: int, seed: int = ROTATION_SEED) -> torch.Tensor:
    """``R = diag(s) H / sqrt(D)``, fp32 [D, D], orthogonal: keys are rotated as ``x @ R``."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (head_dim,), generator=g).to(torch.float64) * 2 - 1
    return (signs[:, None] * h / math.sqrt(head_dim)).to(torch.float32)


def _phi(t: float) -> float:
    return math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)


def _cdf(t: float) -> float:
    return 0.5 * math.erfc(-t / math.sqrt(2))


@lru_cache(maxsize=8)
def _unit_codebook(bits: int) -> tuple[float, ...]:
    """Lloyd-Max centroids of N(0, 1): each the mean of its cell, cells split at midpoints."""
    n = 2**bits
    c = [-3.0 + 6.0 * (i + 0.5) / n for i in range(n)]
    for _ in range(10000):
        edges = [-math.inf] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [math.inf]
        new = []
        for i in range(n):
            a, b = edges[i], edges[i + 1]
            pa = 0.0 if a == -math.inf else _phi(a)
            pb = 0.0 if b == math.inf else _phi(b)
            mass = (1.0 if b == math.inf else _cdf(b)) - (0.0 if a == -math.inf else _cdf(a))
            new.append((pa - pb) / mass)
        done = max(abs(x - y) for x, y in zip(new, c, strict=True)) < 1e-13
        c = new
        if done:
            break
    return tuple(c)


@lru_cache(maxsize=32)
def codebook(head_dim: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 centroids [2^bits] and boundaries [2^bits - 1] (midpoints) for N(0, 1/head_dim)."""
    c = torch.tensor(_unit_codebook(bits), dtype=torch.float64) / math.sqrt(head_dim)
    return c.to(torch.float32), ((c[1:] + c[:-1]) / 2).to(torch.float32)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (0 <= code < 2^bits) packed to uint8 [..., D * bits / 8]."""
    c = codes.to(torch.int32)
    if bits == 4:
        pairs = c.unflatten(-1, (-1, 2))
        return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    if bits == 3:
        groups = c.unflatten(-1, (-1, 8))
        word = (groups << (torch.arange(8, dtype=torch.int32, device=c.device) * 3)).sum(-1)
        return torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], -1).flatten(-2).to(torch.uint8)
    raise ReferenceInputError(f"pack_bits: {bits}-bit codes are not a TurboQuant layout (3 or 4)")


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack_bits`: int64 codes [..., D]."""
    p = packed.to(torch.int64)
    if bits == 4:
        return torch.stack([p & 0xF, p >> 4], -1).flatten(-2)
    if bits == 3:
        b = p.unflatten(-1, (-1, 3))
        word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        return ((word[..., None] >> (torch.arange(8, device=p.device) * 3)) & 7).flatten(-2)
    raise ReferenceInputError(f"unpack_bits: {bits}-bit codes are not a TurboQuant layout (3 or 4)")


def _fp16(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16)


def quantize_keys(x: torch.Tensor, scheme: TurboQuantScheme) -> dict[str, torch.Tensor]:
    """Keys [..., H, D] -> ``k`` (fp8 [..., H, D], or uint8 codes [..., H, D * bits / 8]) and, for
    rotated keys, ``k_norm`` fp16 [..., H]."""
    _check(scheme, x)
    xf = x.to(torch.float32)
    if scheme.key_bits == 8:
        return {"k": to_fp8(xf, torch.float8_e4m3fn)}
    d = x.shape[-1]
    centroids, bounds = (t.to(x.device) for t in codebook(d, scheme.key_bits))
    norm = torch.linalg.vector_norm(xf, dim=-1)
    unit = torch.where(
        norm[..., None] > 0, xf / norm.clamp_min(torch.finfo(torch.float32).tiny)[..., None], 0.0
    )
    y = unit @ rotation(d).to(x.device)
    idx = torch.searchsorted(bounds, y.contiguous(), right=True)
    if scheme.norm_correction:
        norm = norm / torch.linalg.vector_norm(centroids[idx], dim=-1)
    return {"k": pack_bits(idx, scheme.key_bits), "k_norm": _fp16(norm)}


def dequantize_keys(planes: dict[str, torch.Tensor], scheme: TurboQuantScheme, head_dim: int) -> torch.Tensor:
    """fp32 keys [..., H, D] read back from the cache."""
    if scheme.key_bits == 8:
        return planes["k"].to(torch.float32)
    dev = planes["k"].device
    centroids = codebook(head_dim, scheme.key_bits)[0].to(dev)
    c = centroids[unpack_bits(planes["k"], scheme.key_bits)]
    return planes["k_norm"].to(torch.float32)[..., None] * (c @ rotation(head_dim).to(dev).T)


def quantize_values(x: torch.Tensor, scheme: TurboQuantScheme) -> dict[str, torch.Tensor]:
    """Values [..., H, D] -> ``v`` uint8 codes, ``v_scale`` and ``v_zero`` fp16 [..., H]."""
    _check(scheme, x)
    xf = x.to(torch.float32)
    top = 2**scheme.value_bits - 1
    lo, hi = xf.amin(-1), xf.amax(-1)
    span = hi - lo  # divided by a tensor: correctly rounded on every device (see kv_scales)
    scale, zero = _fp16(span / torch.full_like(span, top)), _fp16(lo)
    s, z = scale.to(torch.float32)[..., None], zero.to(torch.float32)[..., None]
    q = torch.where(s > 0, torch.floor((xf - z) / torch.where(s > 0, s, 1.0) + 0.5), 0.0).clamp(0, top)
    return {"v": pack_bits(q.to(torch.int64), scheme.value_bits), "v_scale": scale, "v_zero": zero}


def dequantize_values(planes: dict[str, torch.Tensor], scheme: TurboQuantScheme) -> torch.Tensor:
    """fp32 values [..., H, D] read back from the cache."""
    q = unpack_bits(planes["v"], scheme.value_bits).to(torch.float32)
    return q * planes["v_scale"].to(torch.float32)[..., None] + planes["v_zero"].to(torch.float32)[..., None]
