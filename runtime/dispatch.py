"""Dispatch: pick a kernel per layer, keep every rejection with its reason, log the choice once.

``select`` plans (it may plan for other hardware through QUANTRT_CAPABILITIES); ``build``
plans and then re-checks the chosen kernel against the real machine before anything runs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch

from .capability import Capabilities, CapabilityError, DeviceCaps, kind_of, load_capabilities, probe
from .capability.cpu import isa_limit, limit_isa
from .env import Overrides
from .errors import ConfigError, DispatchError
from .kernels import Kernel, Verdict, registry
from .specs import LayerSpec

log = logging.getLogger("quantrt.dispatch")

CHOSEN, REJECTED, SKIPPED, ALSO = "chosen", "rejected", "skipped", "also supports"


@dataclass(frozen=True)
class Candidate:
    """One kernel dispatch looked at, and what it answered."""

    name: str
    backend: str
    status: str  # chosen | rejected | skipped | also supports
    verdict: Verdict
    label: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.name,
            "backend": self.backend,
            "status": self.status,
            "label": self.label,
            **{k: v for k, v in self.verdict.to_json().items() if k != "ok"},
        }


@dataclass(frozen=True)
class Selection:
    """The plan for one layer: the kernel, why, and what every other candidate said."""

    spec: LayerSpec
    device: DeviceCaps
    origin: str
    kernel: type[Kernel]
    candidates: tuple[Candidate, ...]
    forced: bool
    fallback: bool
    #: the backends whose ordered lists dispatch walked for this device kind, in order
    order: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.kernel.label(self.spec)

    @property
    def kernel_name(self) -> str:
        return self.kernel.name

    def to_json(self) -> dict[str, Any]:
        s = self.spec
        return {
            "scheme": s.scheme.name,
            "K": s.K,
            "N": s.N,
            "K_part": s.K_part,
            "N_part": s.N_part,
            "act_dtype": str(s.act_dtype).replace("torch.", ""),
            "op": s.op,
            "num_experts": s.num_experts,
            "device": self.device.torch_device,
            "device_name": self.device.name,
            "arch": self.device.arch,
            "capabilities": self.origin,
            "cpu_isa": isa_limit(self.device) or ("native" if self.device.kind == "cpu" else None),
            "kernel": self.kernel.name,
            "label": self.label,
            "forced": self.forced,
            "fallback": self.fallback,
            "order": [*self.order, "reference"],
            "candidates": [c.to_json() for c in self.candidates],
        }

    def explain(self) -> str:
        """The plan as text: the layer, the device, the choice, and each candidate's verdict."""
        d = self.device
        limited = isa_limit(d)
        lines = [
            f"layer    {self.spec.describe()}",
            f"device   {d.torch_device} {d.name} ({d.arch}) [{self.origin}]"
            + (f", held to {limited} by QUANTRT_CPU_ISA" if limited else ""),
            f"kernel   {self.kernel.name} ({self.label}{', forced by QUANTRT_KERNEL' if self.forced else ''})",
        ]
        if self.kernel.backend == "reference" and self.fallback:
            lines.append("note     no native kernel yet for this layer on this device: the reference runs it")
        lists = " > ".join(f"the {b} backend's list" for b in self.order)
        lines.append(
            "candidates  in dispatch order, top to bottom: "
            + (f"{lists}, then the reference" if lists else "the reference")
            if not self.forced
            else "candidates"
        )
        width = max((len(c.name) for c in self.candidates), default=10)
        mark = {CHOSEN: "*", REJECTED: "x", SKIPPED: "-", ALSO: "+"}
        for c in self.candidates:
            lines.append(f"  {mark[c.status]} {c.name:<{width}}  {c.status}: {c.verdict.reason}")
        return "\n".join(lines)


_CAPS_CACHE: dict[str, Capabilities] = {}
_LOGGED: set[tuple[Any, ...]] = set()
_LOG_LOCK = threading.Lock()


def _limited(caps: Capabilities, ov: Overrides) -> Capabilities:
    """``caps`` with its CPU held to QUANTRT_CPU_ISA (unchanged when native)."""
    if ov.cpu_isa == "native":
        return caps
    try:
        return replace(caps, cpu=limit_isa(caps.cpu, ov.cpu_isa))
    except ValueError as e:
        raise ConfigError(f"QUANTRT_CPU_ISA={ov.cpu_isa}: {e}") from None


def machine_capabilities(overrides: Overrides | None = None) -> Capabilities:
    """This machine as layers run on it: the probe, its CPU held to QUANTRT_CPU_ISA."""
    return _limited(probe(), overrides or Overrides.from_env())


def planning_capabilities(overrides: Overrides | None = None) -> Capabilities:
    """The capabilities plans are made for: QUANTRT_CAPABILITIES if set, else this machine (either
    held to QUANTRT_CPU_ISA)."""
    ov = overrides or Overrides.from_env()
    if ov.capabilities is None:
        return machine_capabilities(ov)
    if ov.capabilities not in _CAPS_CACHE:
        try:
            _CAPS_CACHE[ov.capabilities] = load_capabilities(ov.capabilities)
        except CapabilityError as e:
            raise ConfigError(f"QUANTRT_CAPABILITIES={ov.capabilities}: {e}") from None
    return _limited(_CAPS_CACHE[ov.capabilities], ov)


def _device_caps(caps: Capabilities, device: Any) -> DeviceCaps:
    try:
        return caps.device(device)
    except CapabilityError as e:
        raise DispatchError(str(e)) from None


def select(
    spec: LayerSpec, device: Any = "cpu", caps: Capabilities | None = None, overrides: Overrides | None = None
) -> Selection:
    """Walk the device kind's registered lists top to bottom; the first kernel that supports the
    layer wins, the reference last."""
    ov = overrides or Overrides.from_env()
    caps = caps or planning_capabilities(ov)
    dev = _device_caps(caps, device)
    reg = registry()
    if ov.backend is not None and ov.backend not in reg.backends:
        raise ConfigError(
            f"QUANTRT_BACKEND={ov.backend!r}: no such backend; loaded: {', '.join(sorted(reg.backends))}"
        )
    if ov.backend is not None:
        _check_backend_has_device(ov.backend, caps, reg)
    forced = ov.forced_kernel(spec.scheme.name)
    if forced is not None:
        return _forced(spec, dev, caps.origin, forced, reg)

    for name in ov.disabled - set(reg.names()):
        _log_once(
            ("unknown-disabled", name),
            logging.WARNING,
            "quantrt: QUANTRT_DISABLE_KERNELS names %r, which no loaded backend registers",
            name,
        )

    candidates: list[Candidate] = []
    chosen: type[Kernel] | None = None
    reference: type[Kernel] | None = None
    for k in reg.candidates(dev.kind):
        if k.backend == "reference":
            reference = k
            continue
        if ov.backend is not None and k.backend != ov.backend:
            candidates.append(
                Candidate(
                    k.name,
                    k.backend,
                    SKIPPED,
                    Verdict.no(f"backend == {ov.backend!r}", "QUANTRT_BACKEND", backend=k.backend),
                    k.label(spec),
                )
            )
            continue
        if k.name in ov.disabled:
            candidates.append(
                Candidate(
                    k.name,
                    k.backend,
                    SKIPPED,
                    Verdict.no("kernel not in QUANTRT_DISABLE_KERNELS", kernel=k.name),
                    k.label(spec),
                )
            )
            continue
        v = _ask(k, spec, dev)
        if v.ok and chosen is None:
            chosen = k
            status = CHOSEN
        else:
            status = ALSO if v.ok else REJECTED
        candidates.append(Candidate(k.name, k.backend, status, v, k.label(spec)))

    assert reference is not None, "the reference kernel is always registered"
    ref_v = _ask(reference, spec, dev)
    if chosen is None or chosen.emulated:
        if chosen is None:
            if not ref_v.ok:
                raise DispatchError(_no_kernel_message(spec, dev, candidates, ref_v))
            chosen = reference
            candidates.append(Candidate(reference.name, "reference", CHOSEN, ref_v, "reference"))
        else:
            candidates.append(Candidate(reference.name, "reference", ALSO, ref_v, "reference"))
        fallback = ov.backend != "reference"
    else:
        candidates.append(Candidate(reference.name, "reference", ALSO, ref_v, "reference"))
        fallback = False
    order = tuple(lst.backend for lst in reg.order(dev.kind))
    sel = Selection(spec, dev, caps.origin, chosen, tuple(candidates), False, fallback, order)
    _report(sel, ov)
    return sel


def _kind_word(kind: str) -> str:
    k = kind_of(kind)
    return k.label if k is not None else kind


def _check_backend_has_device(backend: str, caps: Capabilities, reg: Any) -> None:
    """A forced backend whose devices the capabilities lack is refused by name, not planned as
    "no native kernel yet" for a device it was never meant to run on."""
    kinds = {lst.device_kind for lst in reg.lists if lst.backend == backend}
    if kind_of(backend) is not None:
        kinds.add(backend)
    devices = (caps.cpu, *caps.accelerators)
    if not kinds or any(d.kind in kinds for d in devices):
        return
    probed = caps.origin == "probe"
    where = "this machine has" if probed else f"capabilities {caps.origin} have"
    want = " or ".join(sorted(_kind_word(k) for k in kinds))
    found = ", ".join(
        f"{d.torch_device} {d.name} ({d.arch if d.kind == 'cpu' else f'{d.kind}, {d.arch}'})" for d in devices
    )
    raise ConfigError(
        f"QUANTRT_BACKEND={backend}: {where} no {want} device ({'the probe ' if probed else ''}found: {found})"
    )


def _ask(k: type[Kernel], spec: LayerSpec, dev: DeviceCaps) -> Verdict:
    try:
        return k.supports(spec, dev)
    except Exception as e:  # a buggy supports() is a rejection with the reason, not a crash
        return Verdict.no("supports() raises no error", error=f"{type(e).__name__}: {e}")


def _forced(spec: LayerSpec, dev: DeviceCaps, origin: str, name: str, reg: Any) -> Selection:
    k = reg.get(name)
    if k is None:
        known = ", ".join(c.name for c in reg.candidates(dev.kind))
        raise DispatchError(f"QUANTRT_KERNEL={name!r}: no such kernel; kernels for {dev.kind}: {known}")
    if k is not reg.fallback and dev.kind not in k.device_kinds:
        raise DispatchError(
            f"QUANTRT_KERNEL={name!r} runs on {', '.join(k.device_kinds)}, "
            f"not on {dev.torch_device} ({dev.kind})"
        )
    v = _ask(k, spec, dev)
    if not v.ok:
        raise DispatchError(
            f"QUANTRT_KERNEL={name!r} cannot implement {spec.describe()} on "
            f"{dev.torch_device} {dev.name} ({dev.arch}): {v.reason}"
        )
    sel = Selection(
        spec,
        dev,
        origin,
        k,
        (Candidate(k.name, k.backend, CHOSEN, v, k.label(spec)),),
        True,
        k.backend == "reference" or k.emulated,
    )
    _log_once(
        _key(sel),
        logging.INFO,
        "quantrt: %s on %s -> %s (forced by QUANTRT_KERNEL)",
        spec.describe(),
        dev.torch_device,
        k.name,
    )
    return sel


def _no_kernel_message(spec: LayerSpec, dev: DeviceCaps, cands: list[Candidate], ref_v: Verdict) -> str:
    lines = [f"no kernel can run {spec.describe()} on {dev.torch_device} ({dev.arch})"]
    lines += [f"  {c.name}: {c.verdict.reason}" for c in cands]
    lines.append(f"  reference: {ref_v.reason}")
    return "\n".join(lines)


def _key(sel: Selection) -> tuple[Any, ...]:
    s = sel.spec
    return (
        s.scheme.name,
        s.K,
        s.N,
        s.K_part,
        s.N_part,
        s.act_dtype,
        sel.device.torch_device,
        sel.origin,
        sel.kernel.name,
    )


def _log_once(key: tuple[Any, ...], level: int, msg: str, *args: Any) -> None:
    with _LOG_LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    log.log(level, msg, *args)


def _report(sel: Selection, ov: Overrides) -> None:
    rejected = "; ".join(
        f"{c.name}: {c.verdict.reason}" for c in sel.candidates if c.status in (REJECTED, SKIPPED)
    )
    if not sel.fallback:
        _log_once(
            _key(sel),
            logging.INFO,
            "quantrt: %s on %s -> %s%s",
            sel.spec.describe(),
            sel.device.torch_device,
            sel.kernel.name,
            f" (rejected: {rejected})" if rejected else "",
        )
        return
    what = (
        "the reference kernel" if sel.kernel.backend == "reference" else f"emulated kernel {sel.kernel.name}"
    )
    msg = (
        f"{sel.spec.describe()} on {sel.device.torch_device} ({sel.device.arch}) runs on {what}: "
        f"no native kernel here" + (f" (rejected: {rejected})" if rejected else "")
    )
    if ov.fallback == "strict":
        raise DispatchError(f"QUANTRT_FALLBACK=strict: {msg}")
    level = logging.WARNING if ov.fallback == "warn" else logging.DEBUG
    _log_once(_key(sel), level, "quantrt: %s", msg)


def build(
    spec: LayerSpec, device: Any = "cpu", overrides: Overrides | None = None
) -> tuple[Kernel, Selection]:
    """Plan a layer and re-check the choice against the machine it will run on.

    Planning may use QUANTRT_CAPABILITIES; execution may not: a kernel planned for other
    hardware that this machine cannot run is refused here, with the reason.
    """
    ov = overrides or Overrides.from_env()
    sel = select(spec, device, overrides=ov)
    real = machine_capabilities(ov)
    try:
        real_dev = real.device(device)
    except CapabilityError:
        have = ", ".join(["cpu", *(d.torch_device for d in real.accelerators)])
        raise DispatchError(
            f"cannot build {spec.describe()} on {device}: this machine has no such device (found: {have})"
            + (f"; QUANTRT_CAPABILITIES={ov.capabilities} changes planning only" if ov.capabilities else "")
        ) from None
    if not real_dev.runnable:
        raise DispatchError(
            f"cannot build {spec.describe()} on {real_dev.torch_device} {real_dev.name}: "
            f"torch in this process cannot run on it ({real_dev.source})"
        )
    if sel.origin != real.origin or sel.device != real_dev:
        v = _ask(sel.kernel, spec, real_dev)
        if not v.ok:
            raise DispatchError(
                f"{sel.kernel.name} was planned for {spec.describe()} with capabilities {sel.origin}, "
                f"but this machine's {real_dev.torch_device} ({real_dev.name}, {real_dev.arch}) cannot run "
                f"it: {v.reason}. Unset QUANTRT_CAPABILITIES to plan for this machine."
            )
    return sel.kernel(real_dev), sel


def device_of(device: Any) -> str:
    """quantrt's ``kind[:index]`` string for a torch device (``"cuda"``, ``torch.device``) or a device
    kind's own name (``"rocm:0"``, an installed kind's ``"acme:0"``)."""
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        k = kind_of(kind)
        if k is not None and k.torch_type != kind:
            return f"{kind}:{int(idx) if idx.isdigit() else 0}"
    d = torch.device(device)
    if d.type == "cpu":
        return "cpu"
    return f"{d.type}:{d.index or 0}"


def torch_device_of(device: Any) -> torch.device:
    """The torch device a layer's tensors live on, for the same arguments as :func:`device_of`."""
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        k = kind_of(kind)
        if k is not None and k.torch_type != kind:
            return torch.device(k.torch_device(int(idx) if idx.isdigit() else 0))
    return torch.device(device)
