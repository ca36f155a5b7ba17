"""Calls at decode sizes from bound launches: a strategy's first call at a batch size launches
through :class:`.launch.Launcher` from tensors laid out in the shared workspace
(``quantrt.prepared``: one buffer per thread and device, stream-ordered like a cuBLAS workspace)
and binds the launch (:meth:`.launch.Launcher.bind`); every later call of that size passes raw
addresses (x's, the workspace's, the output's, the bias's; the layer's own are fixed at bind time),
so it pays none of Triton's per-call specialization and key building, none of the driver's pointer
queries, and no scratch allocation: host time an eager decode step pays per layer (issue 26's
target is 1.3x F.linear).

What a bound launch fixed is what a call checks before taking it (:func:`plain`): x contiguous and
16-byte aligned in the dtype it was bound with (:func:`key`), the bias (if any) of the bound dtype,
contiguous and aligned, ``out`` (if any) contiguous and aligned. Anything else, and batches above
:data:`BOUND_M`, take the strategy's checked path, which is also where the interpreter and
launchers that cannot bind stay. Bound launches skip Triton's launch hooks (see
:meth:`.launch.Launcher.bind`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from quantrt.prepared import StrategyFn

from .launch import Call, raw_stream

#: batches up to this many rows run bound (their scratch fits the workspace)
BOUND_M = 256
_ALIGN = 256

#: ``run(x, bias, out, ws) -> y`` of one layer at one batch size (``ws`` None where it needs none)
Runner = Callable[[torch.Tensor, Any, Any, Any], torch.Tensor]
#: byte offsets of the scales and the partials, and the bytes in all
Regions = tuple[int, int, int]


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def regions(M: int, K: int, N: int, scale_groups: int, split_k: int) -> Regions:
    """Byte offsets in the workspace of the scales and the partials, and the bytes in all: the
    codes [M, K] (one byte each) first, then fp32 scales [M, scale_groups], then fp32 split-K
    partials [split_k, M, N] (none without split-K); each region 256-byte aligned."""
    s_off = _up(M * K)
    p_off = _up(s_off + 4 * M * scale_groups)
    return s_off, p_off, p_off + (4 * split_k * M * N if split_k > 1 else 0)


def workspace_fn(
    bounds: Sequence[int],
    configs: Sequence[Any],
    K: int,
    N: int,
    scale_groups: int,
    upto: int = BOUND_M,
) -> Callable[[int], int]:
    """The workspace a layer asks for batches up to m rows: the largest :func:`regions` over every
    batch size up to min(m, BOUND_M, upto), each with the split (``split_k``) of the tile that serves it
    (``configs[i]`` up to ``bounds[i]`` rows; monotonic in m, as ``Prepared.workspace`` needs).
    ``upto``: the last batch size the layer's Triton strategies serve."""

    def need(m: int) -> int:
        m = min(m, BOUND_M, upto)
        best, lo = 0, 0
        for bound, c in zip(bounds, configs):
            if lo >= m:
                break
            rows = min(bound, m)
            best = max(best, regions(rows, K, N, scale_groups, c.split_k)[2])
            lo = bound
        return best

    return need


def plain(x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None) -> bool:
    """x, bias and out as a bound launch takes them: contiguous, on 16-byte boundaries."""
    return (
        x.is_contiguous()
        and not x.data_ptr() % 16
        and (bias is None or (bias.is_contiguous() and not bias.data_ptr() % 16))
        and (out is None or (out.is_contiguous() and not out.data_ptr() % 16))
    )


def key(x: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """What a layer's bound calls are filed under: the batch size and the dtypes of x and bias."""
    return (x.shape[0], x.dtype, None if bias is None else bias.dtype)


#: ``first(layout, x, bias, out, ws) -> (y, runner or None)``: a strategy's binding call, its
#: scratch in the workspace ``ws`` (None where the layer has none); None where this call cannot run
#: bound (the checked path serves it)
FirstFn = Callable[[Any, torch.Tensor, Any, Any, Any], "tuple[torch.Tensor, Runner | None] | None"]


def bound_strategy(first: FirstFn, checked: StrategyFn) -> StrategyFn:
    """A strategy that runs ``checked`` until ``first`` has bound a batch size, then that size's
    :data:`Runner`: one per (M, x dtype, bias dtype) this layer's strategy has seen. The lookup is
    the call's only work beyond the launches (:func:`key`, spelled inline: a function call per call
    is host time)."""
    bound: dict[tuple, Runner] = {}

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        run = bound.get((x.shape[0], x.dtype, None if bias is None else bias.dtype))
        if run is not None and plain(x, bias, out):
            return run(x, bias, out, ws)
        if x.shape[0] <= BOUND_M and plain(x, bias, out):
            made = first(lay, x, bias, out, ws)
            if made is not None:
                y, run = made
                if run is not None:
                    bound[key(x, bias)] = run
                return y
        return checked(lay, x, bias, out, ws)

    return fn


#: ``pointers(x, bias or None, y, partials, counters) -> the launch's pointer arguments``
Pointers = Callable[[int, "int | None", int, int, int], tuple[int, ...]]


def bind_one(
    call: Call,
    pointers: Pointers,
    *,
    M: int,
    N: int,
    out_dtype: torch.dtype,
    split_k: int = 1,
    tiles: int = 0,
    counters: Any = None,
) -> Runner | None:
    """A :data:`Runner` for one launch just made (its split-K partials at the workspace's start), or
    None where it cannot be bound. ``pointers`` spells its pointer arguments in order from the
    call's addresses (the layer's own are constants there); ``tiles``: its output tiles, whose
    split-K counters ``counters`` holds."""
    b = call.bind(len(pointers(0, None, 0, 0, 0)))
    if b is None:
        return None
    dev, split = b.device, split_k > 1

    def run(x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        y = torch.empty((M, N), dtype=out_dtype, device=dev) if out is None else out
        yp = y.data_ptr()
        part, cnt = (ws.data_ptr(), counters.address(tiles)) if split else (yp, yp)
        b(raw_stream(dev), *pointers(x.data_ptr(), None if bias is None else bias.data_ptr(), yp, part, cnt))
        return y

    return run
