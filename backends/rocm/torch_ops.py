"""torch's ROCm quantized ops (hipBLASLt) as quantrt kernels, with AMD's fp8 flavours."""

from __future__ import annotations

from typing import Any

import torch

from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec
from quantrt.torchops import TorchIntMMW8A8, TorchScaledMMFp8


class RocmScaledMMFp8Fnuz(TorchScaledMMFp8):
    """W8A8 fp8 on MI300-class GPUs (gfx942): e4m3fn checkpoints converted to e4m3fnuz at load."""

    name = "rocm.torch_scaled_mm_fnuz"
    description = "torch._scaled_mm (hipBLASLt) in e4m3fnuz: bytes 0x80 -> 0, scales doubled at load"
    fp8_dtype = torch.float8_e4m3fnuz

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(
            ("fp8_e4m3fnuz" in caps.matrix_types, "fp8_e4m3fnuz matrix units (gfx94x)", {"arch": caps.arch})
        )


class RocmScaledMMFp8(TorchScaledMMFp8):
    """W8A8 fp8 on AMD GPUs with OCP fp8 (gfx950, gfx12)."""

    name = "rocm.torch_scaled_mm"
    description = "torch._scaled_mm (hipBLASLt) in OCP e4m3fn"
    fp8_dtype = torch.float8_e4m3fn

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(("fp8_e4m3" in caps.matrix_types, "OCP fp8_e4m3 matrix units", {"arch": caps.arch}))


class RocmIntMM(TorchIntMMW8A8):
    """W8A8 int8 through ``torch._int_mm`` on hipBLASLt."""

    name = "rocm.torch_int_mm"
    description = "torch._int_mm (hipBLASLt int8) with per-token int8 activations"
    min_m = 17
    act_dtypes = (torch.bfloat16, torch.float16)

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(("int8" in caps.matrix_types, "int8 matrix units", {"arch": caps.arch}))
