"""Large batches on dequantized weights: the way exllama and vLLM's GGUF path serve prefill.

From a few dozen rows on, a matmul is bound by arithmetic, where cuBLAS on 16-bit weights is
hard to beat; a fused dequantizing kernel only adds work there. So the weight is dequantized
slice by slice (whole rows of W: full-K GEMMs, no accumulation across slices in 16-bit) into a
bounded scratch buffer and cuBLAS multiplies each slice. The slice height is fixed at load from
the declared workspace, so the scratch never exceeds it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from quantrt.kernels import Kernel
from quantrt.specs import LayerSpec

from . import tile_table

#: scratch per layer, unless the tuning table says otherwise
DEFAULT_WORKSPACE_MB = 256
#: slice heights are rounded down to this many rows (whole tiles for the dequantizer and cuBLAS)
ROW_ALIGN = 128


def slice_rows(N: int, K: int, elem_bytes: int, budget_bytes: int) -> int:
    """Rows of W dequantized per cuBLAS call: as many as the budget holds, whole tiles, at least one tile."""
    rows = budget_bytes // max(1, K * elem_bytes)
    rows = max(ROW_ALIGN, rows // ROW_ALIGN * ROW_ALIGN)
    return min(N, rows)


def workspace_bytes(N: int, K: int, elem_bytes: int, budget_bytes: int) -> int:
    """The scratch one call may use: one slice of the dequantized weight."""
    return slice_rows(N, K, elem_bytes, budget_bytes) * K * elem_bytes


def dense_linear(
    x: torch.Tensor,
    N: int,
    rows: int,
    dequant: Callable[[int, int], torch.Tensor],
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W produced ``rows`` output rows at a time by ``dequant(n0, n1)``
    ([n1 - n0, K] in x's dtype)."""
    if rows >= N:
        w = dequant(0, N)
        if out is None:
            return F.linear(x, w, bias)
        if bias is None:
            return torch.mm(x, w.t(), out=out)
        return torch.addmm(bias, x, w.t(), out=out)
    y = torch.empty(x.shape[0], N, dtype=x.dtype, device=x.device) if out is None else out
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        y[:, n0:n1] = F.linear(x, dequant(n0, n1), None if bias is None else bias[n0:n1])
    return y


def budget_bytes(doc: dict[str, Any]) -> int:
    """The scratch a tuning table grants one layer (``dense_workspace_mb``)."""
    return int(doc.get("dense_workspace_mb", DEFAULT_WORKSPACE_MB)) << 20


def rows_for(N: int, K: int, act: torch.dtype, doc: dict[str, Any]) -> int:
    """The slice height for a layer in activation dtype ``act`` under the table's budget."""
    return slice_rows(N, K, torch.finfo(act).bits // 8, budget_bytes(doc))


class DequantSlicesKernel(Kernel):
    """The call path of a kernel with a fused small-batch path and dequant + cuBLAS above it.

    Subclasses name their tuning table (``table``), keep ``act``, ``out_dtype``, ``N`` and
    ``slice_rows`` in their state, and implement ``use_dense``, ``dequant_rows`` and ``small``.
    """

    table: ClassVar[str] = ""

    @abstractmethod
    def use_dense(self, state: Any, m: int) -> bool:
        """Whether a batch of ``m`` rows runs dequant + cuBLAS (a comparison fixed at load)."""

    @abstractmethod
    def dequant_rows(self, state: Any, n0: int, n1: int) -> torch.Tensor:
        """Rows ``n0:n1`` of the weight, [n1 - n0, K] in the activation dtype."""

    @abstractmethod
    def small(
        self, state: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        """The fused path for small batches."""

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        doc = tile_table.load(self.table, "default")
        elem = torch.finfo(spec.act_dtype).bits // 8
        dense = workspace_bytes(spec.N_part, spec.K_part, elem, budget_bytes(doc))
        return max(4 * max_m * spec.N_part, dense)  # the split-K accumulator, or one slice

    def apply(
        self, state: Any, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dtype != state.act:
            x = x.to(state.act)
        if bias is not None and bias.dtype != state.act:
            bias = bias.to(state.act)
        if out is not None and out.dtype != state.act:
            out.copy_(self.apply(state, x, bias, None))  # our dtype first, then the caller's buffer
            return out
        if self.use_dense(state, x.shape[0]):
            y = dense_linear(
                x, state.N, state.slice_rows, lambda n0, n1: self.dequant_rows(state, n0, n1), bias, out
            )
        else:
            y = self.small(state, x, bias, out)
        return y if y.dtype == state.out_dtype else y.to(state.out_dtype)
