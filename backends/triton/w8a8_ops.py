"""The strategies of the Triton W8A8 / fp8 weight-only kernels (``w8a8_kernel.py``): fused activation
quantization, then a Triton GEMM of one tile configuration, or the vendor's ``_scaled_mm`` for large
fp8 batches. Kept apart from ``w8a8_kernel.py`` because it imports Triton, which that module's
``can_implement`` must not need. Each function reads the kernel's layout (``lay``) and the tile
bound at load, so a call imports and looks up nothing. Batches up to ``bound.BOUND_M`` rows run
from bound launches after a layer's first call at that size (:mod:`.bound`, :mod:`.w8a8_bound`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from quantrt.prepared import StrategyFn
from quantrt.torchops import SCHEME_FP8_MAX

from . import act_quant
from .bound import Runner, bound_strategy
from .common import TileConfig, tile_grid
from .fp8_mm import block_call, fp8_block_matmul, fp8_rowwise_matmul, rowwise_call
from .fp8_weight_only import fp8_weight_only_matmul
from .int8_mm import int8_call, int8_matmul
from .w8a8_bound import bind_pair, views


def quantize(
    x: torch.Tensor,
    kind: str,
    act: str,
    in_scale: torch.Tensor | None,
    fp8: torch.dtype = torch.float8_e4m3fn,
    mult: float = 1.0,
) -> tuple[torch.Tensor, Any]:
    """Codes and their scale: ``act`` is ``static`` (``in_scale``), ``token`` or ``tensor``; fp8
    codes in the flavour ``fp8``, dynamic scales times ``mult`` (2 for e4m3fnuz, whose static codes
    then saturate at half e4m3's max, as the reference's do at its max)."""
    if act == "static":
        fmax = SCHEME_FP8_MAX / mult if kind == "fp8" else None
        return act_quant.quantize_static(x, in_scale, kind, fp8_dtype=fp8, fmax=fmax), in_scale
    if act == "token":
        return act_quant.quantize_per_token(x, kind, fp8_dtype=fp8, scale_mult=mult)
    return act_quant.quantize_per_tensor(x, kind, fp8_dtype=fp8, scale_mult=mult)


def fp8_triton(tile: TileConfig) -> StrategyFn:
    """fp8 W8A8 with tensor or channel weight scales on the Triton GEMV/split-K kernel."""

    def checked(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        xq, a_scale = quantize(x, "fp8", lay.act, lay.in_scale, lay.fp8, lay.mult)
        return fp8_rowwise_matmul(
            xq, a_scale, lay.w, lay.w_scale, bias, lay.out_dtype, tile, out, lay.counters
        )

    return bound_strategy(functools.partial(_first_fp8, tile), checked)


def _tiles(M: int, N: int, tile: TileConfig) -> int:
    """Output tiles of a launch (one split-K counter each)."""
    g = tile_grid(M, N, tile)
    return g[0] * g[1]


def _first_fp8(
    tile: TileConfig, lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor | None
) -> tuple[torch.Tensor, Runner | None] | None:
    """fp8 W8A8 per token or static, its codes and scales in the workspace; binds both launches.
    Per-tensor dynamic scales (a zeroed amax, a third launch) are the checked path's."""
    if ws is None or lay.act == "tensor":
        return None
    static = lay.act == "static"
    _, meta = act_quant.codes_meta(x, "fp8", lay.fp8, "fp8_triton")
    if static:
        meta["FMAX"] = SCHEME_FP8_MAX / lay.mult  # the e4m3 grid's max, as quantize's static codes
    return _first_row_scaled(
        tile, lay, x, out, ws, static, lay.fp8, meta, SCHEME_FP8_MAX, lay.mult,
        lambda xq, a, y, p, c: rowwise_call(xq, a, lay.w, lay.w_scale, bias, y, p, c, tile, 0 if static else a.stride(0)),
    )  # fmt: skip


def _first_row_scaled(
    tile: TileConfig,
    lay: Any,
    x: torch.Tensor,
    out: Any,
    ws: torch.Tensor,
    static: bool,
    codes: torch.dtype,
    meta: dict,
    qmax: float,
    mult: float,
    make_gemm: Any,
) -> tuple[torch.Tensor, Runner | None]:
    """The binding call of the row-scaled GEMMs (fp8 row-wise and int8 share their pointer order:
    codes, weight, activation scale, weight scale, bias, y, partials, counters): the codes and
    per-token scales in the workspace, or the layer's static scale; ``make_gemm(codes, activation
    scale, y, partials, counters)`` is the GEMM's launch."""
    (M, K), N = x.shape, lay.w.shape[0]
    stored = meta["INT8"] or meta["HW_FP8"]
    store, read, scales, part = views(ws, M, K, N, 0 if static else 1, tile.split_k, codes, stored)
    y = torch.empty(M, N, dtype=lay.out_dtype, device=x.device) if out is None else out
    tiles = _tiles(M, N, tile)
    cnt = lay.counters.get(tiles) if part is not None else y
    W, WS = lay.w.data_ptr(), lay.w_scale.data_ptr()
    if static:
        a_scale, IN = lay.in_scale, lay.in_scale.data_ptr()
        quant = act_quant.static_call(x, store, a_scale, meta)
        qp = lambda xp, c, s: (xp, c, IN, IN)  # noqa: E731
        gp = lambda c, s, b, yp, p, n: (c, W, IN, WS, WS if b is None else b, yp, p, n)  # noqa: E731
    else:
        a_scale = scales
        quant = act_quant.per_token_call(x, store, scales, qmax, mult, meta)
        qp = lambda xp, c, s: (xp, c, s)  # noqa: E731
        gp = lambda c, s, b, yp, p, n: (c, W, s, WS, WS if b is None else b, yp, p, n)  # noqa: E731
    gemm = make_gemm(read, a_scale, y, y if part is None else part, cnt)
    quant()
    gemm()
    run = bind_pair(quant, gemm, qp, gp, M=M, N=N, K=K, scale_groups=0 if static else 1,
                    out_dtype=lay.out_dtype, split_k=tile.split_k, tiles=tiles, counters=lay.counters)  # fmt: skip
    return y, run


def fp8_scaled_mm(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    """fp8 W8A8 on the vendor's BLAS: ``lay.tensorwise`` (one weight scale and one activation scale)
    is its only mode with a 16-bit output other than bf16; otherwise row-wise scales."""
    xq, a_scale = quantize(x, "fp8", lay.act, lay.in_scale, lay.fp8, lay.mult)
    m = x.shape[0]
    if lay.tensorwise:
        sa, sb = a_scale.reshape(()), lay.w_scale[:1].reshape(())
    else:  # row-wise: a scale per token (a static one repeated) and per channel
        sa, sb = a_scale.reshape(-1, 1).expand(m, 1).contiguous(), lay.w_scale.reshape(1, -1)
    y = torch._scaled_mm(xq, lay.w.t(), sa, sb, out_dtype=lay.out_dtype)
    if bias is not None:
        y = y + bias
    return y if out is None else out.copy_(y)


def block_fp8(tile: TileConfig) -> StrategyFn:
    """Block fp8: per-token-group fp8 activations, the Triton GEMM scaling per k-block."""

    def checked(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        xq, xs = act_quant.quantize_per_token_group(x, lay.block[1], fp8_dtype=lay.fp8, qmax=lay.qmax)
        return fp8_block_matmul(
            xq, xs, lay.w, lay.w_scale, lay.block, bias, lay.out_dtype, tile, out, lay.counters
        )

    return bound_strategy(functools.partial(_first_block, tile), checked)


def _first_block(
    tile: TileConfig, lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor | None
) -> tuple[torch.Tensor, Runner | None] | None:
    """Block fp8, its codes and group scales in the workspace; binds both launches."""
    if ws is None:
        return None
    (M, K), N = x.shape, lay.w.shape[0]
    groups = -(-K // lay.block[1])
    _, meta = act_quant.codes_meta(x, "fp8", lay.fp8, "block_fp8")
    stored = meta.pop("INT8") or meta["HW_FP8"]  # the group kernel is fp8 only
    store, read, scales, part = views(ws, M, K, N, groups, tile.split_k, lay.fp8, stored)
    y = torch.empty(M, N, dtype=lay.out_dtype, device=x.device) if out is None else out
    tiles = _tiles(M, N, tile)
    cnt = lay.counters.get(tiles) if part is not None else y
    W, WS = lay.w.data_ptr(), lay.w_scale.data_ptr()
    quant = act_quant.per_group_call(x, store, scales, lay.block[1], lay.qmax, meta)
    gemm = block_call(read, scales, lay.w, lay.w_scale, lay.block, bias, y, y if part is None else part, cnt,
                      tile)  # fmt: skip
    quant()
    gemm()
    run = bind_pair(quant, gemm, lambda xp, c, s: (xp, c, s),
                    lambda c, s, b, yp, p, n: (c, s, W, WS, WS if b is None else b, yp, p, n),
                    M=M, N=N, K=K, scale_groups=groups, out_dtype=lay.out_dtype, split_k=tile.split_k,
                    tiles=tiles, counters=lay.counters)  # fmt: skip
    return y, run


def fp8_weight_only(tile: TileConfig) -> StrategyFn:
    """fp8 weights decoded in registers, 16-bit activations (cast to the layer's when a call passes the
    other one)."""

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        if x.dtype != lay.act:
            x = x.to(lay.act)
        return fp8_weight_only_matmul(x, lay.w, lay.w_scale, lay.block, bias, lay.out_dtype, tile, out)

    return fn


def int8(tile: TileConfig) -> StrategyFn:
    """int8 W8A8: per-token (or static) int8 activations, both scales in the GEMM's epilogue."""

    def checked(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        if lay.in_scale is None:
            xq, a_scale = act_quant.quantize_per_token(x, "int8")
        else:
            xq, a_scale = act_quant.quantize_static(x, lay.in_scale, "int8"), lay.in_scale
        return int8_matmul(xq, a_scale, lay.w, lay.w_scale, bias, lay.out_dtype, tile, out, lay.counters)

    return bound_strategy(functools.partial(_first_int8, tile), checked)


def _first_int8(
    tile: TileConfig, lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor | None
) -> tuple[torch.Tensor, Runner | None] | None:
    """int8 W8A8 per token or static, its codes and scales in the workspace; binds both launches."""
    if ws is None:
        return None
    static = lay.in_scale is not None
    _, meta = act_quant.codes_meta(x, "int8", torch.float8_e4m3fn, "int8")
    return _first_row_scaled(
        tile, lay, x, out, ws, static, torch.int8, meta, act_quant.INT8_QMAX, 1.0,
        lambda xq, a, y, p, c: int8_call(xq, a, lay.w, lay.w_scale, bias, y, p, c, tile, not static),
    )  # fmt: skip
