"""GGUF (llama.cpp's ten block types) on NVIDIA GPUs through the Triton kernels of
``backends/triton/gguf.py``.

The blocks are decoded as llama.cpp wrote them, never re-quantized: at load each row's blocks are
split into their fields (scales, mins, high bits, low bits), the same bytes in aligned planes,
so the kernel can use wide loads (native blocks of 18, 34 or 210 bytes are only 2-byte aligned).
Small batches run a fused dequantize-and-multiply GEMV that reads the planes once per call;
above ``gemv_max_m`` rows, up to the type's ``gemm_max_m``, a tensor-core GEMM that decodes the
planes inside its K loop (``backends/triton/gguf_gemm.py``: no dense weight, no scratch); above
that, where cuBLAS's arithmetic wins, the weight is dequantized slice by slice for cuBLAS
(``dense_slices``: bounded scratch, full-K GEMMs). Launch shapes per M and the bounds come from
``tunings/gguf_<arch>.json``; a type without a ``gemm_max_m`` there skips the GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec

from . import dense_slices, tile_table

ACT_DTYPES = (torch.float16, torch.bfloat16)
TABLE = "gguf"


@dataclass
class GGUFState:
    planes: dict[str, torch.Tensor]
    plane_list: list[torch.Tensor]  # the same, in the torch op's order
    gguf_type: str
    N: int
    K: int
    configs: tuple[tuple[int, Any], ...]  # (max rows, GGUFConfig), ascending
    gemv_max_m: int
    gemm_configs: tuple[Any, ...]  # a GemmConfig per tile_table bucket, or () without the GEMM
    gemm_max_m: int  # batches above gemv_max_m up to this take the GEMM
    slice_rows: int
    act: torch.dtype
    out_dtype: torch.dtype
    matmul: Any  # gguf_matmul, bound at load so apply() imports nothing
    dequant: Any  # gguf_dequant
    gemm: Any  # gguf_gemm


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


class CudaTritonGGUF(dense_slices.DequantSlicesKernel):
    """GGUF weight-only: fused dequant GEMV for small M, dequant + cuBLAS for large M."""

    name = "cuda.triton_gguf"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 40
    table = TABLE
    description = (
        "GGUF (all ten llama.cpp types): native blocks split into aligned planes, fused dequant GEMV for "
        "small M, a tensor-core GEMM decoding the blocks in its K loop for mid-size M (tuned types), "
        "dequant + cuBLAS (bounded slices) for large M"
    )

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            ((caps.sm or 0) >= 80, "sm >= 80", {"sm": caps.sm}),
            (
                "triton" in caps.libraries,
                "triton importable (it builds the kernel)",
                {"libraries": caps.libraries},
            ),
            (s.family == "gguf", "GGUF weights", {"weight": s.weight}),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (spec.act_dtype in ACT_DTYPES, "activations bf16 or fp16", {"act_dtype": spec.act_dtype}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> GGUFState:
        from quantrt.backends.triton.gguf import (
            GGUFConfig,
            gguf_dequant,
            gguf_matmul,
            gguf_planes,
            plane_list,
        )
        from quantrt.backends.triton.gguf_gemm import GEMM_TYPES, GemmConfig, gguf_gemm

        t = weight.scheme.gguf_type
        assert t is not None
        q = weight["qweight"]
        planes = gguf_planes(q, t, weight.N, weight.K)
        doc = tile_table.load(TABLE, tile_table.arch_of(q))
        gemm_tiles, gemm_max_m = _gemm(doc, t, GemmConfig) if t in GEMM_TYPES else ((), 0)
        return GGUFState(
            planes, plane_list(planes, t), t, weight.N, weight.K, _configs(doc, t, GGUFConfig), int(doc["gemv_max_m"]),
            gemm_tiles, gemm_max_m, dense_slices.rows_for(weight.N, weight.K, spec.act_dtype, doc), spec.act_dtype,
            spec.output_dtype, gguf_matmul, gguf_dequant, gguf_gemm,
        )  # fmt: skip

    @staticmethod
    def _config(state: GGUFState, m: int) -> Any:
        for bound, c in state.configs:
            if m <= bound:
                return c
        return state.configs[-1][1]

    def strategy(self, state: GGUFState, m: int) -> str:
        if self.use_dense(state, m):
            return f"dequant+cuBLAS (N slices of {state.slice_rows})"
        if m > state.gemv_max_m:
            c = tile_table.pick(state.gemm_configs, m)
            return f"fused gemm BM{c.block_m} BN{c.block_n} BK{c.block_k} W{c.num_warps} S{c.num_stages}"
        c = self._config(state, m)
        return f"gemv BM{c.block_m} BN{c.block_n} S{c.split_k}"

    def use_dense(self, state: GGUFState, m: int) -> bool:
        return m > max(state.gemv_max_m, state.gemm_max_m)

    def dequant_rows(self, state: GGUFState, n0: int, n1: int) -> torch.Tensor:
        return state.dequant(state.planes, state.gguf_type, state.N, state.K, state.act, n0, n1)

    def small(
        self, state: GGUFState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        if x.shape[0] > state.gemv_max_m:
            g = tile_table.pick(state.gemm_configs, x.shape[0])
            if torch.compiler.is_compiling():
                y = torch.ops.quantrt.gguf_gemm(
                    x, state.plane_list, state.gguf_type, state.N, state.K, bias,
                    g.block_m, g.block_n, g.block_k, g.num_warps, g.num_stages, g.group_m,
                )  # fmt: skip
                return y if out is None else out.copy_(y)
            return state.gemm(x, state.planes, state.gguf_type, state.N, state.K, bias, g, out)
        c = self._config(state, x.shape[0])
        if torch.compiler.is_compiling():  # traced: the registered op with its fake
            y = torch.ops.quantrt.gguf_mm(
                x, state.plane_list, state.gguf_type, state.N, state.K, bias,
                c.block_m, c.block_n, c.split_k, c.num_warps, c.num_stages, c.block_k,
            )  # fmt: skip
            return y if out is None else out.copy_(y)
        return state.matmul(x, state.planes, state.gguf_type, state.N, state.K, bias, c, out)
