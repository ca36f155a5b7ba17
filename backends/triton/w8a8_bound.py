"""W8A8 calls at decode sizes as two bound launches (:mod:`.bound`): the activation quantization,
then the GEMM. A W8A8 call through :class:`.launch.Launcher` pays Triton's per-call
specialization of some twenty arguments twice, plus its checks and its allocations (codes,
scales, split-K partials); bound, it pays two raw launches and the output's allocation. Per-tensor
dynamic activations (a zeroed amax and a third launch) keep the checked path of :mod:`.w8a8_ops`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .bound import Runner, regions
from .launch import Call, raw_stream


def views(
    ws: torch.Tensor,
    M: int,
    K: int,
    N: int,
    scale_groups: int,
    split_k: int,
    codes: torch.dtype,
    stored: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The workspace's regions as tensors for a first (binding) call: the codes as the quantizer
    stores them (uint8 where fp8 bits are built by integer ops, ``stored`` False) and as the GEMM
    reads them, the scales [M, scale_groups] and the partials [split_k, M, N] (None without split)."""
    s_off, p_off, end = regions(M, K, N, scale_groups, split_k)
    read = ws[: M * K].view(codes).view(M, K)
    store = read if stored else ws[: M * K].view(M, K)
    scales = ws[s_off : s_off + 4 * M * scale_groups].view(torch.float32).view(M, scale_groups)
    part = ws[p_off:end].view(torch.float32).view(split_k, M, N) if split_k > 1 else None
    return store, read, scales, part


#: ``pointers(x, codes, scales) -> the quantizer's pointer arguments``
QuantPointers = Callable[[int, int, int], tuple[int, ...]]
#: ``pointers(codes, scales, bias or None, y, partials, counters) -> the GEMM's eight``
GemmPointers = Callable[[int, int, "int | None", int, int, int], tuple[int, ...]]


def bind_pair(
    quant: Call,
    gemm: Call,
    quant_pointers: QuantPointers,
    gemm_pointers: GemmPointers,
    *,
    M: int,
    N: int,
    K: int,
    scale_groups: int,
    out_dtype: torch.dtype,
    split_k: int,
    tiles: int,
    counters: Any,
) -> Runner | None:
    """A :data:`Runner` for two launches just made from :func:`views` of the workspace, or None
    where either cannot be bound. ``quant_pointers`` and ``gemm_pointers`` spell each launch's
    pointer arguments in its order from the call's addresses (the layer's own are constants
    there); ``tiles``: the GEMM's output tiles, whose split-K counters ``counters`` holds."""
    n_quant = len(quant_pointers(0, 0, 0))
    bq, bg = quant.bind(n_quant), gemm.bind(8)
    if bq is None or bg is None:
        return None
    s_off, p_off, _ = regions(M, K, N, scale_groups, split_k)
    dev = bg.device
    stream = raw_stream
    split = split_k > 1

    def run(x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor) -> torch.Tensor:
        y = torch.empty((M, N), dtype=out_dtype, device=dev) if out is None else out
        s = stream(dev)
        base = ws.data_ptr()
        yp = y.data_ptr()
        bq(s, *quant_pointers(x.data_ptr(), base, base + s_off))
        part, cnt = (base + p_off, counters.address(tiles)) if split else (yp, yp)
        bg(s, *gemm_pointers(base, base + s_off, None if bias is None else bias.data_ptr(), yp, part, cnt))
        return y

    return run
