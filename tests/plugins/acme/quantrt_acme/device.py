"""The ``acme`` device kind: how quantrt finds Acme devices and where their tensors live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantrt.capability import DeviceCaps, DeviceKind


def probe(torch: Any, libraries: Mapping[str, str]) -> tuple[list[DeviceCaps], list[str]]:
    """One emulated Acme device, runnable wherever torch imports."""
    dev = DeviceCaps(
        kind="acme",
        index=0,
        vendor="acme",
        name="Acme NPU (host emulation)",
        arch="acme1",
        features=frozenset({"int8_dot"}),
        runnable=torch is not None,
        source="quantrt_acme.device",
    )
    return [dev], []


ACME = DeviceKind("acme", torch_type="cpu", label="Acme NPU", probe=probe)
