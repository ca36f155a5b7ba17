"""The strategies of the Triton W8A8 / fp8 weight-only kernels (``w8a8_kernel.py``): fused activation
quantization, then a Triton GEMM of one tile configuration, or the vendor's ``_scaled_mm`` for large
fp8 batches. Kept apart from ``w8a8_kernel.py`` because it imports Triton, which that module's
``can_implement`` must not need. Each function reads the kernel's layout (``lay``) and the tile
bound at load, so a call imports and looks up nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.prepared import StrategyFn
from quantrt.torchops import SCHEME_FP8_MAX

from . import act_quant
from .common import TileConfig
from .fp8_mm import fp8_block_matmul, fp8_rowwise_matmul
from .fp8_weight_only import fp8_weight_only_matmul
from .int8_mm import int8_matmul


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

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        xq, a_scale = quantize(x, "fp8", lay.act, lay.in_scale, lay.fp8, lay.mult)
        return fp8_rowwise_matmul(
            xq, a_scale, lay.w, lay.w_scale, bias, lay.out_dtype, tile, out, lay.counters
        )

    return fn


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

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        xq, xs = act_quant.quantize_per_token_group(x, lay.block[1], fp8_dtype=lay.fp8, qmax=lay.qmax)
        return fp8_block_matmul(
            xq, xs, lay.w, lay.w_scale, lay.block, bias, lay.out_dtype, tile, out, lay.counters
        )

    return fn


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

    def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        if lay.in_scale is None:
            xq, a_scale = act_quant.quantize_per_token(x, "int8")
        else:
            xq, a_scale = act_quant.quantize_static(x, lay.in_scale, "int8"), lay.in_scale
        return int8_matmul(xq, a_scale, lay.w, lay.w_scale, bias, lay.out_dtype, tile, out, lay.counters)

    return fn
