"""The portable Triton kernels (``backends/triton``) as NVIDIA's kernels: each class named
``cuda.<short name>`` and run with :data:`.policy.CUDA` (sm_80+, NVIDIA's tile tables in
``tunings/``, fp8 units from sm_89, cuBLASLt's ``_scaled_mm`` for large fp8 batches)."""

from __future__ import annotations

from quantrt.backends.triton.gguf_kernel import TritonGGUF
from quantrt.backends.triton.lut4_kernel import TritonBnb4, TritonFp4
from quantrt.backends.triton.vendor import specialise
from quantrt.backends.triton.w8a8_kernel import TritonBlockFp8, TritonFp8, TritonFp8WeightOnly, TritonInt8
from quantrt.backends.triton.wna16_kernel import TritonW4A16, TritonW8A16

from .policy import CUDA

(
    CudaTritonW4A16,
    CudaTritonW8A16,
    CudaTritonFp4,
    CudaTritonBnb4,
    CudaTritonGGUF,
    CudaTritonFp8,
    CudaTritonBlockFp8,
    CudaTritonInt8,
    CudaTritonFp8WeightOnly,
) = specialise(
    CUDA,
    TritonW4A16,
    TritonW8A16,
    TritonFp4,
    TritonBnb4,
    TritonGGUF,
    TritonFp8,
    TritonBlockFp8,
    TritonInt8,
    TritonFp8WeightOnly,
)
