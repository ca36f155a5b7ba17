"""What a grouped kernel's ``prepare`` returns: one layout over every expert, and its strategies.

The grouped op computes one output row per assignment of an :class:`~quantrt.moe.batch.ExpertBatch`::

    y[a] = (x[row(a)] @ W[e(a)].T + bias[e(a)]) * (weights[a] if weighted else 1)

``row(a)`` is the token ``a // top_k`` when ``gather`` (the first projection reads token rows) and
``a`` otherwise (the second reads one row per assignment); rows of assignments to experts this
rank does not hold are zero. Strategies are compared by the number of tokens ``M``, as for linear
layers (:mod:`quantrt.prepared`): tile tables per M bucket, a GEMV-like path for decode.

:class:`PreparedExperts` owns the checks every kernel would restate and the shared workspace.
The traced op for torch.compile is one per MoE layer (``quantrt::experts``, in
:mod:`quantrt.moe.layer`), so grouped kernels carry no custom-op plumbing of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..prepared import ALL_M, ordered
from .batch import ExpertBatch

#: ``fn(layout, x, batch, gather, weighted, bias, out, workspace) -> y [A, N]``; ``out`` None or
#: an [A, N] tensor in the output dtype with unit column stride for ``fn`` to fill
ExpertsFn = Callable[
    [Any, torch.Tensor, ExpertBatch, bool, bool, "torch.Tensor | None", "torch.Tensor | None", Any],
    torch.Tensor,
]


@dataclass(frozen=True)
class ExpertsStrategy:
    """One way prepared experts run batches of ``M <= max_m`` tokens."""

    max_m: int
    name: str
    fn: ExpertsFn


@dataclass(frozen=True)
class QuantizedRows:
    """Activations already in a projection's quantized input format, made by its ``activate_into``
    (the gated activation fused with the quantization): ``codes`` [rows, K], ``scales`` as its kernel
    reads them, ``dtype`` the activation dtype they stand for."""

    codes: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dim(self) -> int:
        return self.codes.dim()


def sum_top_k(y: torch.Tensor, batch: ExpertBatch) -> torch.Tensor:
    """Assignment rows [A, N] summed over each token's top_k: [M, N], accumulated in fp32 and
    rounded once to y's dtype."""
    return y.view(batch.M, batch.top_k, y.shape[-1]).sum(dim=1)


class PreparedExperts:
    """Prepared experts: the kernel's layout over all ``E`` experts and its strategies."""

    __slots__ = (
        "E",
        "K",
        "N",
        "_ws_bytes",
        "act_dtypes",
        "activate",
        "activate_into",
        "combine",
        "device",
        "kernel",
        "layout",
        "out_dtype",
        "strategies",
    )

    def __init__(
        self,
        layout: Any,
        strategies: Sequence[ExpertsStrategy],
        *,
        E: int,
        K: int,
        N: int,
        out_dtype: torch.dtype,
        act_dtypes: Sequence[torch.dtype],
        device: torch.device | str = "cpu",
        workspace: Callable[[int], int] | None = None,
        kernel: str = "",
        activate: Callable[[torch.Tensor, Any], torch.Tensor] | None = None,
        combine: ExpertsFn | None = None,
        activate_into: Callable[[torch.Tensor, Any], QuantizedRows] | None = None,
    ) -> None:
        self.layout = layout
        self.strategies = ordered(strategies)  # type: ignore[arg-type]
        self.E, self.K, self.N, self.out_dtype = int(E), int(K), int(N), out_dtype
        self.act_dtypes = tuple(act_dtypes)
        self.device = torch.device(device)
        self._ws_bytes = workspace
        self.kernel = kernel
        #: ``activate(h, activation)``: the gated activation of this projection's output on the
        #: kernel's device in one launch (None: the layer's torch Activation)
        self.activate = activate
        #: ``combine(...)``: as a strategy's ``fn`` (gather False, weighted True), but [M, N]: each
        #: token's top_k rows summed by the kernel's own launches (None: summed by :meth:`combined`)
        self.combine = combine
        #: ``activate_into(h, activation)``: the previous projection's output [rows, 2K] through the
        #: gated activation straight into this projection's quantized input (None: no such fusion)
        self.activate_into = activate_into

    def __call__(
        self,
        x: torch.Tensor,
        batch: ExpertBatch,
        *,
        gather: bool,
        weighted: bool = False,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[A, N]`` rows, one per assignment (see the module docstring)."""
        self._check(x, batch, gather, weighted, bias)
        if out is not None and (out.dim() != 2 or out.shape[0] != batch.A or out.shape[1] != self.N):
            raise ValueError(
                f"{self.kernel}: out must have shape [{batch.A}, {self.N}], found {list(out.shape)}"
            )
        if batch.A == 0:
            return torch.empty(0, self.N, dtype=self.out_dtype, device=self.device) if out is None else out
        s = self.strategy(batch.M)
        ws = None if self._ws_bytes is None else self.workspace(batch.M)
        if out is not None and (out.dtype != self.out_dtype or out.stride(1) != 1):
            return out.copy_(s.fn(self.layout, x, batch, gather, weighted, bias, None, ws))
        return s.fn(self.layout, x, batch, gather, weighted, bias, out, ws)

    def _check(
        self, x: torch.Tensor, batch: ExpertBatch, gather: bool, weighted: bool, bias: torch.Tensor | None
    ) -> None:
        rows = batch.M if gather else batch.A
        if x.dim() != 2 or x.shape[0] != rows or x.shape[1] != self.K or x.dtype not in self.act_dtypes:
            dts = ", ".join(str(d).replace("torch.", "") for d in self.act_dtypes)
            raise ValueError(
                f"{self.kernel}: expected activations [{rows}, {self.K}] in {dts}, found "
                f"{str(x.dtype).replace('torch.', '')} {list(x.shape)}"
            )
        if batch.E != self.E:
            raise ValueError(
                f"{self.kernel}: the batch routes to {batch.E} experts, the layer holds {self.E}"
            )
        if bias is not None and tuple(bias.shape) != (self.E, self.N):
            raise ValueError(f"{self.kernel}: expected a bias [{self.E}, {self.N}], found {list(bias.shape)}")
        if weighted and batch.weights is None:
            raise ValueError(f"{self.kernel}: weighted=True needs the batch's routing weights")

    def combined(
        self, x: torch.Tensor, batch: ExpertBatch, *, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The second projection's output per token, [M, N]: every assignment row of ``x`` (one per
        assignment) weighted by its routing weight and summed over the token's top_k in fp32,
        rounded once; in the kernel's own launches where it offers ``combine``."""
        if self.combine is None or batch.A == 0 or batch.top_k == 1:
            return sum_top_k(self(x, batch, gather=False, weighted=True, bias=bias), batch)
        self._check(x, batch, False, True, bias)
        ws = None if self._ws_bytes is None else self.workspace(batch.M)
        return self.combine(self.layout, x, batch, False, True, bias, None, ws)

    def strategy(self, m: int) -> ExpertsStrategy:
        """The strategy that serves ``m`` tokens."""
        for s in self.strategies:
            if m <= s.max_m:
                return s  # type: ignore[return-value]
        return self.strategies[-1]  # type: ignore[return-value]

    def workspace(self, m: int) -> torch.Tensor | None:
        """Scratch for ``m`` tokens from the per-thread buffer linear layers share."""
        from ..prepared import _buffers, _grow

        if self._ws_bytes is None:
            return None
        need = int(self._ws_bytes(m))
        if not need:
            return None
        buf = _buffers().get(self.device)
        return buf if buf is not None and buf.numel() >= need else _grow(self.device, need)


__all__ = ["ALL_M", "ExpertsFn", "ExpertsStrategy", "PreparedExperts", "QuantizedRows", "sum_top_k"]
