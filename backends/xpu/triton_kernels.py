"""The portable Triton kernels (``backends/triton``) as Intel's kernels: each class named
``xpu.<short name>`` and run with :data:`.policy.XPU` (XMX GPUs, Intel's tile tables in
``tunings/``; fp8 weights decoded in registers, as no Intel GPU multiplies fp8)."""

from __future__ import annotations

from quantrt.backends.triton.gguf_kernel import TritonGGUF
from quantrt.backends.triton.lut4_kernel import TritonBnb4, TritonFp4
from quantrt.backends.triton.vendor import specialise
from quantrt.backends.triton.w8a8_kernel import TritonFp8WeightOnly, TritonInt8
from quantrt.backends.triton.wna16_kernel import TritonW4A16, TritonW8A16

from .policy import XPU

(
    XpuTritonW4A16,
    XpuTritonW8A16,
    XpuTritonFp4,
    XpuTritonBnb4,
    XpuTritonGGUF,
    XpuTritonInt8,
    XpuTritonFp8WeightOnly,
) = specialise(
    XPU, TritonW4A16, TritonW8A16, TritonFp4, TritonBnb4, TritonGGUF, TritonInt8, TritonFp8WeightOnly
)
