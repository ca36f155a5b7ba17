"""What every integer weight-only (W4A16/W8A16) kernel of this folder needs, stated once.

Each kernel's ``can_implement`` is this list plus its own conditions (the tile or chunk its group
size must fit, the library that builds it), so the shared requirements read the same in every
``explain`` and cannot drift apart between kernels. The op and the activation dtypes are the
kernels' declarations, checked by ``Kernel.supports`` before any of these.
"""

from __future__ import annotations

from typing import Any

from quantrt.backends.triton.wna16_kernel import wna16_scheme_conditions
from quantrt.specs import LayerSpec

Condition = tuple[bool, str, dict[str, Any]]


def device_conditions(spec: LayerSpec, caps: Any, library: str, built_by: str) -> list[Condition]:
    """What the tensor-core kernel needs of the device, whatever the weights."""
    return [
        ((caps.sm or 0) >= 80, "sm >= 80 (mma.sync and cp.async)", {"sm": caps.sm}),
        (library in caps.libraries, f"{library} importable ({built_by})", {"libraries": caps.libraries}),
    ]


def wna16_conditions(spec: LayerSpec, caps: Any, bits: int, library: str, built_by: str) -> list[Condition]:
    """The shared requirements, in the order ``explain`` reports the first that fails."""
    return [*device_conditions(spec, caps, library, built_by), *wna16_scheme_conditions(spec, bits)]
