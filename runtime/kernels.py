"""The kernel contract and the registry: the public API every backend folder builds on.

A kernel is one implementation of one or more schemes on one kind of device. Dispatch asks
each candidate ``supports(spec, caps)`` and keeps every answer, so a user can see why a kernel
was not chosen. The base class checks what kernels declare (ops, activation and output dtypes)
and then asks the kernel's ``can_implement``. ``prepare`` runs once at load (the only place a
weight is repacked) and returns a :class:`~quantrt.prepared.Prepared`: one layout and the
strategies over it; calls go through that object, which owns the shared prologue, the workspace
and the traced op, and obey the hot-path rules in DESIGN.md (no host synchronisation, no
environment reads, no allocation beyond the output and the workspace's growth).

Backends register from a ``register(registry)`` function published in the ``quantrt.backends``
entry-point group, in-tree and out-of-tree alike: one ``register_ordered([...])`` list per device
kind, whose order is the dispatch policy.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .canonical import CanonicalWeight
from .capability import DeviceCaps
from .prepared import Prepared, Strategy
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

    Subclasses set ``name`` and what they take (``ops``, ``act_dtypes``, ``out_dtypes``) and
    implement ``can_implement`` and ``prepare``; ``backend`` and ``device_kinds`` are stamped by
    :meth:`Registry.register_ordered`. ``emulated`` kernels reproduce the numbers without native
    arithmetic; ``is_substitute`` says when a kernel runs a scheme's weights but keeps activations
    in 16-bit (a weight-only substitute). Both are labelled in plans and tested against the
    matching reference.
    """

    name: ClassVar[str] = ""
    #: the backend whose list registered this kernel (set by ``register_ordered``)
    backend: ClassVar[str] = ""
    #: the device kinds whose lists hold this kernel (set by ``register_ordered``)
    device_kinds: ClassVar[tuple[str, ...]] = ()
    #: the layer ops this kernel computes
    ops: ClassVar[tuple[str, ...]] = ("linear",)
    #: activation dtypes the layer may be planned with (and calls may pass)
    act_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    #: output dtypes the kernel writes (None: the same as ``act_dtypes``)
    out_dtypes: ClassVar[tuple[torch.dtype, ...] | None] = None
    emulated: ClassVar[bool] = False
    #: the kernel quantizes a weight-only scheme's activations to 8-bit blocks (llama.cpp's way for
    #: GGUF): it declares so, and matches the reference within that quantization's error (< 1e-2)
    quantizes_activations: ClassVar[bool] = False
    #: the kernel keeps activations 16-bit: given a scheme that quantizes them, it runs the weights
    #: alone as a labelled substitute (:meth:`is_substitute`)
    weight_only: ClassVar[bool] = False
    description: ClassVar[str] = ""

    def __init__(self, caps: DeviceCaps | None = None) -> None:
        #: the device the kernel runs on (dispatch passes the probed one; None: not known)
        self.caps = caps

    @classmethod
    def supports(cls, spec: LayerSpec, caps: DeviceCaps) -> Verdict:
        """Whether this kernel implements the layer on a device with these capabilities: the
        declared ops and dtypes first, then :meth:`can_implement`."""
        outs = cls.out_dtypes if cls.out_dtypes is not None else cls.act_dtypes
        v = check(
            (spec.op in cls.ops, f"op in {_names(cls.ops)}", {"op": spec.op}),
            (
                spec.act_dtype in cls.act_dtypes,
                f"activations {_names(cls.act_dtypes)}",
                {"act_dtype": spec.act_dtype},
            ),
            (spec.output_dtype in outs, f"output {_names(outs)}", {"out_dtype": spec.output_dtype}),
        )
        return v if not v else cls.can_implement(spec, caps)

    @classmethod
    @abstractmethod
    def can_implement(cls, spec: LayerSpec, caps: DeviceCaps) -> Verdict:
        """The kernel's own requirements (schemes, shapes, hardware), each with its reason."""

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        """True when this kernel runs an activation-quantized scheme with 16-bit activations: a
        weight-only kernel (``weight_only``) given a scheme that quantizes activations."""
        return cls.weight_only and spec.scheme.act is not None

    @abstractmethod
    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        """Repack canonical tensors (already on the target device) into this kernel's layout and
        name the strategies that run it (build the result with :meth:`prepared`)."""

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        """Scratch memory a call may use for batches up to ``max_m`` rows."""
        return 0

    def prepared(
        self,
        layout: Any,
        strategies: Sequence[Strategy],
        spec: LayerSpec,
        device: Any = None,
        rows: Any = None,
        act_dtypes: Sequence[torch.dtype] | None = None,
        workspace: Callable[[int], int] | None = None,
    ) -> Prepared:
        """The :class:`Prepared` for ``layout``: this layer's shape and dtypes, the workspace (bytes
        for batches up to m rows: ``workspace``, a need of this layout, else :meth:`workspace_bytes`
        when the kernel overrides it) and the optional exact row access."""
        ws = workspace
        if ws is None and type(self).workspace_bytes is not Kernel.workspace_bytes:
            ws = lambda m: self.workspace_bytes(spec, m)  # noqa: E731
        return Prepared(
            layout,
            strategies,
            K=spec.K_part,
            N=spec.N_part,
            out_dtype=spec.output_dtype,
            act_dtypes=act_dtypes or self.act_dtypes,
            device=device if device is not None else "cpu",
            workspace=ws,
            rows=rows,
            kernel=self.name,
        )

    def apply(
        self,
        state: Prepared,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``y = x @ W.T + bias`` for a 2-D ``x`` [M, K]; writes into ``out`` when given."""
        return state(x, bias, out)

    def strategy(self, state: Prepared, m: int) -> str:
        """Which of the prepared layer's strategies serves a batch of ``m`` rows."""
        return state.strategy(m).name

    @classmethod
    def label(cls, spec: LayerSpec) -> str:
        if cls.backend == "reference":
            return "reference"
        if cls.emulated:
            return "emulated"
        return "weight-only substitute" if cls.is_substitute(spec) else "native"


def _names(values: Sequence[Any]) -> str:
    return "(" + ", ".join(str(_show(v)) for v in values) + ")"


@dataclass(frozen=True)
class OrderedList:
    """One backend's kernels for one device kind, in the order dispatch tries them."""

    backend: str
    device_kind: str
    kernels: tuple[type[Kernel], ...]
    ahead: bool = False


class Registry:
    """Every kernel the loaded backends registered, as one ordered list per backend and device kind."""

    def __init__(self) -> None:
        self.lists: list[OrderedList] = []
        self._names: dict[str, type[Kernel]] = {}
        self.backends: dict[str, str] = {}  # backend name -> where it came from
        self.load_errors: dict[str, str] = {}
        #: device kind -> factory(weight, bias, act_dtype) -> nn.Module for dense (unquantized)
        #: linears; a backend with a faster dense path than torch's registers one
        self.dense_linear: dict[str, Callable[..., Any]] = {}
        #: device kind -> KV-cache kernels (quantize-on-write and decode attention), best first;
        #: each a :class:`quantrt.kv.kernels.KVKernels`; torch's is tried after them everywhere
        self.kv: dict[str, list[Any]] = {}
        #: the kernel every device kind falls back to (the reference), tried after every list
        self.fallback: type[Kernel] | None = None
        self._loading: str | None = None  # the entry point whose register() is running

    def register_dense(self, kind: str, factory: Callable[..., Any]) -> None:
        """Serve dense float linears on ``kind`` devices with ``factory(weight, bias, act_dtype)``."""
        if kind in self.dense_linear and self.dense_linear[kind] is not factory:
            raise ValueError(f"a dense linear factory for {kind!r} is registered twice")
        self.dense_linear[kind] = factory

    def register_kv(self, kind: str, kernels: Any) -> None:
        """Serve KV caches on ``kind`` devices with ``kernels`` (a ``quantrt.kv.KVKernels``),
        after those registered before it."""
        mine = self.kv.setdefault(kind, [])
        if any(k.name == kernels.name for k in mine):
            raise ValueError(f"KV kernels {kernels.name!r} are registered twice for {kind!r}")
        mine.append(kernels)

    def register_ordered(
        self,
        kernels: Sequence[type[Kernel]],
        *,
        device_kind: str | None = None,
        backend: str | None = None,
        ahead: bool = False,
    ) -> None:
        """Register one backend's kernels for one device kind, best first: dispatch tries them top
        to bottom and the first that supports a layer runs it.

        ``backend`` defaults to the entry point being loaded and ``device_kind`` to the backend's
        name. Lists for one device kind are tried in the order backends loaded; ``ahead`` puts a
        list before the lists loaded earlier (an out-of-tree package overriding in-tree kernels).
        """
        backend = backend or self._loading
        if not backend:
            raise ValueError("register_ordered(): name the backend (backend=...) outside an entry point")
        kind = device_kind or backend
        seen: set[str] = set()
        for k in kernels:
            if not (isinstance(k, type) and issubclass(k, Kernel)):
                raise TypeError(f"register_ordered() takes Kernel subclasses, found {k!r}")
            if not k.name:
                raise ValueError(f"{k.__name__}: set name")
            other = self._names.get(k.name)
            if (other is not None and other is not k) or k.name in seen:
                where = other.__module__ if other is not None else k.__module__
                raise ValueError(f"kernel name {k.name!r} is registered twice ({where} and {k.__module__})")
            own = vars(k).get("backend")
            if own and own != backend:
                raise ValueError(f"{k.name}: registered by backend {backend!r} but belongs to {own!r}")
            seen.add(k.name)
        for k in kernels:  # stamped on the class itself, never read through a parent class
            k.backend = backend
            kinds = vars(k).get("device_kinds", ())
            if kind not in kinds:
                k.device_kinds = (*kinds, kind)
            self._names[k.name] = k
        self.lists.append(OrderedList(backend, kind, tuple(kernels), ahead))

    def set_fallback(self, kernel: type[Kernel], backend: str) -> None:
        """The kernel tried after every list, on every device kind (the reference)."""
        kernel.backend = backend
        self._names[kernel.name] = kernel
        self.fallback = kernel

    def get(self, name: str) -> type[Kernel] | None:
        return self._names.get(name)

    def names(self) -> list[str]:
        return list(self._names)

    def order(self, kind: str) -> list[OrderedList]:
        """The lists a device kind's dispatch walks, in order."""
        mine = [lst for lst in self.lists if lst.device_kind == kind]
        return [lst for lst in mine if lst.ahead] + [lst for lst in mine if not lst.ahead]

    def candidates(self, kind: str) -> list[type[Kernel]]:
        """A device kind's kernels in dispatch order, the fallback last."""
        ks = [k for lst in self.order(kind) for k in lst.kernels]
        return ks + ([self.fallback] if self.fallback is not None else [])

    def all(self) -> list[type[Kernel]]:
        return list(self._names.values())

    def kinds(self) -> list[str]:
        """The device kinds some list registers kernels for."""
        return list(dict.fromkeys(lst.device_kind for lst in self.lists))


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

                reg.set_fallback(ReferenceKernel, "reference")
                reg.backends["reference"] = "quantrt.reference"
                load_entry_points(reg)
                _REGISTRY = reg
    return _REGISTRY


def load_entry_points(reg: Registry, entry_points: Iterable[Any] | None = None) -> None:
    """Call every ``quantrt.backends`` entry point's ``register(registry)``.

    A backend that fails to load is recorded in ``reg.load_errors`` and logged; it never
    takes the others down (what it registered before failing is withdrawn).
    """
    eps = (
        entry_points if entry_points is not None else importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in reg.backends:
            continue
        before = (len(reg.lists), dict(reg._names), dict(reg.dense_linear))
        reg._loading = ep.name
        try:
            fn: Callable[[Registry], None] = ep.load()
            fn(reg)
            reg.backends[ep.name] = ep.value
        except Exception as e:  # a broken plugin must not break the others
            del reg.lists[before[0] :]
            reg._names, reg.dense_linear = before[1], before[2]
            reg.load_errors[ep.name] = f"{type(e).__name__}: {e}"
            log.warning("quantrt: backend %r (%s) failed to load: %s", ep.name, ep.value, e)
        finally:
            reg._loading = None


def reset_registry() -> None:
    """Forget loaded backends (tests that install a backend package call this)."""
    global _REGISTRY
    with _LOCK:
        _REGISTRY = None
