"""What every integer weight-only (W4A16/W8A16) kernel of this folder needs, stated once.

Each kernel's ``can_implement`` is this list plus its own conditions (the tile or chunk its group
size must fit, the library that builds it), so the shared requirements read the same in every
``explain`` and cannot drift apart between kernels. The op and the activation dtypes are the
kernels' declarations, checked by ``Kernel.supports`` before any of these.
"""

from __future__ import annotations

from typing import Any

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
    s = spec.scheme
    return [
        *device_conditions(spec, caps, library, built_by),
        (
            s.weight == "int" and s.bits == bits,
            f"{bits}-bit integer weights",
            {"weight": s.weight, "bits": s.bits},
        ),
        (s.weight_only, "weight-only scheme", {"act": s.act}),
        (s.granularity in ("group", "channel"), "group or channel scales", {"granularity": s.granularity}),
        (
            not s.act_order or spec.k_full,
            "act-order with the full K on this rank",
            {"K_part": spec.K_part, "K": spec.K},
        ),
    ]
