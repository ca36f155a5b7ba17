"""The kernel contract and the registry: the public API every backend folder builds on.

A kernel is one implementation of one or more schemes on one kind of device. Dispatch asks
each candidate ``supports(spec, caps)`` and keeps every answer, so a user can see why a
kernel was not chosen. ``prepare`` runs once at load (the only place a weight is repacked);
``apply`` runs per call and obeys the hot-path rules in DESIGN.md: no host synchronisation,
no environment reads, no allocation beyond the output and the declared workspace.

Backends register kernels from a ``register(registry)`` function published in the
``quantrt.backends`` entry-point group, in-tree and out-of-tree alike.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .canonical import CanonicalWeight
from .capability import DeviceCaps
from .specs import LayerSpec

log = logging.getLogger("quantrt.kernels")

ENTRY_POINT_GROUP = "quantrt.backends"


@dataclass(frozen=True)
class Verdict:
    """A kernel's answer to "can you implement this layer here?".

    ``predicate`` names the condition that failed (``"K % 128 == 0"``) and ``values`` the
    values it was evaluated on (``{"K": 4100}``), so tests and users see exactly why.
    """

    ok: bool
    predicate: str = ""
    values: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    @classmethod
    def yes(cls, note: str = "") -> Verdict:
        return cls(True, note=note)

    @classmethod
    def no(cls, predicate: str, note: str = "", **values: Any) -> Verdict:
        return cls(False, predicate, dict(values), note)

    @property
    def reason(self) -> str:
        if self.ok:
            return self.note or "supported"
        vals = ", ".join(f"{k}={_show(v)}" for k, v in self.values.items())
        text = f"requires {self.predicate}" + (f" (found {vals})" if vals else "")
        return text + (f": {self.note}" if self.note else "")

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "predicate": self.predicate,
            "values": {k: _show(v) for k, v in self.values.items()},
            "reason": self.reason,
        }


def _show(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, (frozenset, set)):
        return sorted(v)
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def check(*conditions: tuple[bool, str, Mapping[str, Any]]) -> Verdict:
    """The first failing ``(holds, predicate, values)`` as a Verdict, else yes.

    Lets ``supports`` read as a list of requirements, each with its own reason.
    """
    for holds, predicate, values in conditions:
        if not holds:
            return Verdict.no(predicate, **values)
    return Verdict.yes()


class Kernel(ABC):
    """One implementation of a set of schemes on one kind of device.

    Subclasses set the class attributes and implement ``supports``, ``prepare`` and
    ``apply``. ``emulated`` kernels reproduce the numbers without native arithmetic;
    ``is_substitute`` says when a kernel runs a scheme's weights but keeps activations in
    16-bit (a weight-only substitute). Both are labelled in plans and tested against the
    matching reference.
    """

    name: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    device_kinds: ClassVar[tuple[str, ...]] = ()
    #: lower runs first among one device kind's candidates
    priority: ClassVar[int] = 100
    emulated: ClassVar[bool] = False
    #: the kernel quantizes a weight-only scheme's activations to 8-bit blocks (llama.cpp's way for
    #: GGUF): it declares so, and matches the reference within that quantization's error (< 1e-2)
    quantizes_activations: ClassVar[bool] = False
    description: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def supports(cls, spec: LayerSpec, caps: DeviceCaps) -> Verdict:
        """Whether this kernel implements the layer on a device with these capabilities."""

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        """True when this kernel runs an activation-quantized scheme with 16-bit activations."""
        return False

    @abstractmethod
    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Any:
        """Repack canonical tensors (already on the target device) into this kernel's layout."""

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        """Scratch memory ``apply`` may use for batches up to ``max_m`` rows."""
        return 0

    @abstractmethod
    def apply(
        self, state: Any, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``y = x @ W.T + bias`` for a 2-D ``x`` [M, K]; writes into ``out`` when given."""

    def strategy(self, state: Any, m: int) -> str:
        """Which of the kernel's strategies serves a batch of ``m`` rows (for plans and benchmarks)."""
        return "default"

    @classmethod
    def label(cls, spec: LayerSpec) -> str:
        if cls.backend == "reference":
            return "reference"
        if cls.emulated:
            return "emulated"
        return "weight-only substitute" if cls.is_substitute(spec) else "native"


class Registry:
    """Every kernel the loaded backends registered, in registration order."""

    def __init__(self) -> None:
        self._kernels: list[type[Kernel]] = []
        self._names: dict[str, type[Kernel]] = {}
        self.backends: dict[str, str] = {}  # backend name -> where it came from
        self.load_errors: dict[str, str] = {}
        #: device kind -> factory(weight, bias, act_dtype) -> nn.Module for dense (unquantized)
        #: linears; a backend with a faster dense path than torch's registers one
        self.dense_linear: dict[str, Callable[..., Any]] = {}

    def register_dense(self, kind: str, factory: Callable[..., Any]) -> None:
        """Serve dense float linears on ``kind`` devices with ``factory(weight, bias, act_dtype)``."""
        if kind in self.dense_linear and self.dense_linear[kind] is not factory:
            raise ValueError(f"a dense linear factory for {kind!r} is registered twice")
        self.dense_linear[kind] = factory

    def register(self, kernel: type[Kernel]) -> type[Kernel]:
        """Add a kernel class (usable as a decorator). Names are unique."""
        if not (isinstance(kernel, type) and issubclass(kernel, Kernel)):
            raise TypeError(f"register() takes a Kernel subclass, found {kernel!r}")
        if not kernel.name or not kernel.backend or not kernel.device_kinds:
            raise ValueError(f"{kernel.__name__}: set name, backend and device_kinds")
        if kernel.name in self._names and self._names[kernel.name] is not kernel:
            raise ValueError(
                f"kernel name {kernel.name!r} is registered twice "
                f"({self._names[kernel.name].__module__} and {kernel.__module__})"
            )
        if kernel.name not in self._names:
            self._kernels.append(kernel)
            self._names[kernel.name] = kernel
        return kernel

    def get(self, name: str) -> type[Kernel] | None:
        return self._names.get(name)

    def names(self) -> list[str]:
        return [k.name for k in self._kernels]

    def candidates(self, kind: str) -> list[type[Kernel]]:
        """A device kind's kernels in priority order (stable for equal priorities)."""
        ks = [k for k in self._kernels if kind in k.device_kinds]
        return sorted(ks, key=lambda k: k.priority)

    def all(self) -> list[type[Kernel]]:
        return list(self._kernels)


_REGISTRY: Registry | None = None
_LOCK = threading.Lock()


def registry() -> Registry:
    """The process-wide registry, with every installed backend loaded (once)."""
    global _REGISTRY
    if _REGISTRY is None:
        with _LOCK:
            if _REGISTRY is None:
                reg = Registry()
                from .reference.kernel import ReferenceKernel

                reg.register(ReferenceKernel)
                reg.backends["reference"] = "quantrt.reference"
                load_entry_points(reg)
                _REGISTRY = reg
    return _REGISTRY


def load_entry_points(reg: Registry, entry_points: Iterable[Any] | None = None) -> None:
    """Call every ``quantrt.backends`` entry point's ``register(registry)``.

    A backend that fails to load is recorded in ``reg.load_errors`` and logged; it never
    takes the others down.
    """
    eps = (
        entry_points if entry_points is not None else importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in reg.backends:
            continue
        try:
            fn: Callable[[Registry], None] = ep.load()
            fn(reg)
            reg.backends[ep.name] = ep.value
        except Exception as e:  # a broken plugin must not break the others
            reg.load_errors[ep.name] = f"{type(e).__name__}: {e}"
            log.warning("quantrt: backend %r (%s) failed to load: %s", ep.name, ep.value, e)


def reset_registry() -> None:
    """Forget loaded backends (tests that install a backend package call this)."""
    global _REGISTRY
    with _LOCK:
        _REGISTRY = None
