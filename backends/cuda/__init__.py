"""NVIDIA backend: which kernels run on NVIDIA GPUs, in what order, tuned how.

The tensor-core W4A16/W8A16 kernel in CUDA C++ (``mma_wna16.py``, ``kernels/``, compiled through
CuPy) ranks first where CuPy is importable, and serves fp8 weight-only (``mma_fp8.py``), NVFP4/MXFP4 and
bitsandbytes NF4/FP4 weight-only too (``mma_codebook.py``); the portable Triton kernels
(``backends/triton``, named and tuned for NVIDIA in ``triton_kernels.py`` with ``policy.py``) next:
W4A16/W8A16, fp8 (W8A8 per tensor/channel, block fp8, weight-only) and int8 W8A8, the 4-bit
code-book kernels for NVFP4, MXFP4 and bitsandbytes NF4/FP4 and GGUF's ten block types, with a CUDA GEMV for
q4_k/q6_k ahead of it (``gguf_gemv.py``) and the other seven on the tensor-core kernel ahead of both
(``mma_gguf.py``: q4_k, q8_0, then q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q5_k; q6_k there by name); W4A4 NVFP4 on Blackwell's fp4
units through torch (``torch_fp4.py``); then torch's own ops (tinygemm int4, cuBLASLt fp8 and int8). Launch shapes
come from ``tunings/``.

MoE experts (``op="grouped"``): the fused Triton grouped GEMMs (``triton_moe.py``: tokens sorted by
expert, one launch per projection over every expert, dequantization in the K loop) for int4/int8
weight-only, fp8 W8A8 (tensor, channel, block), int8 W8A8 and NVFP4/MXFP4 weight-only; every other
scheme runs per expert on the linear kernels above, in the same order (``experts_loop``: one host
synchronisation per call, so those layers do not capture into CUDA graphs).
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from quantrt.backends.triton.kv_kernel import TritonKV
    from quantrt.moe import experts_loop

    from .gguf_gemv import CudaGemvGGUF
    from .kv_mma import CudaKV
    from .mma_codebook import CudaMmaBnb4, CudaMmaFp4
    from .mma_fp8 import CudaMmaFp8
    from .mma_gguf import CudaMmaGGUF, CudaMmaGGUFBlocks, CudaMmaGGUFQ8
    from .mma_narrow import CudaMmaNarrow
    from .mma_wna16 import CudaMmaW4A16, CudaMmaW8A16
    from .policy import CUDA
    from .torch_fp4 import CudaScaledMMNvfp4
    from .torch_ops import CudaIntMM, CudaScaledMMFp8, CudaTinygemm
    from .triton_kernels import (
        CudaTritonBlockFp8,
        CudaTritonBnb4,
        CudaTritonFp4,
        CudaTritonFp8,
        CudaTritonFp8WeightOnly,
        CudaTritonGGUF,
        CudaTritonInt8,
        CudaTritonW4A16,
        CudaTritonW8A16,
    )
    from .triton_moe import FUSED_MOE_KERNELS

    linear = [
        CudaMmaW4A16,  # tensor-core CUDA C++ (CuPy): int4/int8 weight-only, the fastest where it runs
        CudaMmaW8A16,
        CudaMmaNarrow,  # 2/3-bit integer weight-only, widened to nibbles on the int4 kernel
        CudaMmaFp8,  # fp8 weight-only (and W8A8 fp8 where the GPU lacks fp8 units) on the same kernel
        CudaScaledMMNvfp4,  # W4A4 NVFP4 on Blackwell's fp4 units
        CudaMmaFp4,  # NVFP4/MXFP4 and bitsandbytes 4-bit weight-only on the tensor-core kernel
        CudaMmaBnb4,
        CudaMmaGGUF,  # GGUF q4_k and q8_0 on the tensor-core kernel
        CudaMmaGGUFQ8,
        CudaGemvGGUF,  # GGUF q4_k/q6_k: a CUDA GEMV for small batches, then the Triton GGUF paths
        CudaMmaGGUFBlocks,  # GGUF q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q5_k (q6_k by name) on the tensor-core kernel
        CudaTritonW4A16,  # portable Triton: every W4A16/W8A16 layout (act-order, any group)
        CudaTritonW8A16,
        CudaTritonFp4,
        CudaTritonBnb4,
        CudaTritonGGUF,  # all ten GGUF types
        CudaTritonFp8,  # W8A8 fp8, per tensor/channel, and block fp8
        CudaTritonBlockFp8,
        CudaTritonInt8,
        CudaTritonFp8WeightOnly,  # fp8 weights decoded by bit tricks, on GPUs without fp8 units
        CudaScaledMMFp8,  # torch's ops: cuBLASLt fp8 and int8, tinygemm int4
        CudaIntMM,
        CudaTinygemm,
    ]
    fused_moe_kernels = list(FUSED_MOE_KERNELS)  # MoE experts: one fused grouped GEMM per projection
    # then every linear kernel looped over the experts, for the schemes no fused kernel takes
    registry.register_ordered([*linear, *fused_moe_kernels, *(experts_loop(k) for k in linear)])
    # the KV cache: quantize-on-write and split-K decode in Triton for every scheme; 4-bit
    # TurboQuant decodes on a CUDA C++ kernel first
    triton_kv = TritonKV(CUDA, "triton")
    registry.register_kv("cuda", CudaKV(triton_kv))
    registry.register_kv("cuda", triton_kv)
