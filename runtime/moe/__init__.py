"""Mixture-of-experts: quantized experts run by grouped kernels, and top-k routing.

- :class:`QuantExperts` (the experts of one layer; transformers' ``experts(hidden, ids, weights)``
  call) and :class:`QuantMoE` (router + experts + shared experts), in :mod:`.layer`;
- :class:`Router` and :func:`route` (softmax/sigmoid scoring, grouped top-k), in :mod:`.routing`;
- :class:`Activation` (silu, gelu, gpt-oss's clamped SwiGLU), in :mod:`.activation`;
- for backends: :class:`CanonicalExperts` (stacked canonical tensors), :class:`ExpertBatch` (one
  call's routing, sorted as kernels need it), :class:`PreparedExperts` and :func:`experts_loop`;
- :func:`experts_reference`, the fp32 oracle.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "QuantExperts": ".layer",
    "QuantMoE": ".layer",
    "expert_range": ".layer",
    "Router": ".routing",
    "route": ".routing",
    "Activation": ".activation",
    "activation_of": ".activation",
    "CanonicalExperts": ".canonical",
    "ExpertBatch": ".batch",
    "PreparedExperts": ".prepared",
    "ExpertsStrategy": ".prepared",
    "experts_loop": ".loop",
    "experts_reference": ".reference",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'quantrt.moe' has no attribute {name!r}")
    return getattr(importlib.import_module(mod, __name__), name)
