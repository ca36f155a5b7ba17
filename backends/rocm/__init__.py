"""AMD backend: which kernels run on AMD GPUs (MI300-class first), in what order.

Today: hipBLASLt fp8 and int8 through torch's ops, with MI300's e4m3fnuz flavour. AITER and
Quark paths register here when importable, once they have kernels.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group."""
    from .torch_ops import RocmIntMM, RocmScaledMMFp8, RocmScaledMMFp8Fnuz

    registry.register_ordered(
        [
            RocmScaledMMFp8Fnuz,  # MI300's e4m3fnuz flavour, where the device computes in it
            RocmIntMM,
            RocmScaledMMFp8,  # OCP e4m3 (MI350 and later)
        ]
    )
