"""torch's CUDA quantized ops as quantrt kernels, with NVIDIA's requirements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm, int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec
from quantrt.torchops import TorchIntMMW8A8, TorchScaledMMFp8, torch_op_verdict

TINYGEMM_GROUPS = (32, 64, 128, 256)


def _sm(caps: Any) -> int:
    return caps.sm or 0


class CudaScaledMMFp8(TorchScaledMMFp8):
    """W8A8 fp8 on cuBLASLt through ``torch._scaled_mm`` (Ada and Hopper fp8 tensor cores)."""

    name = "cuda.torch_scaled_mm"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 50
    description = "torch._scaled_mm (cuBLASLt) with fp8 activations quantized in torch ops"
    fp8_dtype = torch.float8_e4m3fn

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return (
            check(
                (_sm(caps) >= 89, "sm >= 89 (fp8 tensor cores)", {"sm": caps.sm}),
                ("fp8_e4m3" in caps.matrix_types, "fp8_e4m3 matrix units", {"arch": caps.arch}),
            )
            and cls.scheme_verdict(spec)
            and torch_op_verdict(caps, "_scaled_mm")
        )


class CudaIntMM(TorchIntMMW8A8):
    """W8A8 int8 on cuBLASLt through ``torch._int_mm``; batches of 16 rows or fewer are padded."""

    name = "cuda.torch_int_mm"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 50
    description = "torch._int_mm (cuBLASLt int8) with per-token int8 activations, scales in the epilogue"
    min_m = 17

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return (
            check(
                ("int8" in caps.matrix_types, "int8 matrix units", {"arch": caps.arch}),
                (
                    spec.act_dtype in (torch.bfloat16, torch.float16, torch.float32),
                    "activations bf16, fp16 or fp32",
                    {"act_dtype": spec.act_dtype},
                ),
            )
            and cls.scheme_verdict(spec)
            and torch_op_verdict(caps, "_int_mm")
        )


@dataclass
class TinygemmState:
    packed: torch.Tensor
    group: int
    scales_zeros: torch.Tensor
    perm: torch.Tensor | None
    out_dtype: torch.dtype


class CudaTinygemm(Kernel):
    """W4A16 through torch's tinygemm (``_weight_int4pack_mm``): bf16 activations only."""

    name = "cuda.torch_tinygemm"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 60
    description = "torch._weight_int4pack_mm (tinygemm): int4 group weights, bf16 activations"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size if s.granularity == "group" else spec.K_part
        return check(
            (_sm(caps) >= 80, "sm >= 80", {"sm": caps.sm}),
            (
                s.weight == "int" and s.bits == 4,
                "4-bit integer weights",
                {"weight": s.weight, "bits": s.bits},
            ),
            (s.weight_only, "weight-only scheme", {"act": s.act}),
            (
                s.granularity in ("group", "channel"),
                "group or channel scales",
                {"granularity": s.granularity},
            ),
            (G in TINYGEMM_GROUPS, "group size in (32, 64, 128, 256)", {"G": G}),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (spec.act_dtype == torch.bfloat16, "bf16 activations", {"act_dtype": spec.act_dtype}),
            (spec.N_part % 8 == 0, "N % 8 == 0", {"N": spec.N_part}),
            (spec.K_part % 64 == 0, "K % 64 == 0", {"K": spec.K_part}),
            (
                not s.act_order or spec.k_full,
                "act-order with the full K on this rank",
                {"K_part": spec.K_part, "K": spec.K},
            ),
        ) and torch_op_verdict(caps, "_weight_int4pack_mm")

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> TinygemmState:
        s = weight.scheme
        G = s.group_size if s.granularity == "group" else weight.K
        codes = int_codes(weight)
        perm = act_order_perm(weight, G)
        if perm is not None:
            codes = codes[:, perm]
        scales = weight["scales"].float()
        zeros = weight["zeros"].float() if not s.symmetric else torch.full_like(scales, 8.0)
        sz = torch.stack([scales, (8.0 - zeros) * scales], dim=-1).transpose(0, 1).contiguous()
        inner_k_tiles = 8 if weight.K % 256 == 0 else (4 if weight.K % 128 == 0 else 2)
        u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack(u8, inner_k_tiles)
        return TinygemmState(packed, G, sz.to(torch.bfloat16), perm, spec.output_dtype)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return max_m * spec.K_part * 2 if spec.scheme.act_order else 0

    def apply(
        self,
        state: TinygemmState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if state.perm is not None:
            x = x.index_select(1, state.perm)
        y = torch.ops.aten._weight_int4pack_mm(x.contiguous(), state.packed, state.group, state.scales_zeros)
        if bias is not None:
            y = y + bias
        if out is not None:
            return out.copy_(y)
        return y if y.dtype == state.out_dtype else y.to(state.out_dtype)
