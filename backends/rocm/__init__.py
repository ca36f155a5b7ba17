"""AMD backend: which kernels run on AMD GPUs (MI300-class first), in what order.

Today: hipBLASLt fp8 and int8 through torch's ops, with MI300's e4m3fnuz flavour. AITER and
Quark paths register here when importable, once they have kernels.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from .torch_ops import RocmIntMM, RocmScaledMMFp8, RocmScaledMMFp8Fnuz

    for kernel in (RocmScaledMMFp8Fnuz, RocmScaledMMFp8, RocmIntMM):
        registry.register(kernel)
