"""AMD's answers for the portable Triton kernels (``backends/triton/vendor.py``)."""

from __future__ import annotations

from typing import Any

import torch

from quantrt.backends.triton.vendor import Condition, Target, VendorPolicy
from quantrt.capability.amd import gfx_target
from quantrt.kernels import Verdict

#: CDNA GPUs whose matrix cores Triton's AMD backend targets (MFMA): MI200, MI300, MI350
TRITON_ARCHS = ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")
#: MI300's fp8 flavour: e4m3fnuz (bias 8, one NaN at 0x80, max 240); gfx950 computes in OCP e4m3
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")


class RocmPolicy(VendorPolicy):
    """CDNA2+ through Triton's AMD backend: wavefronts of 64 lanes, two-stage pipelines, fp8 in the
    flavour the GPU computes in; large fp8 batches stay on the Triton kernel (hipBLASLt runs as
    ``rocm.torch_scaled_mm*``, ranked ahead of it where it takes the scheme)."""

    vendor = "rocm"
    package = "quantrt.backends.rocm"
    offline = Target("default", warp_size=64)

    def device_conditions(self, caps: Any) -> list[Condition]:
        return [
            (
                caps.arch in TRITON_ARCHS,
                f"a CDNA GPU Triton's AMD backend targets ({', '.join(TRITON_ARCHS)})",
                {"arch": caps.arch},
            ),
            (
                "triton" in caps.libraries,
                "triton importable (it builds the kernel)",
                {"libraries": caps.libraries},
            ),
        ]

    def fp8_units(self, caps: Any) -> Condition:
        types = caps.matrix_types
        return (
            "fp8_e4m3fnuz" in types or "fp8_e4m3" in types,
            "fp8 matrix units (gfx942 e4m3fnuz, gfx950 OCP e4m3)",
            {"arch": caps.arch},
        )

    def device_target(self, device: torch.device) -> Target:
        arch = gfx_target(torch.cuda.get_device_properties(device).gcnArchName)
        return arch_target(arch)

    def runs_on(self, device: torch.device) -> Verdict:
        if device.type != "cuda" or torch.version.hip is None:  # ROCm torch calls its GPUs "cuda"
            return Verdict.no("an AMD GPU under ROCm torch", device=device.type, hip=torch.version.hip)
        arch = self.device_target(device).arch
        if arch not in TRITON_ARCHS:
            return Verdict.no(
                f"a CDNA GPU Triton's AMD backend targets ({', '.join(TRITON_ARCHS)})", arch=arch
            )
        return Verdict.yes(f"AMD {arch}")


def arch_target(arch: str) -> Target:
    """The target of a gfx architecture (tests pin ``RocmPolicy(arch_target("gfx942"))``)."""
    fp8 = torch.float8_e4m3fnuz if arch in FNUZ_ARCHS else torch.float8_e4m3fn
    return Target(arch, fp8, warp_size=64, scaled_mm=False)


ROCM = RocmPolicy()
