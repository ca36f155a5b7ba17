"""KV-cache scales: where a checkpoint stores k/v scales (an FP8 KV cache), per attention layer.

Tools name them differently; the names are normalised as vLLM does (``maybe_remap_kv_scale_name``):
``...self_attn.k_scale`` (compressed-tensors), ``...self_attn.k_proj.k_scale`` (ModelOpt),
``...self_attn.qkv_proj.k_scale``, ``...self_attn.k_proj.output_scale`` (Quark, FP8 exports),
and the legacy single ``...kv_scale`` (used for both k and v). Scales are multipliers: the cache
stores ``x / scale`` and reads ``q * scale``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointError
from ..schemes import KVCacheScheme

PATTERNS = (
    (re.compile(r"^(?P<attn>.+)\.(?P<kv>[kv])_proj\.(?P=kv)_scale$"), None),  # ModelOpt
    (re.compile(r"^(?P<attn>.+)\.qkv_proj\.(?P<kv>[kv])_scale$"), None),
    (re.compile(r"^(?P<attn>.+)\.(?P<kv>[kv])_proj\.output_scale$"), None),  # Quark / fp8 exports
    (re.compile(r"^(?P<attn>.+)\.(?P<kv>[kv])_scale$"), None),  # compressed-tensors, default
    (re.compile(r"^(?P<attn>.+)\.kv_scale$"), "kv"),  # legacy: one scale for both
)


@dataclass(frozen=True)
class KVCacheScales:
    """One attention layer's KV-cache numerics: the scheme and its k and v scales (fp32)."""

    scheme: KVCacheScheme
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    names: tuple[str, ...]


def find_kv_scales(index: Any, qconfig: dict[str, Any] | None) -> dict[str, KVCacheScales]:
    """Every attention layer's k/v scales, keyed by the attention module's prefix."""
    found: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    for name in index.names():
        for pattern, both in PATTERNS:
            m = pattern.match(name)
            if not m:
                continue
            attn = m.group("attn")
            if both is None and attn.endswith((".k_proj", ".v_proj", ".qkv_proj")):
                continue
            t = index.read(name).float().reshape(-1)
            if t.numel() == 0 or not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
                raise CheckpointError(
                    f"{index.where(name)}: KV-cache scales must be positive and finite, found "
                    f"{t[:4].tolist()}"
                )
            for kv in ("k", "v") if both else (m.group("kv"),):
                found.setdefault(attn, {})[kv] = (name, t)
            break
    out: dict[str, KVCacheScales] = {}
    dtype = _kv_dtype(qconfig)
    for attn, kv in sorted(found.items()):
        if set(kv) != {"k", "v"}:
            missing = ({"k", "v"} - set(kv)).pop()
            raise CheckpointError(
                f"{attn}: a {'k' if missing == 'v' else 'v'} scale is stored but no {missing} scale"
            )
        k, v = kv["k"][1], kv["v"][1]
        gran = "tensor" if k.numel() == 1 and v.numel() == 1 else "head"
        if gran == "head" and k.numel() != v.numel():
            raise CheckpointError(
                f"{attn}: per-head k and v scales differ in length: {k.numel()} vs {v.numel()}"
            )
        out[attn] = KVCacheScales(KVCacheScheme(dtype, gran), k, v, (kv["k"][0], kv["v"][0]))
    return out


def _kv_dtype(qconfig: dict[str, Any] | None) -> str:
    """The cache's element type as the quantization config declares it (fp8 e4m3 by default)."""
    q = dict(qconfig or {})
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    ct = inner.get("kv_cache_scheme")
    if isinstance(ct, dict):
        if ct.get("type", "float") == "int" and int(ct.get("num_bits", 8)) == 8:
            return "int8"
        if ct.get("type", "float") != "float" or int(ct.get("num_bits", 8)) != 8:
            raise CheckpointError(f"kv_cache_scheme {ct} is not an 8-bit KV cache")
        return "fp8_e4m3"
    algo = inner.get("kv_cache_quant_algo")
    if algo is not None and str(algo).upper() not in ("FP8", "NONE"):
        raise CheckpointError(f"kv_cache_quant_algo {algo!r} is not supported (FP8 only)")
    dtype = str(inner.get("kv_cache_dtype", "fp8_e4m3")).lower()
    return "fp8_e5m2" if "e5m2" in dtype else "fp8_e4m3"
