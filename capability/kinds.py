"""Device kinds: the four quantrt knows, and any an installed package adds.

A device kind says where its tensors live in torch (``torch_type``: ROCm GPUs are ``cuda``
devices to torch), how messages name it, which libraries matter to it, and how to find its
devices. An out-of-tree package adds one by publishing a :class:`DeviceKind` in the
``quantrt.devices`` entry-point group (and its kernels in ``quantrt.backends``): the probe then
runs its ``probe``, capability files accept the kind, and dispatch walks the kernel lists
registered for it, with no edit to quantrt.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("quantrt.capability")

ENTRY_POINT_GROUP = "quantrt.devices"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")

#: ``probe(torch, libraries) -> (devices, notes)``: the kind's devices (``DeviceCaps`` with this
#: kind), given the imported torch (or None) and the importable libraries (name -> version)
ProbeFn = Callable[[Any, Mapping[str, str]], tuple[list[Any], list[str]]]


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device kernels can target."""

    name: str
    torch_type: str
    label: str
    libraries: tuple[str, ...] = ()
    probe: ProbeFn | None = None

    def torch_device(self, index: int) -> str:
        """The torch device string of device ``index`` (host-memory kinds are plain ``cpu``)."""
        return "cpu" if self.torch_type == "cpu" else f"{self.torch_type}:{index}"


BUILTIN = (
    DeviceKind("cpu", "cpu", "CPU", ("ipex", "neural_compressor", "bitsandbytes")),
    DeviceKind("cuda", "cuda", "CUDA", ("triton", "cupy", "bitsandbytes", "flashinfer", "deep_gemm")),
    DeviceKind("rocm", "cuda", "ROCm", ("triton", "aiter", "bitsandbytes")),
    DeviceKind("xpu", "xpu", "XPU", ("triton", "ipex", "neural_compressor", "bitsandbytes")),
)

_KINDS: dict[str, DeviceKind] | None = None
_ERRORS: dict[str, str] = {}
_LOCK = threading.Lock()


def kinds() -> dict[str, DeviceKind]:
    """Every device kind: the built-in four, then those installed packages publish (loaded once)."""
    global _KINDS
    if _KINDS is None:
        with _LOCK:
            if _KINDS is None:
                found = {k.name: k for k in BUILTIN}
                _ERRORS.clear()
                for ep in sorted(
                    importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
                ):
                    _load(ep, found)
                _KINDS = found
    return _KINDS


def _load(ep: Any, found: dict[str, DeviceKind]) -> None:
    try:
        obj = ep.load()
        kind = obj() if callable(obj) and not isinstance(obj, DeviceKind) else obj
        if not isinstance(kind, DeviceKind):
            raise TypeError(f"expected a DeviceKind, found {type(kind).__name__}")
        if not _NAME.fullmatch(kind.name):
            raise ValueError(f"kind name {kind.name!r} is not [a-z][a-z0-9_]{{0,31}}")
        if kind.name in found:
            raise ValueError(f"device kind {kind.name!r} is already defined")
        found[kind.name] = kind
    except Exception as e:  # a broken package must not break the probe
        _ERRORS[ep.name] = f"{type(e).__name__}: {e}"
        log.warning("quantrt: device kind %r (%s) failed to load: %s", ep.name, ep.value, e)


def kind_of(name: str) -> DeviceKind | None:
    """The device kind called ``name``, or None."""
    return kinds().get(name)


def load_errors() -> dict[str, str]:
    """Entry points of ``quantrt.devices`` that failed to load, with why."""
    kinds()
    return dict(_ERRORS)


def plugin_kinds() -> Iterable[DeviceKind]:
    """The kinds installed packages added (the built-ins have their own probes)."""
    builtin = {k.name for k in BUILTIN}
    return [k for k in kinds().values() if k.name not in builtin]


def reset_kinds() -> None:
    """Forget loaded kinds (tests that install a device package call this)."""
    global _KINDS
    with _LOCK:
        _KINDS = None
