"""Intel's answers for the portable Triton kernels (``backends/triton/vendor.py``)."""

from __future__ import annotations

from typing import Any

import torch

from quantrt.backends.triton.vendor import Condition, Target, VendorPolicy
from quantrt.capability.xpu import XPU_ARCHS, xpu_arch
from quantrt.kernels import Verdict

#: Intel GPUs with XMX matrix engines, which Intel's Triton backend targets (``tl.dot`` on DPAS)
TRITON_ARCHS = tuple(sorted(XPU_ARCHS))


class XpuPolicy(VendorPolicy):
    """Data Center GPU Max (pvc) and Arc (dg2, bmg) through Intel's Triton backend on ``torch.xpu``:
    no fp8 matrix units (fp8 checkpoints run weight-only), no vendor fp8 BLAS."""

    vendor = "xpu"
    package = "quantrt.backends.xpu"

    def device_conditions(self, caps: Any) -> list[Condition]:
        return [
            (
                caps.arch in TRITON_ARCHS,
                f"an Intel GPU with XMX units ({', '.join(TRITON_ARCHS)})",
                {"arch": caps.arch},
            ),
            (
                "triton" in caps.libraries,
                "triton importable (it builds the kernel)",
                {"libraries": caps.libraries},
            ),
        ]

    def fp8_units(self, caps: Any) -> Condition:
        return (False, "fp8 matrix units (none on Intel's pvc, dg2, bmg)", {"arch": caps.arch})

    def device_target(self, device: torch.device) -> Target:
        return Target(xpu_arch(str(torch.xpu.get_device_properties(device).name)))

    def runs_on(self, device: torch.device) -> Verdict:
        if device.type != "xpu":
            return Verdict.no("an Intel GPU (torch.xpu)", device=device.type)
        arch = self.device_target(device).arch
        if arch not in TRITON_ARCHS:
            return Verdict.no(f"an Intel GPU with XMX units ({', '.join(TRITON_ARCHS)})", arch=arch)
        return Verdict.yes(f"Intel {arch}")


XPU = XpuPolicy()
