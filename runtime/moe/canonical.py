"""Stacked expert weights: E experts' canonical tensors with a leading expert dim.

Every expert of one MoE projection shares a scheme and a shape, so the experts stack: each
canonical tensor of :mod:`quantrt.canonical` gains a leading dim of ``E`` (``qweight`` uint8
[E, N, K*b/8], ``scales`` [E, N, K/G] ...). A grouped kernel prepares from this; a kernel that
runs experts one at a time takes :meth:`CanonicalExperts.expert` views. Per-slice tensors of a
fused projection (NVFP4 ``global_scale`` [E, S]) stack the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..canonical import CanonicalWeight
from ..schemes import Scheme


@dataclass
class CanonicalExperts:
    """``E`` experts of one projection in canonical tensors, stacked along a leading dim."""

    scheme: Scheme
    E: int
    N: int
    K: int
    tensors: dict[str, torch.Tensor]
    output_sizes: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.output_sizes:
            self.output_sizes = (self.N,)
        if sum(self.output_sizes) != self.N:
            raise ValueError(f"output_sizes {self.output_sizes} do not add up to N={self.N}")
        for name, t in self.tensors.items():
            if t.dim() == 0 or t.shape[0] != self.E:
                raise ValueError(f"{name}: expected a leading dim of {self.E} experts, found {list(t.shape)}")

    @classmethod
    def stack(cls, experts: Sequence[CanonicalWeight]) -> CanonicalExperts:
        """Stack per-expert canonical weights (same scheme, shape and tensor names)."""
        if not experts:
            raise ValueError("no experts to stack")
        first = experts[0]
        for i, w in enumerate(experts):
            if (w.scheme, w.N, w.K, w.output_sizes) != (first.scheme, first.N, first.K, first.output_sizes):
                raise ValueError(
                    f"expert {i}: {w.scheme} {w.N}x{w.K} {w.output_sizes} differs from expert 0's "
                    f"{first.scheme} {first.N}x{first.K} {first.output_sizes}"
                )
            if set(w.tensors) != set(first.tensors):
                raise ValueError(
                    f"expert {i}: tensors {sorted(w.tensors)} differ from {sorted(first.tensors)}"
                )
        tensors = {name: torch.stack([w.tensors[name] for w in experts]) for name in first.tensors}
        return cls(first.scheme, len(experts), first.N, first.K, tensors, first.output_sizes)

    def expert(self, e: int) -> CanonicalWeight:
        """Expert ``e`` as a canonical weight (views of the stacked tensors)."""
        if not 0 <= e < self.E:
            raise IndexError(f"expert {e} is outside [0, {self.E})")
        return CanonicalWeight(
            self.scheme, self.N, self.K, {k: v[e] for k, v in self.tensors.items()}, self.output_sizes
        )

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(name)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def to(self, device: torch.device | str) -> CanonicalExperts:
        return CanonicalExperts(
            self.scheme,
            self.E,
            self.N,
            self.K,
            {k: v.to(device) for k, v in self.tensors.items()},
            self.output_sizes,
        )

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
