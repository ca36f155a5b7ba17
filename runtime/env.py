"""The QUANTRT_* environment variables, read once per decision at load time (never per call)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .capability.cpu import ISA_LEVELS
from .errors import ConfigError
from .schemes import SchemeError, parse_scheme

FALLBACK_POLICIES = ("warn", "strict", "allow")
#: QUANTRT_CPU_ISA values: the CPU as probed, or one of the capability layer's lower levels
CPU_ISA_LEVELS = ("native", *ISA_LEVELS)


@dataclass(frozen=True)
class Overrides:
    """The dispatch overrides in force, parsed and validated."""

    backend: str | None = None
    kernel: str | None = None  # one kernel for every layer
    kernel_by_scheme: Mapping[str, str] = field(default_factory=dict)  # canonical scheme string -> name
    disabled: frozenset[str] = frozenset()
    capabilities: str | None = None
    fallback: str = "warn"
    cpu_isa: str = "native"  # QUANTRT_CPU_ISA: plan and run as if the CPU had only this ISA level

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Overrides:
        env = os.environ if environ is None else environ
        backend = env.get("QUANTRT_BACKEND", "").strip() or None
        fallback = env.get("QUANTRT_FALLBACK", "").strip().lower() or "warn"
        if fallback not in FALLBACK_POLICIES:
            raise ConfigError(
                f"QUANTRT_FALLBACK={fallback!r}: expected one of {', '.join(FALLBACK_POLICIES)}"
            )
        kernel, by_scheme = _parse_kernel(env.get("QUANTRT_KERNEL", ""))
        disabled = frozenset(
            n.strip() for n in env.get("QUANTRT_DISABLE_KERNELS", "").split(",") if n.strip()
        )
        caps = env.get("QUANTRT_CAPABILITIES", "").strip() or None
        isa = env.get("QUANTRT_CPU_ISA", "").strip().lower() or "native"
        if isa not in CPU_ISA_LEVELS:
            raise ConfigError(f"QUANTRT_CPU_ISA={isa!r}: expected one of {', '.join(CPU_ISA_LEVELS)}")
        return cls(backend, kernel, by_scheme, disabled, caps, fallback, isa)

    def forced_kernel(self, scheme_name: str) -> str | None:
        return self.kernel_by_scheme.get(scheme_name, self.kernel)

    def describe(self) -> dict[str, object]:
        return {
            "QUANTRT_BACKEND": self.backend,
            "QUANTRT_KERNEL": self.kernel or dict(self.kernel_by_scheme) or None,
            "QUANTRT_DISABLE_KERNELS": sorted(self.disabled) or None,
            "QUANTRT_CAPABILITIES": self.capabilities,
            "QUANTRT_FALLBACK": self.fallback,
            "QUANTRT_CPU_ISA": None if self.cpu_isa == "native" else self.cpu_isa,
        }


def _parse_kernel(text: str) -> tuple[str | None, dict[str, str]]:
    text = text.strip()
    if not text:
        return None, {}
    if "=" not in text:
        if "," in text:
            raise ConfigError(
                f"QUANTRT_KERNEL={text!r}: give one kernel name, or scheme=name pairs separated by commas"
            )
        return text, {}
    by_scheme: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        scheme, sep, name = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"QUANTRT_KERNEL: {item!r} is not scheme=kernel")
        try:
            canon = parse_scheme(scheme.strip()).name
        except SchemeError as e:
            raise ConfigError(f"QUANTRT_KERNEL: bad scheme in {item!r}: {e}") from None
        by_scheme[canon] = name.strip()
    return None, by_scheme
