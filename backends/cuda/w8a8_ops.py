"""The forwards of the Triton W8A8 / fp8 weight-only kernels (``triton_w8a8.py``), twice: as plain
functions, which eager calls and CUDA-graph capture use (the op layer costs host time, see
DESIGN.md's hot path), and as ``torch.library`` custom ops with fake implementations, which
``torch.compile`` traces through. Both take the same arguments except the tile configuration,
which an op receives as the six ints of ``TileConfig``; ``block`` is ``(bn, bk)`` or ``()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quantrt.backends.triton import act_quant
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.fp8_mm import fp8_block_matmul, fp8_rowwise_matmul
from quantrt.backends.triton.fp8_weight_only import fp8_weight_only_matmul
from quantrt.backends.triton.int8_mm import int8_matmul


def quantize(x: torch.Tensor, kind: str, act: str, in_scale: torch.Tensor | None):
    """Codes and their scale: ``act`` is ``static`` (``in_scale``), ``token`` or ``tensor``."""
    if act == "static":
        return act_quant.quantize_static(x, in_scale, kind), in_scale
    if act == "token":
        return act_quant.quantize_per_token(x, kind)
    return act_quant.quantize_per_tensor(x, kind)


def fp8_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    in_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    act: str,
    tensorwise: bool,
    scaled_mm_from: int,
    tile: TileConfig,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp8 W8A8, tensor or channel weights: Triton below ``scaled_mm_from`` rows, cuBLASLt above
    (``tensorwise``: one weight scale and one activation scale, its only mode with a 16-bit output
    other than bf16; otherwise row-wise)."""
    xq, a_scale = quantize(x, "fp8", act, in_scale)
    m = x.shape[0]
    if m < scaled_mm_from:
        return fp8_rowwise_matmul(xq, a_scale, w, w_scale, bias, out_dtype, tile, out)
    if tensorwise:
        sa, sb = a_scale.reshape(()), w_scale[:1].reshape(())
    else:  # row-wise: a scale per token (a static one repeated) and per channel
        sa, sb = a_scale.reshape(-1, 1).expand(m, 1).contiguous(), w_scale.reshape(1, -1)
    y = torch._scaled_mm(xq, w.t(), sa, sb, out_dtype=out_dtype)
    if bias is not None:
        y = y + bias
    return y if out is None else out.copy_(y)


def block_fp8_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    block: Sequence[int],
    tile: TileConfig,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    xq, xs = act_quant.quantize_per_token_group(x, block[1])
    return fp8_block_matmul(xq, xs, w, w_scale, (block[0], block[1]), bias, out_dtype, tile, out)


def fp8_weight_only_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    block: Sequence[int],
    act_dtype: torch.dtype,
    tile: TileConfig,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    if x.dtype != act_dtype:
        x = x.to(act_dtype)
    blk = (block[0], block[1]) if block else None
    return fp8_weight_only_matmul(x, w, w_scale, blk, bias, out_dtype, tile, out)


def int8_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    in_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    tile: TileConfig,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    xq, a_scale = quantize(x, "int8", "token" if in_scale is None else "static", in_scale)
    return int8_matmul(xq, a_scale, w, w_scale, bias, out_dtype, tile, out)


@torch.library.custom_op("quantrt::fp8_linear", mutates_args=())
def fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    in_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    act: str,
    tensorwise: bool,
    scaled_mm_from: int,
    tile: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    tc = TileConfig(*tile)
    return fp8_forward(x, w, w_scale, in_scale, bias, act, tensorwise, scaled_mm_from, tc, out_dtype)


@torch.library.custom_op("quantrt::block_fp8_linear", mutates_args=())
def block_fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    block: list[int],
    tile: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return block_fp8_forward(x, w, w_scale, bias, block, TileConfig(*tile), out_dtype)


@torch.library.custom_op("quantrt::fp8_w8a16_linear", mutates_args=())
def fp8_w8a16_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    block: list[int],
    act_dtype: torch.dtype,
    tile: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return fp8_weight_only_forward(x, w, w_scale, bias, block, act_dtype, TileConfig(*tile), out_dtype)


@torch.library.custom_op("quantrt::int8_linear", mutates_args=())
def int8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    in_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    tile: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return int8_forward(x, w, w_scale, in_scale, bias, TileConfig(*tile), out_dtype)


# The fakes only need the output: [M, N] in the output dtype (the last argument of every op).
for _op in (fp8_linear, block_fp8_linear, fp8_w8a16_linear, int8_linear):
    _op.register_fake(lambda x, w, *args: x.new_empty(x.shape[0], w.shape[0], dtype=args[-1]))
