"""KV-cache reference for :class:`~quantrt.schemes.KVCacheScheme`: scales, quantize, dequantize.

Keys or values are ``[..., num_kv_heads, head_dim]``. Scales are fp32 multipliers: ``[1]`` per
tensor, ``[num_kv_heads]`` per head, ``[..., num_kv_heads, 1]`` per token and ``[..., num_kv_heads,
head_dim / G]`` per group of G channels; ``amax / qmax`` (448 e4m3, 57344 e5m2, 127 int8), 1 where
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


def _groups(x: torch.Tensor, scheme: KVCacheScheme) -> int:
    """How many scales a token's head holds (dynamic schemes): 1 per token, head_dim / G per group."""
    if scheme.granularity == "token":
        return 1
    if x.shape[-1] % scheme.group_size:
        raise ReferenceInputError(
            f"{scheme}: head_dim {x.shape[-1]} is not a multiple of the group size {scheme.group_size}"
        )
    return x.shape[-1] // scheme.group_size


def _broadcast(scale: torch.Tensor, x: torch.Tensor, scheme: KVCacheScheme) -> torch.Tensor:
    """A scale shaped to broadcast over [..., H, D]; per-head scales may arrive as [H, 1, 1]."""
    s = scale.to(torch.float32)
    heads = x.shape[-2]
    if scheme.dynamic:
        want = (*x.shape[:-1], _groups(x, scheme))
        if tuple(s.shape) != want:
            raise ReferenceInputError(
                f"{scheme}: expected scales of shape {list(want)}, found {list(s.shape)}"
            )
        return s.repeat_interleave(x.shape[-1] // want[-1], dim=-1)
    s = s.reshape(-1)
    want = 1 if scheme.granularity == "tensor" else heads
    if s.numel() != want:
        raise ReferenceInputError(
            f"{scheme}: expected {want} scale value(s) for {heads} KV heads, found shape {list(scale.shape)}"
        )
    return s.reshape(()) if scheme.granularity == "tensor" else s.view(heads, 1)


def kv_scales(x: torch.Tensor, scheme: KVCacheScheme) -> torch.Tensor:
    """Scales that map the largest |x| (overall, per KV head, per token and head, or per group of
    channels) onto the stored type's max."""
    _check_x(x, scheme)
    a = x.detach().to(torch.float32).abs()
    if scheme.granularity == "tensor":
        amax = a.amax().reshape(1)
    elif scheme.granularity == "head":
        amax = a.movedim(-2, 0).reshape(x.shape[-2], -1).amax(dim=1)
    else:
        amax = a.unflatten(-1, (_groups(x, scheme), -1)).amax(dim=-1)
    # a tensor divisor: CUDA torch divides by a Python scalar as a multiply by its reciprocal,
    # which can differ from the CPU's (and the kernels') correctly rounded quotient by one ulp
    qmax = torch.full_like(amax, kv_qmax(scheme))
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


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
