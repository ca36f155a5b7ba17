"""torch's packed CPU matmuls as quantrt kernels: one prepared layout per weight, every M."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec
from quantrt.torchops import TorchInt4Pack, TorchIntMMW8A8, finish, per_channel_scales, torch_op_verdict

CPU_ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class CpuInt4Pack(TorchInt4Pack):
    """W4A16 through torch's ``_weight_int4pack_mm_for_cpu`` (AVX-512/AVX2 inside torch)."""

    name = "cpu.torch_int4pack"
    backend = "cpu"
    device_kinds = ("cpu",)
    priority = 50
    description = "torch._weight_int4pack_mm_for_cpu: int4 group weights, zero-points folded into floats"
    mm_op = "_weight_int4pack_mm_for_cpu"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return (
            cls.scheme_verdict(spec)
            and check(
                (spec.N_part % 16 == 0, "N % 16 == 0", {"N": spec.N_part}),
                (
                    spec.act_dtype in CPU_ACT_DTYPES,
                    "activations fp32, bf16 or fp16",
                    {"act_dtype": spec.act_dtype},
                ),
            )
            and torch_op_verdict(caps, cls.mm_op)
        )

    def pack(self, codes: torch.Tensor, K: int) -> torch.Tensor:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)


@dataclass
class Int8PackState:
    weight: torch.Tensor
    scales: torch.Tensor
    out_dtype: torch.dtype


class CpuInt8Pack(Kernel):
    """W8A16 per-channel through torch's ``_weight_int8pack_mm``."""

    name = "cpu.torch_int8pack"
    backend = "cpu"
    device_kinds = ("cpu",)
    priority = 50
    description = "torch._weight_int8pack_mm: symmetric int8 weights, one scale per output channel"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
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
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            # torch 2.13's bf16 GEMV path reads past the row (garbage or a crash) otherwise
            (spec.K_part % 16 == 0, "K % 16 == 0", {"K": spec.K_part}),
            (
                spec.act_dtype in CPU_ACT_DTYPES,
                "activations fp32, bf16 or fp16",
                {"act_dtype": spec.act_dtype},
            ),
        ) and torch_op_verdict(caps, "_weight_int8pack_mm")

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Int8PackState:
        q = (int_codes(weight) - 128).to(torch.int8).contiguous()
        return Int8PackState(q, per_channel_scales(weight).to(spec.act_dtype), spec.output_dtype)

    def apply(
        self,
        state: Int8PackState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), state.weight, state.scales)
        return finish(y, bias, out, state.out_dtype)


class CpuIntMM(TorchIntMMW8A8):
    """W8A8 int8 through ``torch._int_mm`` on the CPU (oneDNN; VNNI where the CPU has it)."""

    name = "cpu.torch_int_mm"
    backend = "cpu"
    device_kinds = ("cpu",)
    priority = 50
    description = "torch._int_mm with per-token or static int8 activations, scales in the epilogue"
