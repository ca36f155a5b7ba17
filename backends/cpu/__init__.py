"""CPU backend: x86 and Arm CPUs, chosen by the probe's ISA features.

Today it runs torch's packed CPU ops (int4 weight-only, int8 weight-only, int8 W8A8);
native AVX-512/AMX kernels arrive with the CPU-backend issue.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from .torch_packed import CpuInt4Pack, CpuInt8Pack, CpuIntMM

    for kernel in (CpuInt4Pack, CpuInt8Pack, CpuIntMM):
        registry.register(kernel)
