"""AMD GPUs through amdsmi (ROCm's management library), or torch.cuda of a ROCm build as fallback.

amdsmi answers used, with the keys its Python binding returns:
``amdsmi_get_gpu_asic_info`` -> ``market_name``, ``target_graphics_version`` (``"gfx942"``),
``num_compute_units``; ``amdsmi_get_gpu_memory_total(h, AmdSmiMemoryType.VRAM)`` (bytes) or
``amdsmi_get_gpu_vram_info`` -> ``vram_size`` (MiB); ``amdsmi_get_gpu_driver_info`` ->
``driver_version``.

Matrix types by target:

=============================  ===================================================================
target                         matrix_types (features)
=============================  ===================================================================
gfx908, gfx90a                 fp16, bf16, int8
gfx940, gfx941, gfx942         + fp8_e4m3fnuz, fp8_e5m2fnuz, tf32 (xf32)   (mi300_class: MI300X/A, MI325X)
gfx950                         fp16, bf16, int8, fp8_e4m3, fp8_e5m2 (OCP), fp4_e2m1, mxfp4, mxfp6,
                               mxfp8                                       (mi350_class: MI350X, MI355X)
gfx11xx                        fp16, bf16, int8
gfx12xx                        + fp8_e4m3, fp8_e5m2 (OCP)
=============================  ===================================================================

``aiter`` is listed as a feature and a library when the package is importable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .nvidia import visible_indices
from .software import device_libraries, torch_ops
from .types import UNKNOWN, DeviceCaps

_CDNA2 = frozenset({"fp16", "bf16", "int8"})
_CDNA3 = _CDNA2 | {"fp8_e4m3fnuz", "fp8_e5m2fnuz", "tf32"}
_CDNA4 = _CDNA2 | {"fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp4", "mxfp6", "mxfp8"}
_RDNA3 = frozenset({"fp16", "bf16", "int8"})
_RDNA4 = _RDNA3 | {"fp8_e4m3", "fp8_e5m2"}

#: gfx target -> (matrix types, features)
AMD_ARCHS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "gfx908": (_CDNA2, frozenset()),
    "gfx90a": (_CDNA2, frozenset()),
    "gfx940": (_CDNA3, frozenset({"mi300_class"})),
    "gfx941": (_CDNA3, frozenset({"mi300_class"})),
    "gfx942": (_CDNA3, frozenset({"mi300_class"})),
    "gfx950": (_CDNA4, frozenset({"mi350_class"})),
}


def gfx_target(raw: Any) -> str:
    """``gfx942`` from ``gfx942``, ``gfx942:sramecc+:xnack-`` or ``GFX942``; ``unknown`` otherwise."""
    text = str(raw or "").strip().lower().split(":")[0]
    return text if text.startswith("gfx") and len(text) > 3 else UNKNOWN


def amd_arch(gfx: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """(matrix types, features) for a gfx target, or None for one the table does not know."""
    if gfx in AMD_ARCHS:
        return AMD_ARCHS[gfx]
    if gfx.startswith("gfx11") and len(gfx) == 7:
        return _RDNA3, frozenset()
    if gfx.startswith("gfx12") and len(gfx) == 7:
        return _RDNA4, frozenset()
    return None


def amd_torch_ops(registered: frozenset[str], matrix: frozenset[str]) -> frozenset[str]:
    """The registered ops torch accepts on this GPU: the fp8 ``_scaled_*`` ops need fp8 units."""
    fp8 = bool(matrix & {"fp8_e4m3", "fp8_e4m3fnuz"})
    return frozenset(op for op in registered if fp8 or op not in ("_scaled_mm", "_scaled_grouped_mm"))


def rocm_runtime(torch: Any) -> tuple[bool, str]:
    """Whether torch here can launch work on AMD GPUs, and why not."""
    if torch is None:
        return False, "torch is not importable"
    if not getattr(torch.version, "hip", None):
        return False, f"torch {torch.__version__} was built without ROCm"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} (HIP {torch.version.hip}) sees no usable GPU"
    return True, ""


def _visibility_var(environ: Mapping[str, str]) -> str:
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if var in environ:
            return var
    return "HIP_VISIBLE_DEVICES"


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 0)
    except ValueError:
        return None


def probe_amd(
    amdsmi: Any,
    torch: Any,
    environ: Mapping[str, str],
    libraries: Mapping[str, str],
    missing: str = "",
) -> tuple[list[DeviceCaps], list[str]]:
    """AMD GPUs visible to this process, from amdsmi (or torch.cuda of a ROCm build)."""
    notes: list[str] = []
    runnable, why_not = rocm_runtime(torch)
    rocm_build = torch is not None and bool(getattr(torch.version, "hip", None))
    registered = torch_ops(torch, "CUDA") if rocm_build else frozenset()
    libs = device_libraries("rocm", libraries)
    problem = ""
    if amdsmi is None:
        problem = missing or "amdsmi is not importable"
    else:
        try:
            amdsmi.amdsmi_init()
        except Exception as e:
            problem = f"amdsmi_init failed: {e or type(e).__name__}"
    if problem:
        if runnable:
            notes.append(f"amdsmi: {problem}; GPUs described by torch.cuda")
            return _from_torch(torch, registered, libs, problem, notes), notes
        notes.append(f"amdsmi: {problem}")
        return [], notes
    try:
        devices = _from_amdsmi(amdsmi, environ, registered, libs, notes)
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except Exception as e:
            notes.append(f"amdsmi: amdsmi_shut_down failed: {e}")
    source = "amdsmi" if runnable else f"amdsmi; not runnable: {why_not}"
    return [replace(d, runnable=runnable, source=source) for d in devices], notes


def _from_amdsmi(
    amdsmi: Any,
    environ: Mapping[str, str],
    registered: frozenset[str],
    libs: frozenset[str],
    notes: list[str],
) -> list[DeviceCaps]:
    def ask(what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            notes.append(f"amdsmi: {what}: {e or type(e).__name__}")
            return None

    handles = list(amdsmi.amdsmi_get_processor_handles())
    var = _visibility_var(environ)
    order = visible_indices(environ, var, len(handles), [])
    if len(order) < len(handles):
        notes.append(f"amdsmi: {len(handles)} GPUs, {len(order)} visible through {var}")
    devices = []
    for torch_index, phys in enumerate(order):
        h = handles[phys]
        asic = ask(f"GPU {phys} asic info", amdsmi.amdsmi_get_gpu_asic_info, h) or {}
        memory = _memory_bytes(amdsmi, h, ask, phys)
        driver = ask(f"GPU {phys} driver info", amdsmi.amdsmi_get_gpu_driver_info, h) or {}
        gfx = gfx_target(asic.get("target_graphics_version"))
        cus = _int_or_none(asic.get("num_compute_units", asic.get("num_of_compute_units")))
        name = str(asic.get("market_name") or UNKNOWN)
        devices.append(_device(torch_index, name, gfx, memory, cus, registered, libs, notes))
        if driver.get("driver_version"):
            devices[-1] = replace(devices[-1], driver=str(driver["driver_version"]))
    return devices


def _memory_bytes(amdsmi: Any, handle: Any, ask: Any, phys: int) -> int | None:
    mem_type = getattr(getattr(amdsmi, "AmdSmiMemoryType", None), "VRAM", None)
    if mem_type is not None and hasattr(amdsmi, "amdsmi_get_gpu_memory_total"):
        total = _int_or_none(
            ask(f"GPU {phys} memory total", amdsmi.amdsmi_get_gpu_memory_total, handle, mem_type)
        )
        if total:
            return total
    if hasattr(amdsmi, "amdsmi_get_gpu_vram_info"):
        info = ask(f"GPU {phys} vram info", amdsmi.amdsmi_get_gpu_vram_info, handle) or {}
        mib = _int_or_none(info.get("vram_size"))
        if mib:
            return mib * 1024 * 1024
    return None


def _device(
    index: int,
    name: str,
    gfx: str,
    memory: int | None,
    cus: int | None,
    registered: frozenset[str],
    libs: frozenset[str],
    notes: list[str],
) -> DeviceCaps:
    known = amd_arch(gfx)
    if known is None:
        notes.append(f"amd: target {gfx} of {name} is not in the table")
        matrix, features = frozenset(), frozenset()
    else:
        matrix, features = known
    if "aiter" in libs:
        features = features | {"aiter"}
    return DeviceCaps(
        kind="rocm",
        index=index,
        vendor="amd",
        name=name,
        arch=gfx,
        memory_bytes=memory,
        cores=cus,
        matrix_types=matrix,
        features=features,
        libraries=libs,
        torch_ops=amd_torch_ops(registered, matrix),
    )


def _from_torch(
    torch: Any, registered: frozenset[str], libs: frozenset[str], problem: str, notes: list[str]
) -> list[DeviceCaps]:
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        dev = _device(
            i,
            str(props.name),
            gfx_target(getattr(props, "gcnArchName", "")),
            getattr(props, "total_memory", None),
            getattr(props, "multi_processor_count", None),
            registered,
            libs,
            notes,
        )
        devices.append(replace(dev, runnable=True, source=f"torch.cuda (amdsmi: {problem})"))
    return devices
