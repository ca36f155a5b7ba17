"""Record this machine's raw probe sources, and replay such a recording through ProbeSources.

``python -m quantrt.capability.record OUTDIR`` writes:

- ``cpuinfo.txt``: /proc/cpuinfo as read
- ``py-cpuinfo.json``: ``cpuinfo.get_cpu_info()`` (the CPU fallback source)
- ``nvml.json``: NVML's answers per GPU (name, uuid, compute capability, memory, SM count)
- ``amdsmi.json``: amdsmi's answers per GPU (asic info, memory total, vram info, driver info)
- ``torch.json``: torch's version facts, device properties and op registrations per dispatch key
- ``software.json``: importable modules -> version
- ``environ.json``: the device-visibility environment variables
- ``capabilities.json``: what ``probe()`` said here, to check a replay against

The recorder creates a CUDA/HIP context to read device properties; the probe itself does not.
A failing call is recorded as an error string and replayed as the same failure.
``load_recording(DIR)`` turns the files back into ``ProbeSources`` with fake pynvml, amdsmi and
torch modules that give the recorded answers, so tests run a real machine's outputs anywhere.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from .probe import ENV_VARS, ProbeSources, probe
from .software import LIBRARIES, TORCH_OPS

DISPATCH_KEYS = ("CPU", "CUDA", "XPU")


def _error(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _call(fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    try:
        return fn(*args), None
    except Exception as e:
        return None, _error(e)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def record_nvml(pynvml: Any) -> dict[str, Any]:
    """NVML's answers on this machine, as plain JSON data."""
    out: dict[str, Any] = {"init_error": None, "driver_version": None, "devices": [], "errors": {}}
    _, err = _call(pynvml.nvmlInit)
    if err is not None:
        out["init_error"] = err
        return out
    try:
        driver, err = _call(pynvml.nvmlSystemGetDriverVersion)
        out["driver_version"] = _text(driver)
        if err:
            out["errors"]["driver_version"] = err
        count = pynvml.nvmlDeviceGetCount()
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {"errors": {}}
            for key, fn in (
                ("name", pynvml.nvmlDeviceGetName),
                ("uuid", pynvml.nvmlDeviceGetUUID),
                ("compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability),
                ("memory_total", pynvml.nvmlDeviceGetMemoryInfo),
                ("multiprocessor_count", getattr(pynvml, "nvmlDeviceGetAttributes_v2", None)),
            ):
                if fn is None:
                    dev[key], dev["errors"][key] = None, "function not in this pynvml"
                    continue
                value, err = _call(fn, h)
                if key == "memory_total" and value is not None:
                    value = int(value.total)
                elif key == "multiprocessor_count" and value is not None:
                    value = int(value.multiprocessorCount)
                elif key == "compute_capability" and value is not None:
                    value = [int(value[0]), int(value[1])]
                dev[key] = _text(value)
                if err is not None:
                    dev["errors"][key] = err
            out["devices"].append(dev)
    finally:
        _call(pynvml.nvmlShutdown)
    return out


def record_amdsmi(amdsmi: Any) -> dict[str, Any]:
    """amdsmi's answers on this machine, as plain JSON data."""
    out: dict[str, Any] = {"init_error": None, "devices": []}
    _, err = _call(amdsmi.amdsmi_init)
    if err is not None:
        out["init_error"] = err
        return out
    try:
        vram = getattr(getattr(amdsmi, "AmdSmiMemoryType", None), "VRAM", None)
        for h in amdsmi.amdsmi_get_processor_handles():
            dev: dict[str, Any] = {"errors": {}}
            calls: list[tuple[str, Any, tuple[Any, ...]]] = [
                ("asic_info", amdsmi.amdsmi_get_gpu_asic_info, (h,)),
                ("memory_total", getattr(amdsmi, "amdsmi_get_gpu_memory_total", None), (h, vram)),
                ("vram_info", getattr(amdsmi, "amdsmi_get_gpu_vram_info", None), (h,)),
                ("driver_info", getattr(amdsmi, "amdsmi_get_gpu_driver_info", None), (h,)),
            ]
            for key, fn, args in calls:
                if fn is None:
                    dev[key], dev["errors"][key] = None, "function not in this amdsmi"
                    continue
                dev[key], err = _call(fn, *args)
                if err is not None:
                    dev["errors"][key] = err
            out["devices"].append(dev)
    finally:
        _call(amdsmi.amdsmi_shut_down)
    return out


def _props(props: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(props, n) for n in names if hasattr(props, n)}


def record_torch(torch: Any) -> dict[str, Any]:
    """torch's facts the probe uses (and device properties, which create a device context)."""
    out: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "cuda_available": bool(torch.cuda.is_available()),
        "cuda_devices": [],
        "has_xpu": hasattr(torch, "xpu"),
        "xpu_available": bool(hasattr(torch, "xpu") and torch.xpu.is_available()),
        "xpu_devices": [],
        "ops": {},
    }
    if out["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            d = _props(p, ("name", "total_memory", "multi_processor_count", "gcnArchName"))
            d["capability"] = list(torch.cuda.get_device_capability(i))
            out["cuda_devices"].append(d)
    if out["xpu_available"]:
        for i in range(torch.xpu.device_count()):
            p = torch.xpu.get_device_properties(i)
            out["xpu_devices"].append(_props(p, ("name", "total_memory", "gpu_eu_count", "driver_version")))
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for key in DISPATCH_KEYS:
        ops = {}
        for op in TORCH_OPS:
            value, err = _call(has, f"aten::{op}", key)
            ops[op] = bool(value) if err is None else None
        out["ops"][key] = ops
    return out


def record(outdir: str | Path, with_py_cpuinfo: bool = True) -> list[Path]:
    """Write this machine's raw source outputs under ``outdir``; returns the files written.

    ``with_py_cpuinfo=False`` skips the one slow source (about a second), for quick checks.
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    src = ProbeSources.real()
    written: list[Path] = []

    def put(name: str, data: Any) -> None:
        path = out / name
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        written.append(path)

    if src.cpuinfo_text is not None:
        put("cpuinfo.txt", src.cpuinfo_text)
    if with_py_cpuinfo:
        info, err = _call(src.py_cpuinfo) if callable(src.py_cpuinfo) else (None, "py-cpuinfo not available")
        put("py-cpuinfo.json", info if err is None else {"error": err})
    put("nvml.json", record_nvml(src.pynvml) if src.pynvml else {"import_error": src.missing.get("pynvml")})
    put(
        "amdsmi.json",
        record_amdsmi(src.amdsmi) if src.amdsmi else {"import_error": src.missing.get("amdsmi")},
    )
    put("torch.json", record_torch(src.torch) if src.torch else {"import_error": src.missing.get("torch")})
    found = {}
    for module, _ in LIBRARIES.values():
        if src.find_spec is not None and src.find_spec(module):
            found[module] = (src.version(module) if src.version else None) or ""
    put("software.json", {"found": found})
    put("environ.json", dict(src.environ))
    put("capabilities.json", probe(src).to_json())
    return written


class NVMLError(Exception):
    """What the fake pynvml raises where the recorded call failed."""


def fake_pynvml(rec: Mapping[str, Any]) -> ModuleType:
    """A module with pynvml's probe-facing functions, answering as recorded in ``nvml.json``."""
    mod = ModuleType("pynvml")
    devices = list(rec.get("devices", []))
    errors = rec.get("errors", {})

    def answer(dev: Mapping[str, Any], key: str) -> Any:
        err = dev.get("errors", {}).get(key)
        if err is not None or dev.get(key) is None:
            raise NVMLError(err or "Not Supported")
        return dev[key]

    def init() -> None:
        if rec.get("init_error"):
            raise NVMLError(rec["init_error"])

    def driver() -> str:
        if errors.get("driver_version") or rec.get("driver_version") is None:
            raise NVMLError(errors.get("driver_version") or "Not Supported")
        return rec["driver_version"]

    mod.NVMLError = NVMLError
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = driver
    mod.nvmlDeviceGetCount = lambda: len(devices)
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    mod.nvmlDeviceGetName = lambda h: answer(h, "name")
    mod.nvmlDeviceGetUUID = lambda h: answer(h, "uuid")
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: tuple(answer(h, "compute_capability"))
    mod.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=answer(h, "memory_total"))
    mod.nvmlDeviceGetAttributes_v2 = lambda h: SimpleNamespace(
        multiprocessorCount=answer(h, "multiprocessor_count")
    )
    return mod


class AmdSmiException(Exception):
    """What the fake amdsmi raises where the recorded call failed."""


def fake_amdsmi(rec: Mapping[str, Any]) -> ModuleType:
    """A module with amdsmi's probe-facing functions, answering as recorded in ``amdsmi.json``."""
    mod = ModuleType("amdsmi")
    devices = list(rec.get("devices", []))

    def answer(dev: Mapping[str, Any], key: str) -> Any:
        err = dev.get("errors", {}).get(key)
        if err is not None or dev.get(key) is None:
            raise AmdSmiException(err or "not supported")
        return dev[key]

    def init(*_: Any) -> None:
        if rec.get("init_error"):
            raise AmdSmiException(rec["init_error"])

    mod.AmdSmiException = AmdSmiException
    mod.AmdSmiMemoryType = SimpleNamespace(VRAM=0)
    mod.amdsmi_init = init
    mod.amdsmi_shut_down = lambda: None
    mod.amdsmi_get_processor_handles = lambda: list(devices)
    mod.amdsmi_get_gpu_asic_info = lambda h: answer(h, "asic_info")
    mod.amdsmi_get_gpu_memory_total = lambda h, _t: answer(h, "memory_total")
    mod.amdsmi_get_gpu_vram_info = lambda h: answer(h, "vram_info")
    mod.amdsmi_get_gpu_driver_info = lambda h: answer(h, "driver_info")
    return mod


def fake_torch(rec: Mapping[str, Any]) -> SimpleNamespace:
    """An object with the parts of torch the probe touches, answering as recorded in ``torch.json``."""
    cuda_devs = list(rec.get("cuda_devices", []))
    xpu_devs = list(rec.get("xpu_devices", []))
    ops = rec.get("ops", {})

    def has_kernel(qualified: str, key: str) -> bool:
        op = qualified.split("::", 1)[-1]
        value = ops.get(key, {}).get(op)
        if value is None:
            raise RuntimeError(f"operator {qualified} does not exist")
        return bool(value)

    cuda = SimpleNamespace(
        is_available=lambda: bool(rec.get("cuda_available")),
        device_count=lambda: len(cuda_devs),
        get_device_properties=lambda i: SimpleNamespace(**cuda_devs[i]),
        get_device_capability=lambda i: tuple(cuda_devs[i]["capability"]),
    )
    fake = SimpleNamespace(
        __version__=rec.get("version", "unknown"),
        version=SimpleNamespace(cuda=rec.get("cuda"), hip=rec.get("hip")),
        cuda=cuda,
        _C=SimpleNamespace(_dispatch_has_kernel_for_dispatch_key=has_kernel),
    )
    if rec.get("has_xpu", True):
        fake.xpu = SimpleNamespace(
            is_available=lambda: bool(rec.get("xpu_available")),
            device_count=lambda: len(xpu_devs),
            get_device_properties=lambda i: SimpleNamespace(**xpu_devs[i]),
        )
    return fake


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def load_recording(directory: str | Path) -> ProbeSources:
    """ProbeSources that replay the files ``record()`` wrote (missing files are missing sources)."""
    d = Path(directory)
    missing: dict[str, str] = {}
    cpuinfo = d / "cpuinfo.txt"
    cpuinfo_text = cpuinfo.read_text(encoding="utf-8") if cpuinfo.is_file() else None
    if cpuinfo_text is None:
        missing["cpuinfo"] = "not in the recording"
    py_info = _read_json(d / "py-cpuinfo.json")
    modules: dict[str, Any] = {}
    for name, file, make in (
        ("pynvml", "nvml.json", fake_pynvml),
        ("amdsmi", "amdsmi.json", fake_amdsmi),
        ("torch", "torch.json", fake_torch),
    ):
        rec = _read_json(d / file)
        if rec is None or "import_error" in rec:
            modules[name] = None
            missing[name] = (rec or {}).get("import_error") or "not in the recording"
        else:
            modules[name] = make(rec)
    found = (_read_json(d / "software.json") or {}).get("found", {})
    return ProbeSources(
        cpuinfo_text=cpuinfo_text,
        py_cpuinfo=None if py_info is None or "error" in py_info else py_info,
        pynvml=modules["pynvml"],
        amdsmi=modules["amdsmi"],
        torch=modules["torch"],
        find_spec=lambda m: m in found,
        version=lambda m: found.get(m) or None,
        environ={k: v for k, v in (_read_json(d / "environ.json") or {}).items() if k in ENV_VARS},
        missing=missing,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m quantrt.capability.record OUTDIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m quantrt.capability.record OUTDIR", file=sys.stderr)
        return 2
    for path in record(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
