"""NVIDIA's answers for the portable Triton kernels (``backends/triton/vendor.py``)."""

from __future__ import annotations

from typing import Any

import torch

from quantrt.backends.triton.vendor import Condition, Target, VendorPolicy
from quantrt.kernels import Verdict


class CudaPolicy(VendorPolicy):
    """sm_80 and later (mma.sync, cp.async); fp8 units from sm_89; OCP e4m3; cuBLASLt's
    ``_scaled_mm`` for large fp8 batches where the tables say so."""

    vendor = "cuda"
    package = "quantrt.backends.cuda"
    offline = Target("default", scaled_mm=True)  # torch's CPU _scaled_mm stands in (the CPU tests)

    def device_conditions(self, caps: Any) -> list[Condition]:
        return [
            ((caps.sm or 0) >= 80, "sm >= 80 (mma.sync and cp.async)", {"sm": caps.sm}),
            (
                "triton" in caps.libraries,
                "triton importable (it builds the kernel)",
                {"libraries": caps.libraries},
            ),
        ]

    def fp8_units(self, caps: Any) -> Condition:
        return (
            (caps.sm or 0) >= 89 and "fp8_e4m3" in caps.matrix_types,
            "fp8 matrix units (sm >= 89)",
            {"sm": caps.sm, "arch": caps.arch},
        )

    def device_target(self, device: torch.device) -> Target:
        major, minor = torch.cuda.get_device_capability(device)
        return Target(f"sm_{major}{minor}", torch.float8_e4m3fn, 32, scaled_mm=True)

    def kv_decoders(self) -> tuple[Any, ...] | None:
        from .triton_kv_decode import DECODERS  # PTX: imported when a cache decodes, not at plan time

        return DECODERS

    def kv_grid_sync(self, device: torch.device) -> tuple[Any, Any] | None:
        if torch.cuda.get_device_capability(device) < (9, 0):  # griddepcontrol: sm_90+
            return None
        from .triton_grid import GRID_SYNC

        return GRID_SYNC

    def runs_on(self, device: torch.device) -> Verdict:
        if device.type != "cuda" or torch.version.hip is not None:
            return Verdict.no("an NVIDIA GPU", device=device.type, hip=torch.version.hip)
        sm = torch.cuda.get_device_capability(device)
        if sm < (8, 0):
            return Verdict.no("sm >= 80", sm=f"{sm[0]}{sm[1]}")
        return Verdict.yes("NVIDIA sm_80+")


CUDA = CudaPolicy()
