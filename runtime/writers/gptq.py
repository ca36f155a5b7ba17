"""Canonical integer weights as GPTQ stores them (AutoGPTQ / GPTQModel / auto-round's GPTQ export),
the layout vLLM's ``gptq``/``gptq_marlin``, transformers and GPTQModel load.

Per layer: ``qweight`` int32 [K*b/32, N] (each column's codes LSB-first along K), ``qzeros``
int32 [K/G, N*b/32] (zero points packed along N, stored as ``z - 1``: the v1 convention every
GPTQ reader applies), ``scales`` fp16 [K/G, N], ``g_idx`` int32 [K] (``k // G``; no act-order).
Symmetric schemes store every zero point as ``2^(b-1)``. The inverse of
``quantrt.formats.gptq.GPTQAdapter``, tested byte for byte against the tools' files
(``tests/writers``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..canonical import CanonicalWeight
from ..packing import pack_int32
from ..schemes import Scheme
from .stored import WriterError, exact_scales, words_along_k

#: the v1 convention: qzeros hold each zero point minus one
ZERO_OFFSET = 1


def why_not(scheme: Scheme) -> str | None:
    """Why this writer cannot write the scheme (None: it can)."""
    s = scheme
    if not (s.weight == "int" and s.bits in (2, 3, 4, 8) and s.weight_only):
        return f"{s.name}: GPTQ holds 2/3/4/8-bit integer weight-only schemes"
    if s.granularity not in ("group", "channel"):
        return f"{s.name}: GPTQ holds group or channel scales"
    if s.act_order:
        return f"{s.name}: act-order is not written yet"
    if s.scale_dtype != "fp16":
        return f"{s.name}: GPTQ stores fp16 scales, this scheme's are {s.scale_dtype}"
    return None


def layer_tensors(prefix: str, w: CanonicalWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one layer (full names), from its canonical weight."""
    s = w.scheme
    why = why_not(s)
    if why:
        raise WriterError(f"{prefix}: {why}")
    N, K, b = w.N, w.K, s.bits
    G = s.group_size if s.granularity == "group" else K
    ng = -(-K // G)
    half = exact_scales(w["scales"].reshape(N, ng), "fp16", f"{prefix}.scales")
    zeros = w.get("zeros")
    z = (
        torch.full((N, ng), 1 << (b - 1), dtype=torch.int32)
        if zeros is None
        else zeros.reshape(N, ng).to(torch.int32)
    )
    if bool((z < ZERO_OFFSET).any()):
        raise WriterError(f"{prefix}.qzeros: a zero point of 0 has no GPTQ v1 code (stored as z - 1)")
    return {
        f"{prefix}.qweight": words_along_k(w["qweight"]).T.contiguous(),
        f"{prefix}.qzeros": pack_int32((z - ZERO_OFFSET).T.contiguous().cpu(), b, 1).contiguous(),
        f"{prefix}.scales": half.T.contiguous(),
        f"{prefix}.g_idx": (torch.arange(K, dtype=torch.int32) // G).contiguous(),
    }


def quantization_config(layers: dict[str, Scheme], dense: list[str]) -> dict[str, Any]:
    """``quantization_config`` for these layers. GPTQ's config holds one scheme (per-layer
    differences would need GPTQModel's ``dynamic``, not written); a channel layer among group ones
    counts as one group, as a reader reads a layer whose K is the group size (its load checks the
    shapes, so a layer wider than the group is refused there, never misread)."""
    kinds = {(s.bits, s.symmetric) for s in layers.values()}
    groups = {s.group_size for s in layers.values() if s.granularity == "group"}
    if len(kinds) != 1 or len(groups) > 1:
        raise WriterError(f"GPTQ's config holds one scheme; these layers have {len(set(layers.values()))}")
    (bits, sym), group = kinds.pop(), (groups.pop() if groups else -1)
    return {
        "bits": bits,
        "checkpoint_format": "gptq",
        "desc_act": False,
        "group_size": group,
        "lm_head": "lm_head" in layers,
        "quant_method": "gptq",
        "sym": sym,
        "true_sequential": True,
    }
