"""Intel XPU backend: which kernels run on Intel GPUs (Data Center GPU Max, Arc).

No XPU kernel is registered yet: every scheme plans to the reference on the pvc and arc
presets, and ``quantrt explain`` says so. Triton kernels with XPU tuning and the IPEX/INC
paths register here when they exist.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group (nothing to register yet)."""
    del registry
