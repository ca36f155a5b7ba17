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
from quantrt.kernels import Kernel, Verdict, check
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


class CudaTritonGGUF(Kernel):
    """GGUF weight-only: fused dequant GEMV for small M, dequant + cuBLAS for large M."""

    name = "cuda.triton_gguf"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 40
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
        elem = torch.finfo(spec.act_dtype).bits // 8
        budget = int(doc.get("dense_workspace_mb", dense_slices.DEFAULT_WORKSPACE_MB)) << 20
        return GGUFState(
            planes, plane_list(planes, t), t, weight.N, weight.K, _configs(doc, t, GGUFConfig), int(doc["gemv_max_m"]),
            dense_slices.slice_rows(weight.N, weight.K, elem, budget), spec.act_dtype, spec.output_dtype,
            gguf_matmul, gguf_dequant,
        )  # fmt: skip

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        doc = tile_table.load(TABLE, "default")
        budget = int(doc.get("dense_workspace_mb", dense_slices.DEFAULT_WORKSPACE_MB)) << 20
        elem = torch.finfo(spec.act_dtype).bits // 8
        return max(
            4 * max_m * spec.N_part, dense_slices.workspace_bytes(spec.N_part, spec.K_part, elem, budget)
        )

    @staticmethod
    def _config(state: GGUFState, m: int) -> Any:
        for bound, c in state.configs:
            if m <= bound:
                return c
        return state.configs[-1][1]

    def strategy(self, state: GGUFState, m: int) -> str:
        if m > state.gemv_max_m:
            return f"dequant+cuBLAS (N slices of {state.slice_rows})"
        c = self._config(state, m)
        return f"gemv BM{c.block_m} BN{c.block_n} S{c.split_k}"

    def apply(
        self,
        state: GGUFState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.dtype != state.act:
            x = x.to(state.act)
        if bias is not None and bias.dtype != state.act:
            bias = bias.to(state.act)
        if out is not None and out.dtype != state.act:
            out.copy_(self.apply(state, x, bias, None))
            return out
        m = x.shape[0]
        if m > state.gemv_max_m:

            def dequant(n0: int, n1: int) -> torch.Tensor:
                return state.dequant(state.planes, state.gguf_type, state.N, state.K, state.act, n0, n1)

            y = dense_slices.dense_linear(x, state.N, state.slice_rows, dequant, bias, out)
        else:
            y = state.matmul(
                x, state.planes, state.gguf_type, state.N, state.K, bias, self._config(state, m), out
            )
        return y if y.dtype == state.out_dtype else y.to(state.out_dtype)
