"""torch's CUDA quantized ops as quantrt kernels, with NVIDIA's requirements."""

from __future__ import annotations

from typing import Any

import torch

from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec
from quantrt.torchops import TorchInt4Pack, TorchIntMMW8A8, TorchScaledMMFp8


def _sm(caps: Any) -> int:
    return caps.sm or 0


class CudaScaledMMFp8(TorchScaledMMFp8):
    """W8A8 fp8 on cuBLASLt through ``torch._scaled_mm`` (Ada and Hopper fp8 tensor cores)."""

    name = "cuda.torch_scaled_mm"
    description = "torch._scaled_mm (cuBLASLt) with fp8 activations quantized in torch ops"
    fp8_dtype = torch.float8_e4m3fn

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(
            (_sm(caps) >= 89, "sm >= 89 (fp8 tensor cores)", {"sm": caps.sm}),
            ("fp8_e4m3" in caps.matrix_types, "fp8_e4m3 matrix units", {"arch": caps.arch}),
        )


class CudaIntMM(TorchIntMMW8A8):
    """W8A8 int8 on cuBLASLt through ``torch._int_mm``; batches of 16 rows or fewer are padded."""

    name = "cuda.torch_int_mm"
    description = "torch._int_mm (cuBLASLt int8) with per-token int8 activations, scales in the epilogue"
    min_m = 17

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(("int8" in caps.matrix_types, "int8 matrix units", {"arch": caps.arch}))


class CudaTinygemm(TorchInt4Pack):
    """W4A16 through torch's tinygemm (``_weight_int4pack_mm``): bf16 activations only."""

    name = "cuda.torch_tinygemm"
    description = "torch._weight_int4pack_mm (tinygemm): int4 group weights, bf16 activations"
    mm_op = "_weight_int4pack_mm"
    act_dtypes = (torch.bfloat16,)
    n_align = 8
    k_align = 64

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check((_sm(caps) >= 80, "sm >= 80", {"sm": caps.sm}))

    def pack(self, codes: torch.Tensor, K: int) -> torch.Tensor:
        inner_k_tiles = 8 if K % 256 == 0 else (4 if K % 128 == 0 else 2)
        u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8).contiguous()
        return torch.ops.aten._convert_weight_to_int4pack(u8, inner_k_tiles)
