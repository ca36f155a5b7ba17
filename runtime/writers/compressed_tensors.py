"""Canonical weights as compressed-tensors stores them, so llm-compressor's readers (vLLM,
transformers' ``CompressedTensorsConfig``, the compressed-tensors decompressors) load quantrt's
checkpoints.

- ``pack-quantized`` (int 4/8-bit weight-only, group or channel scales, symmetric or with zero
  points): ``weight_packed`` int32 [N, K*b/32] holding the codes ``q + 2^(b-1)`` LSB-first along K
  (the canonical bytes, re-read as little-endian words), ``weight_scale`` [N, K/G] or [N, 1] in
  the scheme's scale dtype, ``weight_zero_point`` int32 packed along N likewise (asymmetric
  only), ``weight_shape`` int64 [N, K].
- ``float-quantized`` (fp8 e4m3 weights, tensor / channel / block scales, dynamic per-token or
  per-group activations or none): ``weight`` fp8 [N, K], ``weight_scale`` [1] / [N, 1] / the block
  grid.

The inverse of ``quantrt.formats.compressed_tensors``'s adapters, tested byte for byte against
checkpoints compressed-tensors itself wrote (``tests/writers``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..canonical import CanonicalWeight
from ..packing import pack_int32
from ..schemes import Scheme
from .stored import WriterError, exact_scales, words_along_k

#: compressed-tensors' version whose layout this writes (the fixtures' tool)
VERSION = "0.20.0"


def _format(s: Scheme) -> str | None:
    if s.weight == "int" and s.bits in (4, 8) and s.weight_only and s.granularity in ("group", "channel"):
        return None if not s.act_order else "act-order is not written yet"
    if s.weight == "fp8_e4m3" and s.granularity in ("tensor", "channel", "block"):
        if s.act is None or (
            s.act == "fp8_e4m3" and s.act_dynamic and s.act_granularity in ("token", "token_group")
        ):
            return None
        return "fp8 activations must be dynamic per token or per group (or none)"
    return f"{s.name}: compressed-tensors writing covers int4/int8 weight-only and fp8 e4m3 weights"


def why_not(scheme: Scheme) -> str | None:
    """Why this writer cannot write the scheme (None: it can)."""
    return _format(scheme)


def format_of(scheme: Scheme) -> str:
    return "pack-quantized" if scheme.weight == "int" else "float-quantized"


def layer_tensors(prefix: str, w: CanonicalWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one layer (full names), from its canonical weight."""
    s = w.scheme
    why = why_not(s)
    if why:
        raise WriterError(f"{prefix}: {why}")
    N, K = w.N, w.K
    if s.weight == "int":
        b = s.bits
        out = {
            f"{prefix}.weight_packed": words_along_k(w["qweight"]).contiguous(),
            f"{prefix}.weight_scale": exact_scales(
                w["scales"].reshape(N, -1), s.scale_dtype, f"{prefix}.weight_scale"
            ),
            f"{prefix}.weight_shape": torch.tensor([N, K], dtype=torch.int64),
        }
        if not s.symmetric:
            out[f"{prefix}.weight_zero_point"] = pack_int32(w["zeros"].to(torch.int32), b, 0).contiguous()
        return out
    scale = w["scales"].float()
    if s.granularity == "channel":
        scale = scale.reshape(N, 1)
    elif s.granularity == "tensor":
        scale = scale.reshape(-1)[:1]
    return {
        f"{prefix}.weight": w["qweight"].contiguous(),
        f"{prefix}.weight_scale": exact_scales(scale, s.scale_dtype, f"{prefix}.weight_scale"),
    }


def _args(s: Scheme) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if s.weight == "int":
        weights = {
            "dynamic": False,
            "group_size": s.group_size if s.granularity == "group" else None,
            "num_bits": s.bits,
            "strategy": s.granularity,
            "symmetric": s.symmetric,
            "type": "int",
        }
        return weights, None
    weights = {
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "strategy": s.granularity,
        "symmetric": True,
        "type": "float",
    }
    if s.granularity == "block":
        weights["block_structure"] = list(s.block)
    act = None
    if s.act is not None:
        group = s.act_granularity == "token_group"
        act = {
            "dynamic": True,
            "group_size": s.act_group if group else None,
            "num_bits": 8,
            "strategy": "group" if group else "token",
            "symmetric": True,
            "type": "float",
        }
    return weights, act


def quantization_config(layers: dict[str, Scheme], dense: list[str]) -> dict[str, Any]:
    """``quantization_config`` for these quantized layers (name -> scheme) with ``dense`` linear
    layers ignored: one group per scheme, targeting ``Linear`` when one scheme covers every
    quantized layer, else the layers by name."""
    schemes: dict[Scheme, list[str]] = {}
    for name, s in layers.items():
        schemes.setdefault(s, []).append(name)
    one = len(schemes) == 1
    groups: dict[str, Any] = {}
    for i, (s, names) in enumerate(schemes.items()):
        weights, act = _args(s)
        groups[f"group_{i}"] = {
            "format": format_of(s),
            "input_activations": act,
            "output_activations": None,
            "targets": ["Linear"] if one else sorted(names),
            "weights": weights,
        }
    formats = {format_of(s) for s in schemes}
    return {
        "config_groups": groups,
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "global_compression_ratio": None,
        "ignore": sorted(dense),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "version": VERSION,
    }
