"""Intel XPU backend: which kernels run on Intel GPUs (Data Center GPU Max, Arc), in what order.

The portable Triton kernels (``backends/triton``) through Intel's Triton backend on ``torch.xpu``,
named and tuned for Intel in ``triton_kernels.py`` with ``policy.py``: every weight-only family
(int4/int8, NVFP4, MXFP4, bitsandbytes, GGUF), fp8 weight-only (W8A8 fp8 checkpoints run as its
weight-only substitute: no Intel GPU multiplies fp8) and int8 W8A8. MoE experts run per expert on
those (``experts_loop``); the KV cache on the Triton KV kernels. IPEX is not used: docs/backends.md says why.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from quantrt.backends.triton.kv_kernel import TritonKV
    from quantrt.moe import experts_loop

    from .policy import XPU
    from .triton_kernels import (
        XpuTritonBnb4,
        XpuTritonFp4,
        XpuTritonFp8WeightOnly,
        XpuTritonGGUF,
        XpuTritonInt8,
        XpuTritonW4A16,
        XpuTritonW8A16,
    )

    linear = [
        XpuTritonW4A16,
        XpuTritonW8A16,
        XpuTritonFp4,
        XpuTritonBnb4,
        XpuTritonGGUF,
        XpuTritonInt8,
        XpuTritonFp8WeightOnly,
    ]
    registry.register_ordered([*linear, *(experts_loop(k) for k in linear)])
    registry.register_kv("xpu", TritonKV(XPU, "xpu.triton"))
