"""quantrt-acme: an example vendor package outside quantrt's tree.

It adds the ``acme`` device kind (``device.py``, entry point ``quantrt.devices``) and registers one
kernel list for it (``register``, entry point ``quantrt.backends``). Acme devices keep their tensors
in host memory, so the example runs anywhere torch does.
"""

from __future__ import annotations

from typing import Any


def register(registry: Any) -> None:
    """Entry point of the ``quantrt.backends`` group: the acme kernels, best first."""
    from .kernel import AcmeW8A16

    registry.register_ordered([AcmeW8A16], device_kind="acme")
