"""The portable Triton kernels (``backends/triton``) as AMD's kernels: each class named
``rocm.<short name>`` and run with :data:`.policy.ROCM` (CDNA GPUs, AMD's tile tables in
``tunings/``, fp8 in e4m3fnuz on MI300 and OCP e4m3 on MI350)."""

from __future__ import annotations

from quantrt.backends.triton.gguf_kernel import TritonGGUF
from quantrt.backends.triton.lut4_kernel import TritonBnb4, TritonFp4
from quantrt.backends.triton.vendor import specialise
from quantrt.backends.triton.w8a8_kernel import TritonBlockFp8, TritonFp8, TritonFp8WeightOnly, TritonInt8
from quantrt.backends.triton.wna16_kernel import TritonW4A16, TritonW8A16

from .policy import ROCM

(
    RocmTritonW4A16,
    RocmTritonW8A16,
    RocmTritonFp4,
    RocmTritonBnb4,
    RocmTritonGGUF,
    RocmTritonFp8,
    RocmTritonBlockFp8,
    RocmTritonInt8,
    RocmTritonFp8WeightOnly,
) = specialise(
    ROCM,
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
