"""NVIDIA backend: which kernels run on NVIDIA GPUs, in what order, tuned how.

Triton W4A16 (``backends/triton/w4a16.py``, tiles from ``tunings/``) ranks ahead of torch's own
ops (tinygemm int4, cuBLASLt fp8 and int8).
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from .torch_ops import CudaIntMM, CudaScaledMMFp8, CudaTinygemm
    from .triton_w4a16 import CudaTritonW4A16, CudaTritonW8A16

    for kernel in (CudaTritonW4A16, CudaTritonW8A16, CudaScaledMMFp8, CudaIntMM, CudaTinygemm):
        registry.register(kernel)
