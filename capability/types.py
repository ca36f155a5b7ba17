"""What a machine can do, as plain frozen data that round-trips through JSON.

The probe fills these from the machine (or a test fills them from recorded source outputs);
presets and capability files fill them from JSON. Kernels read them in ``supports()``.
Nothing here imports the rest of quantrt: capability sits at the bottom of the stack.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .kinds import BUILTIN, kind_of, kinds

UNKNOWN = "unknown"

#: The built-in device kinds (``rocm`` devices are ``cuda:N`` to torch); installed packages add
#: more through ``quantrt.devices`` (:mod:`quantrt.capability.kinds`).
DEVICE_KINDS = tuple(k.name for k in BUILTIN)

#: Keys ``quantrt probe --json`` adds beside the capabilities (how the probe went, not what the
#: machine can do): ``Capabilities.from_json`` accepts and drops them, so that output loads back.
PROBE_REPORT_KEYS = frozenset({"probe_seconds"})


class CapabilityError(ValueError):
    """A capability file, preset name or recorded source could not be used."""


@dataclass(frozen=True)
class DeviceCaps:
    """One compute device: the CPU, or one GPU.

    ``arch`` is the instruction set (``x86_64``, ``aarch64``) for CPUs and the GPU target
    (``sm_90``, ``gfx942``, ``pvc``) for accelerators; ``microarch`` is the CPU core design
    (``zen4``, ``sapphire_rapids``, ``neoverse_v1``) where it can be told reliably.
    ``features`` holds ISA features for CPUs (``avx512f``, ``amx_int8``, ``sve`` ...) and
    architecture features for GPUs (``tma``, ``wgmma``, ``mi300_class`` ...).
    ``cores`` counts logical CPUs (CPU), SMs (NVIDIA), CUs (AMD) or EUs (Intel XPU).
    ``driver`` is the version of the driver that reported the device, when it says.
    ``matrix_types`` lists the element types the matrix units multiply natively.
    ``torch_ops`` lists the torch quantized ops that have a kernel for this device in the
    running torch build. ``runnable`` says whether torch in this process can launch work on it.
    """

    kind: str
    index: int = 0
    vendor: str = UNKNOWN
    name: str = UNKNOWN
    arch: str = UNKNOWN
    microarch: str = UNKNOWN
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    cores: int | None = None
    matrix_types: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    libraries: frozenset[str] = frozenset()
    torch_ops: frozenset[str] = frozenset()
    runnable: bool = False
    driver: str = UNKNOWN
    source: str = UNKNOWN

    @property
    def torch_device(self) -> str:
        """The torch device string for this device (ROCm GPUs are ``cuda:N`` in torch)."""
        k = kind_of(self.kind)
        return k.torch_device(self.index) if k is not None else f"{self.kind}:{self.index}"

    @property
    def sm(self) -> int | None:
        """NVIDIA compute capability as one number (90 for sm_90), else None."""
        if self.kind != "cuda" or self.compute_capability is None:
            return None
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    def has(self, *names: str) -> bool:
        """True when every name is a feature, matrix type, library or torch op of this device."""
        pool = self.features | self.matrix_types | self.libraries | self.torch_ops
        return all(n in pool for n in names)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("matrix_types", "features", "libraries", "torch_ops"):
            d[key] = sorted(d[key])
        if d["compute_capability"] is not None:
            d["compute_capability"] = list(d["compute_capability"])
        return d

    @classmethod
    def from_json(cls, data: Any, where: str = "device") -> DeviceCaps:
        return _from_json(cls, data, where)


@dataclass(frozen=True)
class Capabilities:
    """The whole machine: its CPU, its accelerators and the software around them."""

    cpu: DeviceCaps
    accelerators: tuple[DeviceCaps, ...] = ()
    #: importable libraries relevant to kernels -> version ("" when unknown)
    libraries: dict[str, str] = field(default_factory=dict)
    torch_version: str = UNKNOWN
    #: "probe", "preset:<name>" or "file:<path>"
    origin: str = "probe"
    #: what each source said when it could not answer (missing library, no driver ...)
    notes: tuple[str, ...] = ()

    def __hash__(self) -> int:  # dict field: hash the JSON form instead
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def device(self, device: Any = "cpu") -> DeviceCaps:
        """The DeviceCaps for a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``torch.device``) or
        a device kind's own name (``"rocm:0"``, an installed kind's ``"acme:0"``)."""
        text = str(device)
        kind, _, idx = text.partition(":")
        index = int(idx) if idx.isdigit() else 0
        if kind == "cpu":
            return self.cpu
        for dev in self.accelerators:  # the kind's own name first, then torch's device type
            if dev.kind == kind and dev.index == index:
                return dev
        for dev in self.accelerators:
            k = kind_of(dev.kind)
            if k is not None and k.torch_type == kind and dev.index == index:
                return dev
        have = ", ".join(d.torch_device for d in self.accelerators) or "none"
        raise CapabilityError(f"no device {text!r} in capabilities ({self.origin}); accelerators: {have}")

    @property
    def default_device(self) -> DeviceCaps:
        """The first accelerator if there is one, else the CPU."""
        return self.accelerators[0] if self.accelerators else self.cpu

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu.to_json(),
            "accelerators": [d.to_json() for d in self.accelerators],
            "libraries": dict(sorted(self.libraries.items())),
            "torch_version": self.torch_version,
            "origin": self.origin,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "capabilities") -> Capabilities:
        if not isinstance(data, dict):
            raise CapabilityError(f"{where}: expected a JSON object, found {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known - PROBE_REPORT_KEYS
        if unknown:
            raise CapabilityError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        if "cpu" not in data:
            raise CapabilityError(f"{where}: missing field 'cpu'")
        accel = data.get("accelerators", [])
        if not isinstance(accel, list):
            raise CapabilityError(f"{where}.accelerators: expected a list, found {type(accel).__name__}")
        libs = data.get("libraries", {})
        if not isinstance(libs, dict) or not all(isinstance(v, str) for v in libs.values()):
            raise CapabilityError(f"{where}.libraries: expected an object of name -> version string")
        notes = data.get("notes", [])
        if not isinstance(notes, list):
            raise CapabilityError(f"{where}.notes: expected a list of strings")
        return cls(
            cpu=DeviceCaps.from_json(data["cpu"], f"{where}.cpu"),
            accelerators=tuple(
                DeviceCaps.from_json(d, f"{where}.accelerators[{i}]") for i, d in enumerate(accel)
            ),
            libraries=dict(libs),
            torch_version=_expect(data.get("torch_version", UNKNOWN), str, f"{where}.torch_version"),
            origin=_expect(data.get("origin", "file"), str, f"{where}.origin"),
            notes=tuple(str(n) for n in notes),
        )


def _expect(value: Any, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        want = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise CapabilityError(f"{where}: expected {want}, found {type(value).__name__} {value!r}")
    return value


def _from_json(cls: type[DeviceCaps], data: Any, where: str) -> DeviceCaps:
    if not isinstance(data, dict):
        raise CapabilityError(f"{where}: expected a JSON object, found {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise CapabilityError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    known_kinds = tuple(kinds())
    if "kind" not in data:
        raise CapabilityError(f"{where}: missing field 'kind' (one of {', '.join(known_kinds)})")
    kind = data["kind"]
    if kind not in known_kinds:
        raise CapabilityError(f"{where}.kind: expected one of {known_kinds}, found {kind!r}")
    kw: dict[str, Any] = {"kind": kind}
    for key in ("vendor", "name", "arch", "microarch", "driver", "source"):
        if key in data:
            kw[key] = _expect(data[key], str, f"{where}.{key}")
    for key in ("index",):
        if key in data:
            kw[key] = _expect(data[key], int, f"{where}.{key}")
    for key in ("memory_bytes", "cores"):
        if data.get(key) is not None:
            kw[key] = _expect(data[key], int, f"{where}.{key}")
    if "runnable" in data:
        kw["runnable"] = _expect(data["runnable"], bool, f"{where}.runnable")
    cc = data.get("compute_capability")
    if cc is not None:
        if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc)):
            raise CapabilityError(f"{where}.compute_capability: expected [major, minor], found {cc!r}")
        kw["compute_capability"] = (cc[0], cc[1])
    for key in ("matrix_types", "features", "libraries", "torch_ops"):
        if key in data:
            val = data[key]
            if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
                raise CapabilityError(f"{where}.{key}: expected a list of strings, found {val!r}")
            kw[key] = frozenset(val)
    return cls(**kw)
