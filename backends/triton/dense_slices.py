"""Large batches on dequantized weights: the way exllama and vLLM's GGUF path serve prefill.

From a few dozen rows on, a matmul is bound by arithmetic, where cuBLAS on 16-bit weights is
hard to beat; a fused dequantizing kernel only adds work there. So the weight is dequantized
slice by slice (whole rows of W: full-K GEMMs, no accumulation across slices in 16-bit) into a
bounded buffer and cuBLAS multiplies each slice. The slice height is fixed at load from the
tuning table's budget, so the buffer never exceeds it.

The buffer is taken per call from torch's caching allocator, not from the prepared layer's
workspace: that workspace lives as long as its layer, so a large batch would leave every layer
holding a dequantized copy of its weight, which is the memory these kernels exist to save.

A kernel composes its strategies from these functions: its own fused strategies for small
batches, then :func:`dense_strategy` (``max_m`` = ``ALL_M``), all wrapped by :func:`in_act_dtype`::

    strategies = [Strategy(dense_from - 1, "gemv ...", small), dense_strategy(rows, N, dequant)]
    return self.prepared(layout, in_act_dtype(strategies, act, spec.output_dtype), spec, device)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from quantrt.prepared import ALL_M, Strategy, StrategyFn

#: scratch per layer, unless the tuning table says otherwise
DEFAULT_WORKSPACE_MB = 256
#: slice heights are rounded down to this many rows (whole tiles for the dequantizer and cuBLAS)
ROW_ALIGN = 128

#: ``dequant(layout, n0, n1, out) -> w``: rows [n0, n1) of the weight, [n1 - n0, K] in the
#: activation dtype, written into ``out`` (a contiguous [n1 - n0, K] tensor) when it is not None
DequantFn = Callable[[Any, int, int, "torch.Tensor | None"], torch.Tensor]


def slice_rows(N: int, K: int, elem_bytes: int, budget_bytes: int) -> int:
    """Rows of W dequantized per cuBLAS call: as many as the budget holds, whole tiles, at least one tile."""
    rows = budget_bytes // max(1, K * elem_bytes)
    rows = max(ROW_ALIGN, rows // ROW_ALIGN * ROW_ALIGN)
    return min(N, rows)


def budget_bytes(doc: dict[str, Any]) -> int:
    """The scratch a tuning table grants one layer's slice (``dense_workspace_mb``)."""
    return int(doc.get("dense_workspace_mb", DEFAULT_WORKSPACE_MB)) << 20


def rows_for(N: int, K: int, act: torch.dtype, doc: dict[str, Any]) -> int:
    """The slice height for a layer in activation dtype ``act`` under the table's budget."""
    return slice_rows(N, K, torch.finfo(act).bits // 8, budget_bytes(doc))


def dense_linear(
    layout: Any,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    N: int,
    rows: int,
    dequant: DequantFn,
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W produced ``rows`` output rows at a time by ``dequant``; x, bias
    and ``out`` in the activation dtype (one slice buffer per call, reused by every slice)."""
    if rows >= N:
        w = dequant(layout, 0, N, None)
        if out is None:
            return torch.nn.functional.linear(x, w, bias)
        if bias is None:
            return torch.mm(x, w.t(), out=out)
        return torch.addmm(bias, x, w.t(), out=out)
    x = x.contiguous()  # cuBLAS would copy a strided x once per slice otherwise
    y = x.new_empty(x.shape[0], N) if out is None else out
    buf = x.new_empty(rows, x.shape[1])
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        w = dequant(layout, n0, n1, buf[: n1 - n0])
        if bias is None:
            torch.mm(x, w.t(), out=y[:, n0:n1])
        else:
            torch.addmm(bias[n0:n1], x, w.t(), out=y[:, n0:n1])
    return y


def dense_strategy(rows: int, N: int, dequant: DequantFn) -> Strategy:
    """The strategy that serves every batch above the fused ones (``max_m`` = ``ALL_M``): W
    dequantized ``rows`` rows at a time by ``dequant``, each slice multiplied by cuBLAS.

    Its ``fn`` expects x, bias and ``out`` in the activation dtype: wrap the list with
    :func:`in_act_dtype`."""

    def fn(
        layout: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
    ) -> torch.Tensor:
        return dense_linear(layout, x, bias, out, N, rows, dequant)

    return Strategy(ALL_M, f"dequant+cuBLAS (N slices of {rows})", fn)


def in_act_dtype(strategies: Sequence[Strategy], act: torch.dtype, out_dtype: torch.dtype) -> list[Strategy]:
    """The strategies with their inputs cast to the layer's activation dtype ``act`` (a call may
    pass another accepted dtype) and their result in ``out_dtype``: each ``fn`` then sees x, bias
    and ``out`` in ``act`` only (``out`` None when ``out_dtype`` differs; the result is cast)."""
    return [Strategy(s.max_m, s.name, _cast(s.fn, act, out_dtype)) for s in strategies]


def _cast(fn: StrategyFn, act: torch.dtype, out_dtype: torch.dtype) -> StrategyFn:
    if out_dtype == act:

        def same(layout: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
            if x.dtype != act:
                x = x.to(act)
            if bias is not None and bias.dtype != act:
                bias = bias.to(act)
            return fn(layout, x, bias, out, ws)

        return same

    def other(layout: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        if x.dtype != act:
            x = x.to(act)
        if bias is not None and bias.dtype != act:
            bias = bias.to(act)
        y = fn(layout, x, bias, None, ws).to(out_dtype)
        return y if out is None else out.copy_(y)

    return other
