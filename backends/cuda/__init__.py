"""NVIDIA backend: which kernels run on NVIDIA GPUs, in what order, tuned how.

Today: torch's own ops (tinygemm int4, cuBLASLt fp8 and int8). Triton kernels from
``backends/triton`` arrive with the NVIDIA kernel issues and will rank ahead of these.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from .torch_ops import CudaIntMM, CudaScaledMMFp8, CudaTinygemm

    for kernel in (CudaScaledMMFp8, CudaIntMM, CudaTinygemm):
        registry.register(kernel)
