"""KV-cache reference for :class:`~quantrt.schemes.KVCacheScheme`: scales, quantize, dequantize.

Keys or values are ``[..., num_kv_heads, head_dim]``. Scales are fp32 multipliers: ``[1]`` per
tensor or ``[num_kv_heads]`` per head, ``amax / qmax`` (448 e4m3, 57344 e5m2, 127 int8), 1 where
amax is 0. The cache stores ``sat(round(x / scale))``: fp8 by a saturating round-to-nearest-even
cast, int8 by round-half-even clamped to [-128, 127]; it reads back ``q * scale``.
"""

from __future__ import annotations

import torch

from ..errors import ReferenceInputError
from ..schemes import KVCacheScheme
from .fp8 import fp8_max, to_fp8

_STORE = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8}


def kv_qmax(scheme: KVCacheScheme) -> float:
    """The largest stored magnitude a scale maps amax onto."""
    return 127.0 if scheme.dtype == "int8" else fp8_max(_STORE[scheme.dtype])


def _check_x(x: torch.Tensor, scheme: KVCacheScheme) -> None:
    if x.dim() < 2:
        raise ReferenceInputError(f"{scheme}: expected [..., num_kv_heads, head_dim], found {list(x.shape)}")


def _broadcast(scale: torch.Tensor, x: torch.Tensor, scheme: KVCacheScheme) -> torch.Tensor:
    """A [1] or [H] scale shaped to broadcast over [..., H, D]; per-head scales may arrive as [H, 1, 1]."""
    s = scale.to(torch.float32).reshape(-1)
    heads = x.shape[-2]
    want = 1 if scheme.granularity == "tensor" else heads
    if s.numel() != want:
        raise ReferenceInputError(
            f"{scheme}: expected {want} scale value(s) for {heads} KV heads, found shape {list(scale.shape)}"
        )
    return s.reshape(()) if scheme.granularity == "tensor" else s.view(heads, 1)


def kv_scales(x: torch.Tensor, scheme: KVCacheScheme) -> torch.Tensor:
    """Scales that map the largest |x| (overall, or per KV head) onto the stored type's max."""
    _check_x(x, scheme)
    a = x.detach().to(torch.float32).abs()
    if scheme.granularity == "tensor":
        amax = a.amax().reshape(1)
    else:
        amax = a.movedim(-2, 0).reshape(x.shape[-2], -1).amax(dim=1)
    return torch.where(amax > 0, amax / kv_qmax(scheme), torch.ones_like(amax))


def quantize_kv(x: torch.Tensor, scheme: KVCacheScheme, scale: torch.Tensor) -> torch.Tensor:
    """The stored cache entries: float8_e4m3fn, float8_e5m2 or int8, saturating."""
    _check_x(x, scheme)
    y = x.to(torch.float32) / _broadcast(scale, x, scheme)
    if scheme.dtype == "int8":
        return torch.round(y).clamp(-128, 127).to(torch.int8)
    return to_fp8(y, _STORE[scheme.dtype])


def dequantize_kv(q: torch.Tensor, scheme: KVCacheScheme, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values read back from the cache: ``q * scale``."""
    _check_x(q, scheme)
    if q.dtype != _STORE[scheme.dtype]:
        raise ReferenceInputError(f"{scheme}: cache entries must be {_STORE[scheme.dtype]}, found {q.dtype}")
    return q.to(torch.float32) * _broadcast(scale, q, scheme)
