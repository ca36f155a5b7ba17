"""torch's packed CPU matmuls as quantrt kernels: one prepared layout per weight, every M.

The int4 and W8A8 kernels are CPU flavours of runtime/torchops.py's families (shared with the CUDA
and ROCm folders); the int8 weight-only one is this folder's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec
from quantrt.torchops import TorchInt4Pack, TorchIntMMW8A8, finish, per_channel_scales, torch_op_verdict

CPU_ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class CpuInt4Pack(TorchInt4Pack):
    """W4A16 through torch's ``_weight_int4pack_mm_for_cpu`` (AVX-512/AVX2 inside torch)."""

    name = "cpu.torch_int4pack"
    act_dtypes = CPU_ACT_DTYPES
    description = "torch._weight_int4pack_mm_for_cpu: int4 group weights, zero-points folded into floats"
    mm_op = "_weight_int4pack_mm_for_cpu"
    n_align = 16

    def pack(self, codes: torch.Tensor, K: int) -> torch.Tensor:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)


@dataclass
class Int8PackLayout:
    weight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # [N] in the planned activation dtype
    out_dtype: torch.dtype


def int8pack_mm(
    layout: Int8PackLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """torch's ``_weight_int8pack_mm``, then the bias and the output dtype."""
    y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), layout.weight, layout.scales)
    return finish(y, bias, out, layout.out_dtype)


class CpuInt8Pack(Kernel):
    """W8A16 per-channel through torch's ``_weight_int8pack_mm``."""

    name = "cpu.torch_int8pack"
    act_dtypes = CPU_ACT_DTYPES
    description = "torch._weight_int8pack_mm: symmetric int8 weights, one scale per output channel"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            (
                s.weight == "int" and s.bits == 8 and s.symmetric,
                "symmetric 8-bit integer weights",
                {"weight": s.weight, "bits": s.bits, "symmetric": s.symmetric},
            ),
            (s.weight_only, "weight-only scheme", {"act": s.act}),
            (
                s.granularity in ("channel", "tensor"),
                "channel or tensor scales",
                {"granularity": s.granularity},
            ),
            # torch 2.13's bf16 GEMV path reads past the row (garbage or a crash) otherwise
            (spec.K_part % 16 == 0, "K % 16 == 0", {"K": spec.K_part}),
        ) and torch_op_verdict(caps, "_weight_int8pack_mm")

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        q = (int_codes(weight) - 128).to(torch.int8).contiguous()
        layout = Int8PackLayout(q, per_channel_scales(weight).to(spec.act_dtype), spec.output_dtype)
        return self.prepared(
            layout, [Strategy(ALL_M, "torch._weight_int8pack_mm", int8pack_mm)], spec, q.device
        )


class CpuIntMM(TorchIntMMW8A8):
    """W8A8 int8 through ``torch._int_mm`` on the CPU (oneDNN; VNNI where the CPU has it)."""

    name = "cpu.torch_int_mm"
    description = "torch._int_mm with per-token or static int8 activations, scales in the epilogue"
