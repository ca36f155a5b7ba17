"""GGUF (llama.cpp's ten block types) through the portable Triton kernels of
``backends/triton/gguf.py``.

The blocks are decoded as llama.cpp wrote them, never re-quantized: at load each row's blocks are
split into their fields (scales, mins, high bits, low bits), the same bytes in aligned planes,
so the kernel can use wide loads (native blocks of 18, 34 or 210 bytes are only 2-byte aligned).
Small batches run a fused dequantize-and-multiply GEMV that reads the planes once per call;
above ``gemv_max_m`` rows, up to the type's ``gemm_max_m``, a tensor-core GEMM that decodes the
planes inside its K loop (``backends/triton/gguf_gemm.py``: no dense weight, no scratch); above
that, where cuBLAS's arithmetic wins, the weight is dequantized slice by slice for cuBLAS
(``dense_slices``: bounded scratch, full-K GEMMs). Launch shapes per M and the bounds come from
the vendor's ``tunings/gguf_<arch>.json``; a type without a ``gemm_max_m`` there skips the GEMM.

:func:`gguf_layout` and :func:`gguf_strategies` are shared: the CUDA GEMV of ``gguf_gemv.py`` reads
the same planes and puts its own strategy in front of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared, Strategy
from quantrt.specs import LayerSpec

from . import dense_slices, tile_table
from .vendor import Condition, TritonKernel

TABLE = "gguf"


@dataclass(frozen=True)
class GGUFLayout:
    """A GGUF weight as planes, with the launch shapes and bounds its tuning table gives it."""

    planes: dict[str, torch.Tensor]
    plane_list: list[torch.Tensor]  # the same, in PLANE_NAMES order (the CUDA GEMV's operands)
    gguf_type: str
    N: int
    K: int
    act: torch.dtype
    configs: tuple[tuple[int, Any], ...]  # (max rows, GGUFConfig), ascending
    gemv_max_m: int
    gemm_configs: tuple[Any, ...]  # a GemmConfig per tile_table bucket, or () without the GEMM
    gemm_max_m: int  # batches above gemv_max_m up to this take the GEMM
    slice_rows: int  # rows of W dequantized per cuBLAS call
    dequant: Any  # gguf_dequant
    counters: Any = None  # common.TileCounters: the split-K GEMV launches' arrival counters


def _configs(doc: dict[str, Any], gguf_type: str, make: Any) -> tuple[tuple[int, Any], ...]:
    """The GEMV launch shapes per batch bound, this type's row over the table's default."""
    rows = doc.get("types", {}).get(gguf_type, doc["gemv"])
    return tuple(sorted((int(m), make(**c)) for m, c in rows.items()))


def _gemm(doc: dict[str, Any], gguf_type: str, make: Any) -> tuple[tuple[Any, ...], int]:
    """The GEMM's tile per M bucket (this type's over the table's default) and its batch bound
    (0: this type never takes the GEMM here)."""
    bound = int(doc.get("gemm_max_m", {}).get(gguf_type, 0))
    rows = {**doc.get("gemm", {}), **doc.get("gemm_types", {}).get(gguf_type, {})}
    if bound <= 0 or not rows:
        return (), 0
    present = [key for key in tile_table.KEYS if key in rows]
    tiles, last = [], rows[present[0]]
    for key in tile_table.KEYS:  # a bucket the table leaves out takes the next smaller one's tile
        last = rows.get(key, last)
        tiles.append(make(**last))
    return tuple(tiles), bound


def gguf_condition(spec: LayerSpec) -> Condition:
    """What the GGUF kernels need of the scheme (the device's needs are the vendor's)."""
    return (spec.scheme.family == "gguf", "GGUF weights", {"weight": spec.scheme.weight})


def gguf_layout(weight: CanonicalWeight, spec: LayerSpec, doc: dict[str, Any]) -> GGUFLayout:
    """The planes of ``weight`` and the launch shapes of the device's table ``doc``
    (``gguf_<arch>.json``)."""
    from .common import TileCounters, split_k_tiles
    from .gguf import GGUFConfig, gguf_dequant, gguf_planes, plane_list
    from .gguf_gemm import GEMM_TYPES, GemmConfig

    t = weight.scheme.gguf_type
    assert t is not None
    q = weight["qweight"]
    planes = gguf_planes(q, t, weight.N, weight.K)
    gemm_tiles, gemm_max_m = _gemm(doc, t, GemmConfig) if t in GEMM_TYPES else ((), 0)
    configs = _configs(doc, t, GGUFConfig)
    gemv_max_m = int(doc["gemv_max_m"])
    tiles = split_k_tiles([min(b, gemv_max_m) for b, _ in configs], [c for _, c in configs], weight.N)
    return GGUFLayout(
        planes, plane_list(planes, t), t, weight.N, weight.K, spec.act_dtype, configs,
        gemv_max_m, gemm_tiles, gemm_max_m,
        dense_slices.rows_for(weight.N, weight.K, spec.act_dtype, doc), gguf_dequant,
        TileCounters(tiles, q.device),
    )  # fmt: skip


def gguf_strategies(layout: GGUFLayout) -> list[Strategy]:
    """The GEMV per batch bound up to ``gemv_max_m``, the fused GEMM per M bucket up to
    ``gemm_max_m``, then dequant + cuBLAS for every larger batch. Their ``fn`` takes x, bias and
    ``out`` in the activation dtype (wrap the list with ``dense_slices.in_act_dtype``)."""
    from .common import tile_strategies
    from .gguf import gemv_strategy
    from .gguf_gemm import gemm_strategy

    gemv = tile_strategies(
        [b for b, _ in layout.configs],
        [c for _, c in layout.configs],
        _gemv_name,
        gemv_strategy,
        upto=layout.gemv_max_m,
    )
    gemm = tile_strategies(
        tile_table.BUCKETS, layout.gemm_configs, _gemm_name, gemm_strategy, upto=layout.gemm_max_m
    )
    return [
        *gemv,
        *(s for s in gemm if s.max_m > layout.gemv_max_m),
        dense_slices.dense_strategy(layout.slice_rows, layout.N, _dequant),
    ]


def build(kernel: Kernel, layout: GGUFLayout, spec: LayerSpec) -> Prepared:
    """The prepared layer over ``layout`` with :func:`gguf_strategies` and exact row access (tools
    rebuild one from a replaced layout)."""
    strategies = dense_slices.in_act_dtype(gguf_strategies(layout), layout.act, spec.output_dtype)
    return kernel.prepared(
        layout,
        strategies,
        spec,
        layout.plane_list[0].device,
        rows=gguf_rows,
        workspace=gemv_workspace(layout),
    )


def gemv_workspace(layout: GGUFLayout) -> Any:
    """The workspace the GEMV strategies bind their split-K partials in (:mod:`.bound`)."""
    from .bound import workspace_fn

    bounds, configs = [b for b, _ in layout.configs], [c for _, c in layout.configs]
    return workspace_fn(bounds, configs, 0, layout.N, 0, upto=layout.gemv_max_m)


def gguf_rows(layout: GGUFLayout, n0: int, n1: int) -> torch.Tensor:
    """Rows ``n0:n1`` of the weight in fp32, exactly as llama.cpp dequantizes them."""
    return layout.dequant(layout.planes, layout.gguf_type, layout.N, layout.K, torch.float32, n0, n1)


def _dequant(layout: GGUFLayout, n0: int, n1: int, out: torch.Tensor | None) -> torch.Tensor:
    """Rows of W in the activation dtype, for the dense strategy."""
    return layout.dequant(layout.planes, layout.gguf_type, layout.N, layout.K, layout.act, n0, n1, out)


def _gemv_name(c: Any) -> str:
    return f"gemv BM{c.block_m} BN{c.block_n} S{c.split_k}"


def _gemm_name(c: Any) -> str:
    return f"fused gemm BM{c.block_m} BN{c.block_n} BK{c.block_k} W{c.num_warps} S{c.num_stages}"


class TritonGGUF(TritonKernel):
    """GGUF weight-only: fused dequant GEMV for small M, the fused GEMM for mid-size M (tuned
    types), dequant + cuBLAS for large M."""

    short_name = "triton_gguf"
    description = (
        "GGUF (all ten llama.cpp types): native blocks split into aligned planes, fused dequant GEMV for "
        "small M, a tensor-core GEMM decoding the blocks in its K loop for mid-size M (tuned types), "
        "dequant + cuBLAS (bounded slices) for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(*cls.policy.device_conditions(caps), gguf_condition(spec))

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        doc = self.policy.table(TABLE, self.policy.target(weight["qweight"].device))
        return build(self, gguf_layout(weight, spec, doc), spec)
