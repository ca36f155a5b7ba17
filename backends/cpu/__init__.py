"""CPU backend: x86 and Arm CPUs, chosen by the probe's ISA features.

- ``torch_packed``: torch's packed CPU ops (int4 weight-only, int8 weight-only, int8 W8A8).
- ``native/``: C++ kernels with AVX-512/AVX2 intrinsics built on first use (``native/build.py``);
  the kernel classes that call them live beside this file, one module per family:
  ``gguf_native`` (llama.cpp's block types), ``wint_native`` (integer weight-only and int8 W8A8),
  ``wint_gemv`` and ``lut_gemv`` (the integer and code-book layouts' GEMVs for CPUs without AVX-512:
  AVX2 and NEON builds),
  ``lut_native`` (code-book and float formats: NF4/FP4, fp8, NVFP4/MXFP4), ``dense_native`` (a
  GEMV for the dense bf16/fp16 layers a checkpoint leaves unquantized, registered with
  ``register_dense``), ``kv_native`` (the KV cache's quantize-on-write and decode attention,
  registered with ``register_kv``); ``amx`` (the same layouts on CPUs with AMX: the native strategies for small
  batches, then the native panel GEMM on AMX tiles, or, without whole tiles, bf16 row slices through
  torch's oneDNN matmul from ``amx.AMX_FROM_M`` rows; GGUF from its own per-type thresholds).
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from quantrt.moe import experts_loop

    from .amx import AmxGGUF, AmxLut, AmxWint
    from .dense_native import make_dense_linear
    from .gguf_native import CpuNativeGGUF
    from .kv_native import NativeKV
    from .lut_gemv import Avx2Lut, NeonLut
    from .lut_native import NativeLut
    from .torch_packed import CpuInt4Pack, CpuInt8Pack, CpuIntMM
    from .wint_gemv import Avx2Wint, NeonWint
    from .wint_native import NativeW8A8Int8, NativeWint

    linear = [
        AmxWint,  # CPUs with AMX bf16 tiles: the native layouts, large batches on the tiles
        AmxLut,
        AmxGGUF,
        CpuNativeGGUF,  # the native C++ kernels (AVX-512 VNNI, AVX2, scalar)
        NativeWint,
        NativeW8A8Int8,
        NativeLut,
        Avx2Wint,  # the same layouts built for AVX2 + FMA (CPUs without AVX-512)
        Avx2Lut,
        NeonWint,  # the NEON builds (aarch64)
        NeonLut,
        CpuInt4Pack,  # torch's packed CPU ops, where no native kernel can be built
        CpuInt8Pack,
        CpuIntMM,
    ]
    # MoE experts: each expert on the same kernels, in the same order, its tokens gathered
    registry.register_ordered([*linear, *(experts_loop(k) for k in linear)])
    registry.register_dense("cpu", make_dense_linear)
    registry.register_kv("cpu", NativeKV())  # the KV cache: native quantize-on-write and decode
