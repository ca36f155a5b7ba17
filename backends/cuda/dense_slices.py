"""Large batches on dequantized weights: the way exllama and vLLM's GGUF path serve prefill.

From a few dozen rows on, a matmul is bound by arithmetic, where cuBLAS on 16-bit weights is
hard to beat; a fused dequantizing kernel only adds work there. So the weight is dequantized
slice by slice (whole rows of W: full-K GEMMs, no accumulation across slices in 16-bit) into a
bounded scratch buffer and cuBLAS multiplies each slice. The slice height is fixed at load from
the declared workspace, so the scratch never exceeds it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

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
