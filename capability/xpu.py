"""Intel GPUs through torch.xpu (the only source: Level Zero has no light Python binding).

The target comes from the device name, because torch reports no architecture id on every version:

=================================================  ======  =======================
name contains                                      arch    matrix_types (XMX)
=================================================  ======  =======================
"Data Center GPU Max"                              pvc     fp16, bf16, int8, tf32
"Data Center GPU Flex", "Arc(TM) A..."             dg2     fp16, bf16, int8
"Arc(TM) B..."                                     bmg     fp16, bf16, int8
=================================================  ======  =======================

Other Intel GPUs (integrated graphics) get ``unknown`` and no matrix types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .software import device_libraries, torch_ops
from .types import UNKNOWN, DeviceCaps

_XMX = frozenset({"fp16", "bf16", "int8"})

#: arch -> matrix types
XPU_ARCHS: dict[str, frozenset[str]] = {"pvc": _XMX | {"tf32"}, "dg2": _XMX, "bmg": _XMX}


def xpu_arch(name: str) -> str:
    """The GPU target from an Intel GPU's marketing name, ``unknown`` when it cannot be told."""
    if "Data Center GPU Max" in name:
        return "pvc"
    if "Data Center GPU Flex" in name or re.search(r"Arc\(TM\) A\d", name):
        return "dg2"
    if re.search(r"Arc\(TM\) B\d", name):
        return "bmg"
    return UNKNOWN


def probe_xpu(torch: Any, libraries: Mapping[str, str]) -> tuple[list[DeviceCaps], list[str]]:
    """Intel GPUs torch.xpu can run on (none when torch has no XPU backend or no device)."""
    xpu = getattr(torch, "xpu", None) if torch is not None else None
    if xpu is None or not xpu.is_available():
        return [], []
    notes: list[str] = []
    registered = torch_ops(torch, "XPU")
    libs = device_libraries("xpu", libraries)
    devices = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        name = str(getattr(props, "name", UNKNOWN))
        arch = xpu_arch(name)
        if arch == UNKNOWN:
            notes.append(f"xpu: no matrix-unit table for {name!r}")
        eus = getattr(props, "gpu_eu_count", None)
        driver = getattr(props, "driver_version", None)
        devices.append(
            DeviceCaps(
                kind="xpu",
                index=i,
                vendor="intel",
                name=name,
                arch=arch,
                memory_bytes=getattr(props, "total_memory", None),
                cores=int(eus) if eus else None,
                matrix_types=XPU_ARCHS.get(arch, frozenset()),
                libraries=libs,
                torch_ops=registered,
                runnable=True,
                driver=str(driver) if driver else UNKNOWN,
                source="torch.xpu",
            )
        )
    return devices, notes
