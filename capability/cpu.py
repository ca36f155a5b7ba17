"""The host CPU: /proc/cpuinfo first, py-cpuinfo only when that is missing or unreadable.

/proc/cpuinfo is read in well under a millisecond; ``cpuinfo.get_cpu_info()`` takes about a
second, so it is only the fallback (macOS, Windows, odd kernels).

Fields filled:

- ``vendor``: ``amd``, ``intel``, ``hygon`` on x86 (from ``vendor_id``). On Arm it is the core
  designer named by ``CPU implementer``: ``arm`` (0x41, which includes AWS Graviton, NVIDIA
  Grace and Ampere Altra, all built from Arm Neoverse cores), ``ampere``, ``nvidia``, ``apple``,
  ``qualcomm``, ``fujitsu``, ``hisilicon``... The chip's seller cannot be told from cpuinfo.
- ``name``: the ``model name`` line; on Arm (no such line) the core's name, e.g. ``Neoverse-V1``.
- ``arch``: the instruction set, ``x86_64`` or ``aarch64``.
- ``microarch``: the core design where family/model or implementer/part say it reliably
  (``zen4``, ``sapphire_rapids``, ``emerald_rapids``, ``neoverse_v1``...), else ``unknown``.
- ``cores``: logical CPUs listed (highest ``processor`` number + 1, so an excerpt still counts).
- ``features``: only this vocabulary, present on every listed CPU:

  x86: avx, avx2, fma, f16c, avx512f, avx512cd, avx512dq, avx512bw, avx512vl, avx512_vbmi,
  avx512_vnni, avx512_bf16, avx512_fp16, avx_vnni, amx_tile, amx_bf16, amx_int8, amx_fp16.
  Arm: neon (asimd), fp16 (asimdhp), dotprod (asimddp), fhm (asimdfhm), i8mm, bf16, sve, sve2,
  sve_i8mm (svei8mm), sve_bf16 (svebf16), sme, sme2.

- ``matrix_types``: what the CPU multiplies natively: ``bf16`` (avx512_bf16, amx_bf16, Arm bf16),
  ``int8`` (avx512_vnni, avx_vnni, amx_int8, Arm dotprod or i8mm), ``fp16`` (avx512_fp16,
  amx_fp16, Arm fp16). fp32 is everywhere and not listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from .types import UNKNOWN, DeviceCaps

X86_FEATURES = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512cd",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512_vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)

#: Linux ``Features`` names -> our names, for arm64.
ARM_FEATURES = {
    "asimd": "neon",
    "asimdhp": "fp16",
    "asimddp": "dotprod",
    "asimdfhm": "fhm",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "svei8mm": "sve_i8mm",
    "svebf16": "sve_bf16",
    "sme": "sme",
    "sme2": "sme2",
}

#: Other spellings (py-cpuinfo's CPUID names, lscpu) -> the kernel's /proc/cpuinfo names.
_X86_ALIASES = {
    "avx512vbmi": "avx512_vbmi",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "amxtile": "amx_tile",
    "amxbf16": "amx_bf16",
    "amxint8": "amx_int8",
    "amxfp16": "amx_fp16",
}

_X86_VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel", "HygonGenuine": "hygon"}

_ARM_IMPLEMENTERS = {
    0x41: "arm",
    0x42: "broadcom",
    0x43: "cavium",
    0x46: "fujitsu",
    0x48: "hisilicon",
    0x4E: "nvidia",
    0x50: "apm",
    0x51: "qualcomm",
    0x61: "apple",
    0x6D: "microsoft",
    0xC0: "ampere",
}

#: (implementer, part) -> (microarch, display name)
_ARM_PARTS = {
    (0x41, 0xD03): ("cortex_a53", "Cortex-A53"),
    (0x41, 0xD07): ("cortex_a57", "Cortex-A57"),
    (0x41, 0xD08): ("cortex_a72", "Cortex-A72"),
    (0x41, 0xD0B): ("cortex_a76", "Cortex-A76"),
    (0x41, 0xD0C): ("neoverse_n1", "Neoverse-N1"),
    (0x41, 0xD0D): ("cortex_a77", "Cortex-A77"),
    (0x41, 0xD40): ("neoverse_v1", "Neoverse-V1"),
    (0x41, 0xD41): ("cortex_a78", "Cortex-A78"),
    (0x41, 0xD44): ("cortex_x1", "Cortex-X1"),
    (0x41, 0xD49): ("neoverse_n2", "Neoverse-N2"),
    (0x41, 0xD4F): ("neoverse_v2", "Neoverse-V2"),
    (0x41, 0xD84): ("neoverse_v3", "Neoverse-V3"),
    (0x41, 0xD8E): ("neoverse_n3", "Neoverse-N3"),
    (0xC0, 0xAC3): ("ampere_one", "AmpereOne"),
    (0x4E, 0x004): ("carmel", "Carmel"),
}

#: Intel family 6 model -> microarchitecture (model 85 is split by stepping below).
_INTEL_FAMILY6 = {
    63: "haswell_server",
    79: "broadwell_server",
    106: "ice_lake_server",
    108: "ice_lake_server",
    126: "ice_lake",
    140: "tiger_lake",
    141: "tiger_lake",
    143: "sapphire_rapids",
    151: "alder_lake",
    154: "alder_lake",
    167: "rocket_lake",
    170: "meteor_lake",
    173: "granite_rapids",
    174: "granite_rapids",
    175: "sierra_forest",
    183: "raptor_lake",
    186: "raptor_lake",
    189: "lunar_lake",
    191: "raptor_lake",
    197: "arrow_lake",
    198: "arrow_lake",
    207: "emerald_rapids",
}

#: AMD family -> [(first model, last model, microarch)]
_AMD_MODELS = {
    23: [(0x08, 0x08, "zen_plus"), (0x18, 0x18, "zen_plus"), (0x00, 0x2F, "zen"), (0x30, 0xFF, "zen2")],
    25: [
        (0x00, 0x0F, "zen3"),
        (0x10, 0x1F, "zen4"),
        (0x20, 0x2F, "zen3"),
        (0x40, 0x5F, "zen3"),
        (0x60, 0x7F, "zen4"),
        (0xA0, 0xAF, "zen4"),
    ],
    26: [(0x00, 0x2F, "zen5"), (0x40, 0x4F, "zen5"), (0x60, 0x7F, "zen5")],
}


#: Intel cores with AMX tiles: a model number that names another core beside AMX flags is a
#: hypervisor's stand-in (seen: a Xeon with AMX reporting model 167, Rocket Lake, which has none)
_AMX_MICROARCHS = frozenset({"sapphire_rapids", "emerald_rapids", "granite_rapids"})


def consistent_microarch(name: str, features: frozenset[str] | set[str]) -> str:
    """``name`` unless the features contradict it (AMX tiles on a core without them): then
    ``unknown``, since the model number cannot be trusted. Dispatch reads features, never this name."""
    if "amx_tile" in features and name != UNKNOWN and name not in _AMX_MICROARCHS:
        return UNKNOWN
    return name


def x86_microarch(vendor: str, family: int | None, model: int | None, stepping: int | None = None) -> str:
    """The x86 core design from CPUID family/model, or ``unknown`` when the tables do not know it."""
    if family is None or model is None:
        return UNKNOWN
    if vendor == "intel" and family == 6:
        if model == 85:
            if stepping is None:
                return UNKNOWN
            if stepping >= 10:
                return "cooper_lake"
            return "cascade_lake" if stepping >= 5 else "skylake_server"
        return _INTEL_FAMILY6.get(model, UNKNOWN)
    if vendor == "amd":
        for first, last, name in _AMD_MODELS.get(family, []):
            if first <= model <= last:
                return name
    return UNKNOWN


def normalize_x86(flags: Iterable[str]) -> frozenset[str]:
    """Our x86 feature names among ``flags`` (kernel, lscpu or py-cpuinfo spellings)."""
    names = {_X86_ALIASES.get(f, f) for f in (x.strip().lower().replace("-", "_") for x in flags)}
    return frozenset(n for n in X86_FEATURES if n in names)


def normalize_arm(flags: Iterable[str]) -> frozenset[str]:
    """Our Arm feature names among the kernel's ``Features`` words."""
    return frozenset(ARM_FEATURES[f] for f in (x.strip().lower() for x in flags) if f in ARM_FEATURES)


def cpu_matrix_types(features: Iterable[str]) -> frozenset[str]:
    """Element types the CPU multiplies natively, from its normalized features."""
    f = set(features)
    out = set()
    if f & {"avx512_bf16", "amx_bf16", "bf16", "sve_bf16"}:
        out.add("bf16")
    if f & {"avx512_vnni", "avx_vnni", "amx_int8", "dotprod", "i8mm", "sve_i8mm"}:
        out.add("int8")
    if f & {"avx512_fp16", "amx_fp16", "fp16"}:
        out.add("fp16")
    return frozenset(out)


#: QUANTRT_CPU_ISA levels below the CPU's own: the x86 features each keeps. A level only removes
#: features (a CPU never gains one it lacks), so kernels built for the CPU's full ISA are refused and
#: the variants compiled for that level are chosen: how an AVX2-only machine's path is run and tested
#: on an AVX-512 one.
ISA_LEVELS: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx", "avx2", "fma", "f16c", "avx_vnni"}),
}


def limit_isa(cpu: DeviceCaps, level: str) -> DeviceCaps:
    """``cpu`` with only the features of ISA ``level`` (a key of :data:`ISA_LEVELS`, or ``native``
    for the CPU as it is); its matrix types follow. Raises ValueError for an unknown level or a CPU
    of another architecture."""
    if level == "native":
        return cpu
    keep = ISA_LEVELS.get(level)
    if keep is None:
        raise ValueError(f"unknown ISA level {level!r}; expected native or one of {', '.join(ISA_LEVELS)}")
    if not cpu.arch.startswith("x86"):
        raise ValueError(f"ISA level {level!r} is an x86 level, but this CPU is {cpu.arch}")
    features = cpu.features & keep
    return replace(
        cpu,
        features=features,
        matrix_types=cpu_matrix_types(features),
        source=f"{cpu.source}{_LIMIT_MARK}{level}",
    )


_LIMIT_MARK = ", held by QUANTRT_CPU_ISA to "


def isa_limit(cpu: DeviceCaps) -> str | None:
    """The ISA level :func:`limit_isa` held ``cpu`` to, None for a CPU as probed (or an accelerator)."""
    _, sep, level = cpu.source.rpartition(_LIMIT_MARK)
    return level if sep else None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """The ``processor`` blocks of /proc/cpuinfo as dicts (keys as written, values stripped)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor" and "processor" in current:
            blocks.append(current)
            current = {}
        current[key] = value.strip()
    if current:
        blocks.append(current)
    return [b for b in blocks if _int(b.get("processor")) is not None]


def _common_words(blocks: list[dict[str, str]], key: str) -> list[str]:
    sets = [set(b[key].split()) for b in blocks if key in b]
    if not sets:
        return []
    common = set.intersection(*sets)
    return sorted(common)


def cpu_from_cpuinfo(text: str, source: str = "/proc/cpuinfo") -> DeviceCaps | None:
    """Capabilities from /proc/cpuinfo text; None when it is not x86 or arm64 cpuinfo we can read."""
    blocks = parse_cpuinfo(text)
    if not blocks:
        return None
    indices = [_int(b["processor"]) or 0 for b in blocks]
    cores = max(len(blocks), max(indices) + 1)
    first = blocks[0]
    if any("flags" in b for b in blocks):
        features = normalize_x86(_common_words(blocks, "flags"))
        raw_vendor = first.get("vendor_id", "")
        vendor = _X86_VENDORS.get(raw_vendor, raw_vendor.lower() or UNKNOWN)
        return DeviceCaps(
            kind="cpu",
            vendor=vendor,
            name=first.get("model name", UNKNOWN) or UNKNOWN,
            arch="x86_64" if "lm" in _common_words(blocks, "flags") else "x86",
            microarch=consistent_microarch(
                x86_microarch(
                    vendor,
                    _int(first.get("cpu family")),
                    _int(first.get("model")),
                    _int(first.get("stepping")),
                ),
                features,
            ),
            cores=cores,
            features=features,
            matrix_types=cpu_matrix_types(features),
            source=source,
        )
    if any("Features" in b for b in blocks) and any("CPU implementer" in b for b in blocks):
        features = normalize_arm(_common_words(blocks, "Features"))
        impl = _int(first.get("CPU implementer"))
        part = _int(first.get("CPU part"))
        micro, part_name = _ARM_PARTS.get((impl or -1, part or -1), (UNKNOWN, UNKNOWN))
        name = first.get("model name") or part_name
        if name == UNKNOWN and impl is not None and part is not None:
            name = f"implementer {impl:#x} part {part:#x}"
        arch_version = _int(first.get("CPU architecture"))
        return DeviceCaps(
            kind="cpu",
            vendor=_ARM_IMPLEMENTERS.get(impl or -1, UNKNOWN),
            name=name,
            arch="aarch64" if arch_version is None or arch_version >= 8 else "arm",
            microarch=micro,
            cores=cores,
            features=features,
            matrix_types=cpu_matrix_types(features),
            source=source,
        )
    return None


def cpu_from_py_cpuinfo(info: Mapping[str, Any]) -> DeviceCaps:
    """Capabilities from a ``cpuinfo.get_cpu_info()`` dict (the fallback source)."""
    raw_arch = str(info.get("arch_string_raw") or info.get("arch") or "").lower()
    flags = [str(f) for f in info.get("flags", [])]
    if raw_arch in ("x86_64", "amd64", "x86_64_"):
        arch = "x86_64"
    elif raw_arch in ("aarch64", "arm64", "arm_8"):
        arch = "aarch64"
    else:
        arch = raw_arch or UNKNOWN
    if arch == "aarch64":
        features = normalize_arm(flags)
        vendor = UNKNOWN
        micro = UNKNOWN
    else:
        features = normalize_x86(flags)
        raw_vendor = str(info.get("vendor_id_raw") or "")
        vendor = _X86_VENDORS.get(raw_vendor, raw_vendor.lower() or UNKNOWN)
        micro = consistent_microarch(
            x86_microarch(vendor, info.get("family"), info.get("model"), info.get("stepping")), features
        )
    count = info.get("count")
    return DeviceCaps(
        kind="cpu",
        vendor=vendor,
        name=str(info.get("brand_raw") or UNKNOWN),
        arch=arch,
        microarch=micro,
        cores=count if isinstance(count, int) and not isinstance(count, bool) else None,
        features=features,
        matrix_types=cpu_matrix_types(features),
        source="py-cpuinfo",
    )


def probe_cpu(
    cpuinfo_text: str | None,
    py_cpuinfo: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
    missing: str = "",
) -> tuple[DeviceCaps, list[str]]:
    """The CPU from /proc/cpuinfo, else py-cpuinfo, else an unknown CPU; plus notes on what failed."""
    notes: list[str] = []
    if cpuinfo_text is None:
        notes.append(f"cpu: /proc/cpuinfo unavailable{': ' + missing if missing else ''}")
    else:
        dev = cpu_from_cpuinfo(cpuinfo_text)
        if dev is not None:
            return dev, notes
        notes.append("cpu: /proc/cpuinfo has no x86 flags or arm64 Features this probe can read")
    if py_cpuinfo is None:
        notes.append("cpu: py-cpuinfo unavailable")
        return DeviceCaps(kind="cpu"), notes
    try:
        info = py_cpuinfo() if callable(py_cpuinfo) else py_cpuinfo
        return cpu_from_py_cpuinfo(info), notes
    except Exception as e:
        notes.append(f"cpu: py-cpuinfo failed: {type(e).__name__}: {e}")
        return DeviceCaps(kind="cpu"), notes
