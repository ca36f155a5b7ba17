"""probe(): what this machine (or a recording of another one) can do.

Every source is optional and isolated: a missing library, driver or file, or a source that
raises, leaves its part ``unknown``/empty and adds a line to ``Capabilities.notes``.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .amd import probe_amd
from .cpu import probe_cpu
from .kinds import plugin_kinds
from .nvidia import probe_nvidia
from .software import device_libraries, probe_libraries, real_find_spec, real_version, torch_ops
from .types import UNKNOWN, Capabilities, DeviceCaps
from .xpu import probe_xpu

#: Environment variables the probe reads (device visibility).
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True)
class ProbeSources:
    """The raw inputs of a probe; tests fill them with recorded outputs of other machines.

    A field left ``None`` is a source that is not there (no /proc/cpuinfo, no pynvml, no torch):
    the probe says so in its notes. ``missing`` may hold the reason per source name
    (``cpuinfo``, ``pynvml``, ``amdsmi``, ``torch``). ``ProbeSources.real()`` is this machine.
    """

    #: text of /proc/cpuinfo
    cpuinfo_text: str | None = None
    #: a ``cpuinfo.get_cpu_info()`` dict, or a function returning one (called only if needed)
    py_cpuinfo: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None
    #: a module with pynvml's functions (nvmlInit, nvmlDeviceGetCount ...)
    pynvml: Any = None
    #: a module with amdsmi's functions (amdsmi_init, amdsmi_get_gpu_asic_info ...)
    amdsmi: Any = None
    #: torch, or an object with its ``version``, ``cuda``, ``xpu`` and ``_C`` parts
    torch: Any = None
    #: module name -> truthy when importable (importlib.util.find_spec)
    find_spec: Callable[[str], Any] | None = None
    #: module name -> installed version of its distribution, or None
    version: Callable[[str], str | None] | None = None
    #: environment variables (device visibility)
    environ: Mapping[str, str] = field(default_factory=dict)
    #: source name -> why it is None
    missing: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def real(cls) -> ProbeSources:
        """This machine's sources. Fast: py-cpuinfo is only called if /proc/cpuinfo fails."""
        missing: dict[str, str] = {}
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo_text: str | None = f.read()
        except OSError as e:
            cpuinfo_text = None
            missing["cpuinfo"] = f"{type(e).__name__}: {e}"
        modules = {}
        for name in ("torch", "pynvml", "amdsmi"):
            if not real_find_spec(name):
                modules[name] = None
                missing[name] = f"{name} is not installed"
                continue
            try:
                modules[name] = importlib.import_module(name)
            except Exception as e:
                modules[name] = None
                missing[name] = f"import {name} failed: {type(e).__name__}: {e}"
        return cls(
            cpuinfo_text=cpuinfo_text,
            py_cpuinfo=_real_py_cpuinfo,
            pynvml=modules["pynvml"],
            amdsmi=modules["amdsmi"],
            torch=modules["torch"],
            find_spec=real_find_spec,
            version=real_version,
            environ={k: os.environ[k] for k in ENV_VARS if k in os.environ},
            missing=missing,
        )


def _real_py_cpuinfo() -> Mapping[str, Any]:
    import cpuinfo

    return cpuinfo.get_cpu_info()


def probe(sources: ProbeSources | None = None) -> Capabilities:
    """What this machine can do (cached per process), or what the given sources describe (uncached)."""
    if sources is None:
        return _probe_this_machine()
    return _probe(sources)


@functools.cache
def _probe_this_machine() -> Capabilities:
    return _probe(ProbeSources.real())


def reset_probe() -> None:
    """Forget this machine's cached probe (tests that install a device package call this)."""
    _probe_this_machine.cache_clear()


def _run(notes: list[str], section: str, fn: Callable[[], tuple[Any, list[str]]], default: Any) -> Any:
    """Run one source; its notes join ``notes``, and a crash becomes a note and the default."""
    try:
        value, more = fn()
    except Exception as e:
        notes.append(f"{section}: probe failed: {type(e).__name__}: {e}")
        return default
    notes.extend(more)
    return value


def _probe(src: ProbeSources) -> Capabilities:
    notes: list[str] = []
    torch = src.torch
    if torch is None:
        notes.append(f"torch: {src.missing.get('torch', 'not available')}; no torch ops, nothing runnable")
    libs = _run(notes, "software", lambda: probe_libraries(src.find_spec, src.version), {})
    missing = src.missing.get
    cpu = _run(
        notes,
        "cpu",
        lambda: probe_cpu(src.cpuinfo_text, src.py_cpuinfo, missing("cpuinfo", "")),
        DeviceCaps("cpu"),
    )
    cpu = _run(notes, "cpu", lambda: (_finish_cpu(cpu, torch, libs), []), cpu)
    accelerators: list[DeviceCaps] = []
    accelerators += _run(
        notes, "nvml", lambda: probe_nvidia(src.pynvml, torch, src.environ, libs, missing("pynvml", "")), []
    )
    accelerators += _run(
        notes, "amdsmi", lambda: probe_amd(src.amdsmi, torch, src.environ, libs, missing("amdsmi", "")), []
    )
    accelerators += _run(notes, "xpu", lambda: probe_xpu(torch, libs), [])
    for kind in plugin_kinds():  # device kinds installed packages add (quantrt.devices)
        if kind.probe is not None:
            found = _run(notes, kind.name, lambda k=kind: k.probe(torch, libs), [])
            accelerators += [d for d in found if _own(notes, kind.name, d)]
    return Capabilities(
        cpu=cpu,
        accelerators=tuple(accelerators),
        libraries=dict(libs),
        torch_version=str(getattr(torch, "__version__", UNKNOWN)) if torch is not None else UNKNOWN,
        origin="probe",
        notes=tuple(notes),
    )


def _own(notes: list[str], kind: str, dev: Any) -> bool:
    """A plugin probe's device is kept only when it is a DeviceCaps of the plugin's own kind."""
    if isinstance(dev, DeviceCaps) and dev.kind == kind:
        return True
    notes.append(
        f"{kind}: probe returned {type(dev).__name__} {getattr(dev, 'kind', '?')!r}, not a {kind} DeviceCaps: dropped"
    )
    return False


def _finish_cpu(cpu: DeviceCaps, torch: Any, libraries: Mapping[str, str]) -> DeviceCaps:
    """The CPU's libraries and torch ops; torch always runs on the CPU when it imports."""
    return replace(
        cpu,
        libraries=device_libraries("cpu", libraries),
        torch_ops=torch_ops(torch, "CPU"),
        runnable=torch is not None,
    )
