"""GGUF (llama.cpp's ten block types) on NVIDIA GPUs through the Triton kernels of
``backends/triton/gguf.py``.

The blocks are decoded as llama.cpp wrote them, never re-quantized: at load each row's blocks are
split into their fields (scales, mins, high bits, low bits), the same bytes in aligned planes,
so the kernel can use wide loads (native blocks of 18, 34 or 210 bytes are only 2-byte aligned).
Small batches run a fused dequantize-and-multiply GEMV that reads the planes once per call;
from ``gemv_max_m`` rows on, the weight is dequantized slice by slice for cuBLAS
(``dense_slices``: bounded scratch, full-K GEMMs). Launch shapes per M come from
``tunings/gguf_<arch>.json``.
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
    slice_rows: int
    act: torch.dtype
    out_dtype: torch.dtype
    matmul: Any  # gguf_matmul, bound at load so apply() imports nothing
    dequant: Any  # gguf_dequant


def _configs(doc: dict[str, Any], gguf_type: str, make: Any) -> tuple[tuple[int, Any], ...]:
    """The GEMV launch shapes per batch bound, this type's row over the table's default."""
    rows = doc.get("types", {}).get(gguf_type, doc["gemv"])
    return tuple(sorted((int(m), make(**c)) for m, c in rows.items()))


class CudaTritonGGUF(dense_slices.DequantSlicesKernel):
    """GGUF weight-only: fused dequant GEMV for small M, dequant + cuBLAS for large M."""

    name = "cuda.triton_gguf"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 40
    table = TABLE
    description = (
        "GGUF (all ten llama.cpp types): native blocks split into aligned planes, fused dequant GEMV for "
        "small M, dequant + cuBLAS (bounded slices) for large M"
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

        t = weight.scheme.gguf_type
        assert t is not None
        q = weight["qweight"]
        planes = gguf_planes(q, t, weight.N, weight.K)
        doc = tile_table.load(TABLE, tile_table.arch_of(q))
        return GGUFState(
            planes, plane_list(planes, t), t, weight.N, weight.K, _configs(doc, t, GGUFConfig), int(doc["gemv_max_m"]),
            dense_slices.rows_for(weight.N, weight.K, spec.act_dtype, doc), spec.act_dtype, spec.output_dtype,
            gguf_matmul, gguf_dequant,
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
        c = self._config(state, m)
        return f"gemv BM{c.block_m} BN{c.block_n} S{c.split_k}"

    def use_dense(self, state: GGUFState, m: int) -> bool:
        return m > state.gemv_max_m

    def dequant_rows(self, state: GGUFState, n0: int, n1: int) -> torch.Tensor:
        return state.dequant(state.planes, state.gguf_type, state.N, state.K, state.act, n0, n1)

    def small(
        self, state: GGUFState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        c = self._config(state, x.shape[0])
        if torch.compiler.is_compiling():  # traced: the registered op with its fake
            y = torch.ops.quantrt.gguf_mm(
                x, state.plane_list, state.gguf_type, state.N, state.K, bias,
                c.block_m, c.block_n, c.split_k, c.num_warps, c.num_stages, c.block_k,
            )  # fmt: skip
            return y if out is None else out.copy_(y)
        return state.matmul(x, state.planes, state.gguf_type, state.N, state.K, bias, c, out)
