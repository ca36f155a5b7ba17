"""NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py), which creates no CUDA context.

When NVML cannot answer but torch can run CUDA, torch.cuda fills in instead (``source`` says so).

Matrix types by compute capability:

==========================  =========================================================  ==============
sm                          matrix_types                                               features
==========================  =========================================================  ==============
70, 72                      fp16
75                          fp16, int8
80, 86, 87                  fp16, bf16, tf32, int8
89                          + fp8_e4m3, fp8_e5m2
90                          as 89                                                      tma, wgmma
100, 101, 103, 110          + fp4_e2m1, nvfp4, mxfp8, mxfp6, mxfp4                     tma, tcgen05
120, 121                    as 100                                                     tma
==========================  =========================================================  ==============

An unlisted minor version takes the nearest lower one of its major (8.8 is treated as 8.7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .software import device_libraries, torch_ops
from .types import UNKNOWN, DeviceCaps

_VOLTA = frozenset({"fp16"})
_TURING = _VOLTA | {"int8"}
_AMPERE = _TURING | {"bf16", "tf32"}
_ADA = _AMPERE | {"fp8_e4m3", "fp8_e5m2"}
_BLACKWELL = _ADA | {"fp4_e2m1", "nvfp4", "mxfp8", "mxfp6", "mxfp4"}

#: compute capability -> (matrix types, features)
NVIDIA_ARCHS: dict[tuple[int, int], tuple[frozenset[str], frozenset[str]]] = {
    (7, 0): (_VOLTA, frozenset()),
    (7, 2): (_VOLTA, frozenset()),
    (7, 5): (_TURING, frozenset()),
    (8, 0): (_AMPERE, frozenset()),
    (8, 6): (_AMPERE, frozenset()),
    (8, 7): (_AMPERE, frozenset()),
    (8, 9): (_ADA, frozenset()),
    (9, 0): (_ADA, frozenset({"tma", "wgmma"})),
    (10, 0): (_BLACKWELL, frozenset({"tma", "tcgen05"})),
    (10, 1): (_BLACKWELL, frozenset({"tma", "tcgen05"})),
    (10, 3): (_BLACKWELL, frozenset({"tma", "tcgen05"})),
    (11, 0): (_BLACKWELL, frozenset({"tma", "tcgen05"})),
    (12, 0): (_BLACKWELL, frozenset({"tma"})),
    (12, 1): (_BLACKWELL, frozenset({"tma"})),
}


def nvidia_arch(cc: tuple[int, int]) -> tuple[frozenset[str], frozenset[str]] | None:
    """(matrix types, features) for a compute capability, or None for one the table does not know."""
    if cc in NVIDIA_ARCHS:
        return NVIDIA_ARCHS[cc]
    lower = [k for k in NVIDIA_ARCHS if k[0] == cc[0] and k[1] < cc[1]]
    return NVIDIA_ARCHS[max(lower)] if lower else None


def nvidia_torch_ops(registered: frozenset[str], cc: tuple[int, int]) -> frozenset[str]:
    """The registered CUDA ops that torch also accepts on this compute capability.

    torch registers one CUDA kernel per op for every GPU, then refuses some at run time:
    ``_scaled_mm`` needs fp8 (sm_89+), ``_scaled_grouped_mm`` sm_90/sm_100 class, and the
    int4 ``tinygemm`` ops need sm_80+.
    """
    sm = cc[0] * 10 + cc[1]

    def ok(op: str) -> bool:
        if op == "_scaled_mm":
            return sm >= 89
        if op == "_scaled_grouped_mm":
            return cc[0] in (9, 10)
        if op in ("_weight_int4pack_mm", "_convert_weight_to_int4pack"):
            return sm >= 80
        return True

    return frozenset(op for op in registered if ok(op))


def cuda_runtime(torch: Any) -> tuple[bool, str]:
    """Whether torch here can launch CUDA work, and why not."""
    if torch is None:
        return False, "torch is not importable"
    if getattr(torch.version, "hip", None):
        return False, f"torch {torch.__version__} is a ROCm build"
    if not getattr(torch.version, "cuda", None):
        return False, f"torch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU"
    return True, ""


def visible_indices(environ: Mapping[str, str], var: str, count: int, uuids: list[str]) -> list[int]:
    """Physical indices in the order torch numbers them, from ``var`` (CUDA_VISIBLE_DEVICES...).

    Parsing stops at the first entry that names no device, as the CUDA runtime does.
    """
    spec = environ.get(var)
    if spec is None:
        return list(range(count))
    out: list[int] = []
    for token in (t.strip() for t in spec.split(",")):
        idx: int | None = None
        if token.lstrip("-").isdigit():
            idx = int(token)
        elif token.startswith("GPU-"):
            idx = next((i for i, u in enumerate(uuids) if u and u.startswith(token)), None)
        if idx is None or not 0 <= idx < count or idx in out:
            break
        out.append(idx)
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvidia(
    pynvml: Any,
    torch: Any,
    environ: Mapping[str, str],
    libraries: Mapping[str, str],
    missing: str = "",
) -> tuple[list[DeviceCaps], list[str]]:
    """NVIDIA GPUs visible to this process, from NVML (or torch.cuda when NVML cannot answer)."""
    notes: list[str] = []
    runnable, why_not = cuda_runtime(torch)
    cuda_build = torch is not None and bool(getattr(torch.version, "cuda", None))
    cuda_build = cuda_build and not getattr(torch.version, "hip", None)
    registered = torch_ops(torch, "CUDA") if cuda_build else frozenset()
    libs = device_libraries("cuda", libraries)
    nvml_problem = ""
    if pynvml is None:
        nvml_problem = missing or "pynvml is not importable"
    else:
        try:
            pynvml.nvmlInit()
        except Exception as e:
            nvml_problem = f"nvmlInit failed: {_text(e) or type(e).__name__}"
    if nvml_problem:
        if runnable:
            notes.append(f"nvml: {nvml_problem}; GPUs described by torch.cuda")
            return _from_torch(torch, registered, libs, nvml_problem, notes), notes
        notes.append(f"nvml: {nvml_problem}")
        return [], notes
    try:
        return _from_nvml(pynvml, environ, registered, libs, runnable, why_not, notes), notes
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as e:
            notes.append(f"nvml: nvmlShutdown failed: {_text(e)}")


def _from_nvml(
    pynvml: Any,
    environ: Mapping[str, str],
    registered: frozenset[str],
    libs: frozenset[str],
    runnable: bool,
    why_not: str,
    notes: list[str],
) -> list[DeviceCaps]:
    def ask(what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            notes.append(f"nvml: {what}: {_text(e) or type(e).__name__}")
            return None

    driver = ask("driver version", pynvml.nvmlSystemGetDriverVersion)
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [_text(ask(f"GPU {i} uuid", pynvml.nvmlDeviceGetUUID, h) or "") for i, h in enumerate(handles)]
    order = visible_indices(environ, "CUDA_VISIBLE_DEVICES", count, uuids)
    if len(order) < count:
        notes.append(f"nvml: {count} GPUs, {len(order)} visible through CUDA_VISIBLE_DEVICES")
    devices = []
    for torch_index, phys in enumerate(order):
        h = handles[phys]
        name = _text(ask(f"GPU {phys} name", pynvml.nvmlDeviceGetName, h) or UNKNOWN)
        cc_raw = ask(f"GPU {phys} compute capability", pynvml.nvmlDeviceGetCudaComputeCapability, h)
        cc = (int(cc_raw[0]), int(cc_raw[1])) if cc_raw is not None else None
        mem = ask(f"GPU {phys} memory", pynvml.nvmlDeviceGetMemoryInfo, h)
        sms = _multiprocessors(pynvml, h)
        dev = _device(torch_index, name, cc, getattr(mem, "total", None), sms, registered, libs, notes)
        devices.append(
            replace(
                dev,
                runnable=runnable,
                driver=_text(driver) if driver is not None else UNKNOWN,
                source="nvml" if runnable else f"nvml; not runnable: {why_not}",
            )
        )
    return devices


def _multiprocessors(pynvml: Any, handle: Any) -> int | None:
    """SM count where NVML reports it (nvmlDeviceGetAttributes), else None; never an error."""
    for fn in ("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"):
        get = getattr(pynvml, fn, None)
        if get is None:
            continue
        try:
            count = int(get(handle).multiprocessorCount)
        except Exception:
            continue
        if count > 0:
            return count
    return None


def _device(
    index: int,
    name: str,
    cc: tuple[int, int] | None,
    memory: int | None,
    sms: int | None,
    registered: frozenset[str],
    libs: frozenset[str],
    notes: list[str],
) -> DeviceCaps:
    matrix: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    ops = registered
    if cc is not None:
        known = nvidia_arch(cc)
        if known is None:
            notes.append(f"nvidia: compute capability {cc[0]}.{cc[1]} of {name} is not in the table")
        else:
            matrix, features = known
        ops = nvidia_torch_ops(registered, cc)
    return DeviceCaps(
        kind="cuda",
        index=index,
        vendor="nvidia",
        name=name,
        arch=f"sm_{cc[0]}{cc[1]}" if cc is not None else UNKNOWN,
        compute_capability=cc,
        memory_bytes=int(memory) if memory is not None else None,
        cores=sms,
        matrix_types=matrix,
        features=features,
        libraries=libs,
        torch_ops=ops,
    )


def _from_torch(
    torch: Any, registered: frozenset[str], libs: frozenset[str], problem: str, notes: list[str]
) -> list[DeviceCaps]:
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        cc = tuple(int(x) for x in torch.cuda.get_device_capability(i))
        dev = _device(
            i,
            str(props.name),
            (cc[0], cc[1]),
            getattr(props, "total_memory", None),
            getattr(props, "multi_processor_count", None),
            registered,
            libs,
            notes,
        )
        devices.append(replace(dev, runnable=True, source=f"torch.cuda (NVML: {problem})"))
    return devices
