"""A source that is missing or raises gives unknown/empty values and a note, never a crash."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from quantrt.capability import ProbeSources, probe
from quantrt.capability.record import fake_torch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "probe"


class NVMLError_LibraryNotFound(Exception):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class AmdSmiLibraryException(Exception):
    pass


def _pynvml_without_library() -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def init() -> None:
        raise NVMLError_LibraryNotFound()

    mod.nvmlInit = init
    return mod


def _amdsmi_failing_init() -> types.ModuleType:
    mod = types.ModuleType("amdsmi")

    def init(*_: Any) -> None:
        raise AmdSmiLibraryException(
            "Error code:\n\t34 | AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"
        )

    mod.amdsmi_init = init
    return mod


def test_nvml_library_missing_and_amdsmi_init_failure() -> None:
    cpuinfo = (FIXTURES / "zen4-epyc.cpuinfo").read_text()
    caps = probe(
        ProbeSources(cpuinfo_text=cpuinfo, pynvml=_pynvml_without_library(), amdsmi=_amdsmi_failing_init())
    )
    assert caps.accelerators == ()
    assert caps.cpu.microarch == "zen4"
    assert "nvml: nvmlInit failed: NVML Shared Library Not Found" in caps.notes
    assert (
        "amdsmi: amdsmi_init failed: Error code:\n\t34 | AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"
        in caps.notes
    )


def test_nothing_at_all() -> None:
    caps = probe(ProbeSources())
    assert caps.cpu.kind == "cpu" and caps.cpu.vendor == "unknown"
    assert caps.cpu.runnable is False and caps.cpu.torch_ops == frozenset()
    assert caps.accelerators == ()
    assert caps.libraries == {}
    assert caps.torch_version == "unknown"
    assert set(caps.notes) == {
        "torch: not available; no torch ops, nothing runnable",
        "software: no module finder given, no library reported",
        "cpu: /proc/cpuinfo unavailable",
        "cpu: py-cpuinfo unavailable",
        "nvml: pynvml is not importable",
        "amdsmi: amdsmi is not importable",
    }


def test_nvml_raising_midway_is_a_note() -> None:
    mod = types.ModuleType("pynvml")
    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: "580.159.04"

    def count() -> int:
        raise RuntimeError("GPU is lost")

    mod.nvmlDeviceGetCount = count
    caps = probe(ProbeSources(pynvml=mod))
    assert caps.accelerators == ()
    assert "nvml: probe failed: RuntimeError: GPU is lost" in caps.notes


def test_nvml_per_device_failures_leave_fields_unknown() -> None:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def fail(*_: Any) -> Any:
        raise NVMLError("Unknown Error")

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = fail
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetUUID = fail
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetCudaComputeCapability = fail
    mod.nvmlDeviceGetMemoryInfo = fail
    caps = probe(ProbeSources(pynvml=mod))
    (gpu,) = caps.accelerators
    assert (gpu.name, gpu.arch, gpu.compute_capability, gpu.memory_bytes) == (
        "NVIDIA H100 80GB HBM3",
        "unknown",
        None,
        None,
    )
    assert gpu.driver == "unknown" and gpu.matrix_types == frozenset()
    assert "nvml: GPU 0 compute capability: Unknown Error" in caps.notes
    assert "nvml: driver version: Unknown Error" in caps.notes


def test_amdsmi_asic_failure_leaves_arch_unknown() -> None:
    mod = types.ModuleType("amdsmi")

    def fail(*_: Any) -> Any:
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")

    mod.amdsmi_init = lambda *_: None
    mod.amdsmi_shut_down = lambda: None
    mod.amdsmi_get_processor_handles = lambda: ["h0"]
    mod.amdsmi_get_gpu_asic_info = fail
    mod.amdsmi_get_gpu_driver_info = fail
    caps = probe(ProbeSources(amdsmi=mod))
    (gpu,) = caps.accelerators
    assert (gpu.kind, gpu.arch, gpu.memory_bytes, gpu.matrix_types) == ("rocm", "unknown", None, frozenset())
    assert "amdsmi: GPU 0 asic info: AMDSMI_STATUS_NOT_SUPPORTED" in caps.notes
    assert "amd: target unknown of unknown is not in the table" in caps.notes


def test_torch_without_dispatch_queries() -> None:
    broken = types.SimpleNamespace(
        __version__="2.13.0+cpu",
        version=types.SimpleNamespace(cuda=None, hip=None),
        cuda=types.SimpleNamespace(is_available=lambda: False),
        _C=types.SimpleNamespace(),
    )
    caps = probe(ProbeSources(cpuinfo_text=(FIXTURES / "zen4-epyc.cpuinfo").read_text(), torch=broken))
    assert caps.cpu.microarch == "zen4"
    assert caps.cpu.torch_ops == frozenset()
    assert any(n.startswith("cpu: probe failed: AttributeError") for n in caps.notes)


def test_a_library_finder_that_raises() -> None:
    def find_spec(module: str) -> bool:
        if module == "cupy":
            raise ValueError("cupy.__spec__ is None")
        return module == "triton"

    caps = probe(ProbeSources(find_spec=find_spec, version=lambda m: None))
    assert caps.libraries == {"triton": ""}
    assert "software: looking for cupy failed: ValueError: cupy.__spec__ is None" in caps.notes


def test_op_missing_from_an_older_torch_is_just_absent() -> None:
    rec = {"version": "2.11.0+cpu", "ops": {"CPU": {"_int_mm": True, "_weight_int8pack_mm": True}}}
    caps = probe(ProbeSources(torch=fake_torch(rec)))
    assert caps.cpu.torch_ops == {"_int_mm", "_weight_int8pack_mm"}
    assert caps.cpu.runnable
