"""The gated activations between an expert's two projections.

The first projection's output holds the gate half then the up half ([A, 2I]: columns [0, I) gate,
[I, 2I) up; gpt-oss's interleaved rows are reordered to this at load). Each activation maps it
to [A, I], computed in fp32 and returned in the input's dtype:

- ``silu``: ``silu(gate) * up`` (SwiGLU: Mixtral, Qwen-MoE, DeepSeek)
- ``gelu``: ``gelu(gate) * up`` (erf), ``gelu_tanh``: the tanh approximation
- ``swigluoai``: gpt-oss's clamped SwiGLU, ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``
  with ``g = clamp(gate, max=limit)`` (alpha 1.702, limit 7.0 in gpt-oss)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KINDS = ("silu", "gelu", "gelu_tanh", "swigluoai")
#: transformers' ``hidden_act`` names -> ours
HF_NAMES = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}


@dataclass(frozen=True)
class Activation:
    """A gated activation, with gpt-oss's constants when ``kind`` is ``swigluoai``."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"activation {self.kind!r}: expected one of {', '.join(KINDS)}")

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """[A, 2I] (gate, up) -> [A, I]."""
        if h.shape[-1] % 2:
            raise ValueError(f"a gated activation needs an even width (gate, up), found {h.shape[-1]}")
        gate, up = h.to(torch.float32).chunk(2, dim=-1)
        if self.kind == "silu":
            y = F.silu(gate) * up
        elif self.kind == "gelu":
            y = F.gelu(gate) * up
        elif self.kind == "gelu_tanh":
            y = F.gelu(gate, approximate="tanh") * up
        else:
            g = gate.clamp(max=self.limit)
            y = (up.clamp(-self.limit, self.limit) + 1) * g * torch.sigmoid(g * self.alpha)
        return y.to(h.dtype)

    def describe(self) -> str:
        return f"swigluoai(alpha={self.alpha}, limit={self.limit})" if self.kind == "swigluoai" else self.kind


def activation_of(name: str | Activation) -> Activation:
    """An :class:`Activation` from ours or transformers' name."""
    if isinstance(name, Activation):
        return name
    kind = HF_NAMES.get(name, name)
    return Activation(kind)
