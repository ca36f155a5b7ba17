"""Canonical 4-bit integer weights as AutoAWQ's GEMM layout stores them (also auto-round's and
GPTQModel's AWQ exports), what transformers, vLLM's ``awq``/``awq_marlin`` and AutoAWQ load.

Per layer: ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [K/G, N/8], packed along N with AWQ's
interleave (nibble i of a word holds column ``8c + AWQ_ORDER[i]``), ``scales`` fp16 [K/G, N] (bf16 as GPTQModel writes them, where the scheme's are).
Zero points are stored as they are (no v1 offset); a symmetric scheme stores every one as 8 and
says ``zero_point: false``. The inverse of ``quantrt.formats.awq.AWQAdapter``, tested byte for
byte against the tools' files (``tests/writers``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..canonical import CanonicalWeight
from ..packing import unpack_codes
from ..schemes import Scheme
from .stored import WriterError, exact_scales

#: AutoAWQ's fp16 and GPTQModel's bf16
SCALE_DTYPES = ("fp16", "bf16")
#: the column (within a group of 8) that nibble i of a word holds
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def why_not(scheme: Scheme) -> str | None:
    """Why this writer cannot write the scheme (None: it can)."""
    s = scheme
    if not (s.weight == "int" and s.bits == 4 and s.weight_only and s.granularity in ("group", "channel")):
        return f"{s.name}: AWQ holds 4-bit integer weight-only schemes with group or channel scales"
    if s.act_order:
        return f"{s.name}: AWQ has no act-order"
    if s.scale_dtype not in SCALE_DTYPES:
        return f"{s.name}: AWQ stores fp16 (AutoAWQ) or bf16 (GPTQModel) scales, this scheme's are {s.scale_dtype}"
    return None


def pack_awq(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [R, 8*C] in natural column order -> int32 [R, C] in AWQ's interleaved order."""
    c = codes.to(torch.int32).reshape(codes.shape[0], -1, 8)
    out = c[..., AWQ_ORDER[0]].clone()
    for i in range(1, 8):
        out |= c[..., AWQ_ORDER[i]] << (4 * i)
    return out


def layer_tensors(prefix: str, w: CanonicalWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one layer (full names), from its canonical weight."""
    s = w.scheme
    why = why_not(s)
    if why:
        raise WriterError(f"{prefix}: {why}")
    N, K = w.N, w.K
    G = s.group_size if s.granularity == "group" else K
    if N % 8 or K % G:
        raise WriterError(f"{prefix}: AWQ needs N a multiple of 8 and K of the group size {G}; N={N}, K={K}")
    ng = K // G
    half = exact_scales(w["scales"].reshape(N, ng), s.scale_dtype, f"{prefix}.scales", SCALE_DTYPES)
    zeros = w.get("zeros")
    z = torch.full((N, ng), 8, dtype=torch.int32) if zeros is None else zeros.reshape(N, ng).to(torch.int32)
    codes = unpack_codes(w["qweight"], 4, K)  # [N, K]
    return {
        f"{prefix}.qweight": pack_awq(codes.T.contiguous()).contiguous(),
        f"{prefix}.qzeros": pack_awq(z.T.contiguous().cpu()).contiguous(),
        f"{prefix}.scales": half.T.contiguous(),
    }


def quantization_config(layers: dict[str, Scheme], dense: list[str]) -> dict[str, Any]:
    """``quantization_config`` as transformers' ``AwqConfig`` reads it: one scheme for the model,
    the linear layers left dense in ``modules_to_not_convert``. A channel layer among group ones
    counts as one group, as a reader reads a layer whose K is the group size (its load checks the
    shapes, so a wider one is refused there, never misread)."""
    syms = {s.symmetric for s in layers.values()}
    groups = {s.group_size for s in layers.values() if s.granularity == "group"}
    if len(syms) != 1 or len(groups) > 1:
        raise WriterError(f"AWQ's config holds one scheme; these layers have {len(set(layers.values()))}")
    sym, group = syms.pop(), (groups.pop() if groups else -1)
    return {
        "bits": 4,
        "group_size": group,
        "modules_to_not_convert": sorted(dense) or None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": not sym,
    }
