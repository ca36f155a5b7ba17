"""Canonical block-fp8 weights as transformers' ``quant_method: fp8`` stores them (DeepSeek-V3's
layout, which vLLM's ``fp8`` and transformers' FineGrainedFP8 load): per layer ``weight`` fp8 e4m3
[N, K] and ``weight_scale_inv`` fp32 [ceil(N/bn), ceil(K/bk)] (despite its name, the multiplier
that dequantizes each block); the config names the block and dynamic activations (per token in
groups of bk). The inverse of ``quantrt.formats.fp8``'s reader, tested byte for byte against
transformers' own files (``tests/writers``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..canonical import CanonicalWeight
from ..schemes import Scheme
from .stored import WriterError


def why_not(scheme: Scheme) -> str | None:
    """Why this writer cannot write the scheme (None: it can)."""
    s = scheme
    ok = (
        s.weight == "fp8_e4m3"
        and s.granularity == "block"
        and s.act == "fp8_e4m3"
        and s.act_dynamic
        and s.act_granularity == "token_group"
        and s.block is not None
        and s.act_group == s.block[1]
    )
    return None if ok else f"{s.name}: quant_method fp8 holds block fp8 with dynamic per-group activations"


def layer_tensors(prefix: str, w: CanonicalWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one layer (full names), from its canonical weight."""
    why = why_not(w.scheme)
    if why:
        raise WriterError(f"{prefix}: {why}")
    return {
        f"{prefix}.weight": w["qweight"].contiguous(),
        f"{prefix}.weight_scale_inv": w["scales"].float().contiguous(),
    }


def quantization_config(layers: dict[str, Scheme], dense: list[str]) -> dict[str, Any]:
    """``quantization_config``: one block shape for every layer, the dense ones not converted."""
    blocks = {tuple(s.block) for s in layers.values()}
    if len(blocks) != 1:
        raise WriterError(f"quant_method fp8 holds one block shape; these layers have {sorted(blocks)}")
    return {
        "activation_scheme": "dynamic",
        "modules_to_not_convert": sorted(dense),
        "quant_method": "fp8",
        "weight_block_size": list(blocks.pop()),
    }
