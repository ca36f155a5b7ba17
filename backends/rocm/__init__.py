"""AMD backend: which kernels run on AMD GPUs (MI300-class first), in what order.

AITER's fp8 GEMMs first where ``aiter`` is importable (``aiter_ops.py``); hipBLASLt fp8 and int8
through torch's ops next where they take the scheme (MI300's e4m3fnuz
flavour, OCP e4m3 on MI350); then the portable Triton kernels (``backends/triton``) named and tuned
for AMD in ``triton_kernels.py`` with ``policy.py``: every weight-only family (int4/int8, NVFP4,
MXFP4, bitsandbytes, GGUF), fp8 W8A8 per tensor, channel and block, fp8 weight-only and int8 W8A8.
MoE experts run per expert on those (``experts_loop``); the KV cache on the Triton KV kernels.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from quantrt.backends.triton.kv_kernel import TritonKV
    from quantrt.moe import experts_loop

    from .aiter_ops import RocmAiterBlockFp8, RocmAiterFp8
    from .policy import ROCM
    from .torch_ops import RocmIntMM, RocmScaledMMFp8, RocmScaledMMFp8Fnuz
    from .triton_kernels import (
        RocmTritonBlockFp8,
        RocmTritonBnb4,
        RocmTritonFp4,
        RocmTritonFp8,
        RocmTritonFp8WeightOnly,
        RocmTritonGGUF,
        RocmTritonInt8,
        RocmTritonW4A16,
        RocmTritonW8A16,
    )

    linear = [
        RocmAiterFp8,  # AITER's fp8 GEMMs where the package is importable (documented ahead of hipBLASLt)
        RocmAiterBlockFp8,
        RocmScaledMMFp8Fnuz,  # MI300's e4m3fnuz flavour, where the device computes in it
        RocmIntMM,
        RocmScaledMMFp8,  # OCP e4m3 (MI350 and later)
        RocmTritonW4A16,  # portable Triton: every weight-only layout
        RocmTritonW8A16,
        RocmTritonFp4,
        RocmTritonBnb4,
        RocmTritonGGUF,
        RocmTritonFp8,  # W8A8 fp8 in the device's flavour, per tensor/channel, and block fp8
        RocmTritonBlockFp8,
        RocmTritonInt8,
        RocmTritonFp8WeightOnly,  # fp8 weights decoded by bit tricks
    ]
    registry.register_ordered([*linear, *(experts_loop(k) for k in linear)])
    registry.register_kv("cuda", TritonKV(ROCM, "rocm.triton"))  # ROCm torch's devices are "cuda"
