"""4-bit code-book weights through the portable Triton kernels: NVFP4, MXFP4 and bitsandbytes NF4/FP4 (W4A16).

All four decode one nibble through a 16-value code book (e2m1 by bit tricks, NF4/FP4 from a
table) times a per-group scale, so one Triton kernel family serves them
(``backends/triton/lut4.py``): a GEMV that streams the codes along K for M = 1, a ``tl.dot``
tile for small batches, and from ``dense_from_m`` rows on the weight dequantized slice by slice
for cuBLAS (``dense_slices``). Prepared layout, chosen so no byte is added:

- NVFP4 / MXFP4: the canonical codes (low nibble = even k) and the 1-byte scales as stored
  (e4m3 bits, e8m0 exponents); NVFP4's global scale becomes one fp32 per output row.
- bitsandbytes: the flat blocks are cut into rows (``K % blocksize == 0``, so no block spans
  two rows), nibbles swapped to low = even k, and a double-quantized absmax resolved to fp32
  once at load (4 bytes per 64 weights instead of 1, the price of a single load per group).

A W4A4 NVFP4 checkpoint runs here as a weight-only substitute (activations stay 16-bit), which
``explain`` labels. Tiles per M bucket come from the vendor's ``tunings/lut4_<arch>.json``, one strategy each
(:func:`lut4_strategies`); :func:`build` makes the prepared layer of a layout, so tools can rebuild
one from a layout with other tiles or bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, dequantize_absmax, unpack_bnb4
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared, Strategy, StrategyFn
from quantrt.specs import LayerSpec

from . import dense_slices, tile_table
from .vendor import TritonKernel

TABLE = "lut4"


@dataclass(frozen=True)
class Lut4Layout:
    """A 4-bit code-book weight as stored, with the launch shapes and bounds its tuning table gives it."""

    codes: torch.Tensor  # uint8 [N, K/2], low nibble = even k
    scales: torch.Tensor  # [N, K/G]: uint8 (e4m3 bits / e8m0 exponents) or fp32 absmax
    table: torch.Tensor | None  # fp32 [16] code book; None: e2m1
    row_scale: torch.Tensor | None  # fp32 [N] (NVFP4's global scale per row)
    group: int
    scale_kind: str  # "e4m3" | "e8m0" | "f32"
    N: int
    act: torch.dtype
    configs: tuple[Any, ...]  # one TileConfig per tile_table bucket
    dense_from: int  # batches of at least this many rows run dequant + cuBLAS
    slice_rows: int  # rows of W dequantized per cuBLAS call
    matmul: Any  # lut4_matmul, bound at load so a call imports nothing
    dequant: Any  # lut4_dequant


def _fused(config: Any) -> StrategyFn:
    """The GEMV (``block_m`` 1) or ``tl.dot`` tiles of one configuration."""

    def fn(lay: Lut4Layout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        return lay.matmul(
            x, lay.codes, lay.scales, lay.group, lay.scale_kind, lay.table, lay.row_scale, bias, config, out
        )

    return fn


def _name(config: Any) -> str:
    kind = "gemv" if config.block_m == 1 else "tile"
    return f"{kind} BM{config.block_m} BN{config.block_n} BK{config.block_k} S{config.split_k}"


def _dequant(lay: Lut4Layout, n0: int, n1: int, out: torch.Tensor | None) -> torch.Tensor:
    """Rows of W in the activation dtype, for the dense strategy."""
    return lay.dequant(
        lay.codes, lay.scales, lay.group, lay.scale_kind, lay.table, lay.row_scale, lay.act, n0, n1, out
    )


def _rows(lay: Lut4Layout, n0: int, n1: int) -> torch.Tensor:
    """Rows of W in fp32, exact (a tied embedding's lookup)."""
    return lay.dequant(
        lay.codes, lay.scales, lay.group, lay.scale_kind, lay.table, lay.row_scale, torch.float32, n0, n1
    )


def prepare_fp4(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
    """Codes, 1-byte scales as stored and NVFP4's global scale per row; NaN scale codes refused."""
    nv = weight.scheme.family == "nvfp4"
    scales = weight["scales"]
    if nv:
        scales = scales.view(torch.uint8)
        bad = scales.eq(0x7F) | scales.eq(0xFF)
        what = "e4m3 scale codes 0x7F/0xFF are NaN"
    else:
        bad = scales.eq(255)
        what = "e8m0 scale code 255 is NaN"
    nbad = int(bad.sum())  # load time: one synchronization per layer is fine
    if nbad:
        raise ValueError(f"{weight.scheme.name}: {what} ({nbad} of {scales.numel()} scales)")
    row = None
    if nv:
        row = weight["global_scale"].float()[weight.slice_index().to(scales.device)].contiguous()
    return weight["qweight"].contiguous(), scales.contiguous(), row, "e4m3" if nv else "e8m0"


def prepare_bnb4(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, N, K = weight.scheme, weight.N, weight.K
    G = s.group_size
    assert G is not None
    c = unpack_bnb4(weight["qweight"], N * K).view(N, K)
    codes = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
    if s.double_quant:
        nb = N * K // G
        offset = weight["offset"].float()
        if offset.numel() > 1:  # one offset per fused slice's quant state
            idx = weight.slice_index().to(offset.device)
            offset = offset[idx[torch.arange(nb, device=offset.device) * G // K]]
        absmax = dequantize_absmax(weight["absmax"], weight["nested_absmax"], weight["nested_code"], offset)
    else:
        absmax = weight["absmax"].float()
    return codes, absmax.reshape(N, K // G).contiguous(), weight["code"].float().contiguous()


def lut4_layout(weight: CanonicalWeight, spec: LayerSpec, doc: dict[str, Any]) -> Lut4Layout:
    """The weight's codes and scales (:func:`prepare_fp4`, :func:`prepare_bnb4`) and the launch
    shapes of the device's table ``doc`` (``lut4_<arch>.json``)."""
    from .common import TileConfig
    from .lut4 import lut4_dequant, lut4_matmul

    s = weight.scheme
    if s.family in ("nvfp4", "mxfp4"):
        codes, scales, row, kind = prepare_fp4(weight)
        table = None
    else:
        codes, scales, table = prepare_bnb4(weight)
        row, kind = None, "f32"
    G = s.group_size
    assert G is not None
    act = spec.act_dtype
    configs = tile_table.tile_configs(doc[TABLE], weight.N, weight.K, TileConfig)
    # the GEMV serves one row: a larger bucket whose table row is a GEMV takes the 16-row one's tile
    configs = (configs[0], *(configs[1] if c.block_m == 1 else c for c in configs[1:]))
    return Lut4Layout(
        codes, scales, table, row, G, kind, weight.N, act, configs, int(doc["dense_from_m"]),
        dense_slices.rows_for(weight.N, weight.K, act, doc), lut4_matmul, lut4_dequant,
    )  # fmt: skip


def lut4_strategies(layout: Lut4Layout) -> list[Strategy]:
    """The GEMV (one row) and the tiles per M bucket below ``dense_from``, then dequant + cuBLAS for
    every larger batch. Their ``fn`` takes x, bias and ``out`` in the activation dtype (wrap the list
    with ``dense_slices.in_act_dtype``)."""
    from .common import tile_strategies

    return [
        *tile_strategies(tile_table.BUCKETS, layout.configs, _name, _fused, upto=layout.dense_from - 1),
        dense_slices.dense_strategy(layout.slice_rows, layout.N, _dequant),
    ]


def build(kernel: Kernel, layout: Lut4Layout, spec: LayerSpec) -> Prepared:
    """The prepared layer over ``layout`` with :func:`lut4_strategies` and exact row access (tools
    rebuild one from a replaced layout)."""
    strategies = dense_slices.in_act_dtype(lut4_strategies(layout), layout.act, spec.output_dtype)
    return kernel.prepared(layout, strategies, spec, layout.codes.device, rows=_rows)


class TritonLut4(TritonKernel):
    """The 4-bit code-book Triton family (its two kernels differ in the schemes they take): the
    GEMV for one row, tiles per M bucket below ``dense_from_m``, dequant + cuBLAS from there."""

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        doc = self.policy.table(TABLE, self.policy.target(weight["qweight"].device))
        return build(self, lut4_layout(weight, spec, doc), spec)


class TritonFp4(TritonLut4):
    short_name = "triton_fp4"
    description = (
        "NVFP4/MXFP4 weight-only: e2m1 codes and e4m3/e8m0 scales decoded in registers (Triton GEMV and "
        "tiles); dequant + cuBLAS for large M"
    )

    weight_only = True  # an activation-quantized scheme here is a weight-only substitute

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *cls.policy.device_conditions(caps),
            (s.family in ("nvfp4", "mxfp4"), "NVFP4 or MXFP4 weights", {"weight": s.weight}),
        )


class TritonBnb4(TritonLut4):
    short_name = "triton_bnb4"
    description = (
        "bitsandbytes NF4/FP4 weight-only: code-book lookup in registers (Triton GEMV and tiles), double "
        "quant resolved at load; dequant + cuBLAS for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *cls.policy.device_conditions(caps),
            (s.family == "bnb4", "bitsandbytes NF4/FP4 weights", {"weight": s.weight}),
            (
                s.group_size is not None and spec.K_part % s.group_size == 0,
                "K a multiple of the blocksize (no block spans two rows)",
                {"K": spec.K_part, "blocksize": s.group_size},
            ),
        )
