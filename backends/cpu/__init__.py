"""CPU backend: x86 and Arm CPUs, chosen by the probe's ISA features.

- ``torch_packed``: torch's packed CPU ops (int4 weight-only, int8 weight-only, int8 W8A8).
- ``native/``: C++ kernels with AVX-512/AVX2 intrinsics built on first use (``native/build.py``);
  the kernel classes that call them live beside this file, one module per family:
  ``gguf_native`` (llama.cpp's block types), ``wint_native`` (integer weight-only and int8 W8A8),
  ``lut_native`` (code-book and float formats: NF4/FP4, fp8, NVFP4/MXFP4), ``dense_native`` (a
  GEMV for the dense bf16/fp16 layers a checkpoint leaves unquantized, registered with
  ``register_dense``); ``amx`` (the same layouts on CPUs with AMX: batches from 256 rows dequantize
  row slices to bf16 and multiply them with torch's oneDNN matmul, which runs on AMX tiles).
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from . import amx, gguf_native, lut_native, wint_native
    from .torch_packed import CpuInt4Pack, CpuInt8Pack, CpuIntMM

    for kernel in (CpuInt4Pack, CpuInt8Pack, CpuIntMM):
        registry.register(kernel)
    for module in (gguf_native, wint_native, lut_native, amx):
        for kernel in module.KERNELS:
            registry.register(kernel)
    from .dense_native import make_dense_linear

    registry.register_dense("cpu", make_dense_linear)
