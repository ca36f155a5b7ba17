"""GPU probing from recorded NVML, amdsmi and torch answers, replayed through fake modules."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from quantrt.capability import ProbeSources, probe
from quantrt.capability.amd import amd_arch, gfx_target
from quantrt.capability.nvidia import nvidia_arch, nvidia_torch_ops
from quantrt.capability.record import fake_amdsmi, fake_torch, load_recording

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "probe"
H200_DIR = FIXTURES / "h200-recording"
GIB = 1 << 30

CUDA_OPS_REGISTERED = {
    "_weight_int4pack_mm",
    "_convert_weight_to_int4pack",
    "_int_mm",
    "_scaled_mm",
    "_scaled_grouped_mm",
    "_weight_int8pack_mm",
}


def _ops(registered: set[str]) -> dict[str, bool]:
    names = [
        "_weight_int4pack_mm",
        "_weight_int4pack_mm_for_cpu",
        "_weight_int8pack_mm",
        "_int_mm",
        "_scaled_mm",
        "_scaled_grouped_mm",
        "_dyn_quant_matmul_4bit",
        "_weight_int4pack_mm_with_scales_and_zeros",
        "_convert_weight_to_int4pack",
        "_convert_weight_to_int4pack_for_cpu",
    ]
    return {n: n in registered for n in names}


def _pynvml_like(gpus: list[dict[str, Any]], driver: bytes = b"580.159.03") -> types.ModuleType:
    """A module shaped like pynvml (error classes, byte strings as older releases return)."""
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        def __str__(self) -> str:
            return "Not Supported"

    mod.NVMLError = NVMLError
    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: driver
    mod.nvmlDeviceGetCount = lambda: len(gpus)
    mod.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    mod.nvmlDeviceGetName = lambda h: h["name"].encode()
    mod.nvmlDeviceGetUUID = lambda h: h["uuid"].encode()
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: h["cc"]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["memory"], free=0, used=0)

    def attributes(h: dict[str, Any]) -> Any:
        raise NVMLError_NotSupported()

    mod.nvmlDeviceGetAttributes_v2 = attributes
    return mod


H200 = {"name": "NVIDIA H200", "uuid": "GPU-0040f96d", "cc": (9, 0), "memory": 150754820096}
B200 = {"name": "NVIDIA B200", "uuid": "GPU-77aa", "cc": (10, 0), "memory": 183359 * (1 << 20)}


def test_h200_via_nvml() -> None:
    caps = probe(ProbeSources(pynvml=_pynvml_like([H200])))
    (gpu,) = caps.accelerators
    assert (gpu.kind, gpu.index, gpu.vendor, gpu.name) == ("cuda", 0, "nvidia", "NVIDIA H200")
    assert (gpu.arch, gpu.compute_capability, gpu.sm) == ("sm_90", (9, 0), 90)
    assert gpu.memory_bytes == 150754820096
    assert gpu.driver == "580.159.03"
    assert gpu.cores is None  # NVML gives no SM count for a full GPU
    assert gpu.matrix_types == {"fp16", "bf16", "tf32", "int8", "fp8_e4m3", "fp8_e5m2"}
    assert "fp4_e2m1" not in gpu.matrix_types
    assert gpu.features == {"tma", "wgmma"}
    assert gpu.runnable is False
    assert gpu.source == "nvml; not runnable: torch is not importable"
    assert gpu.torch_device == "cuda:0"


def test_h200_recording_replays_exactly() -> None:
    caps = probe(load_recording(H200_DIR))
    assert caps.to_json() == json.loads((H200_DIR / "capabilities.json").read_text())
    (gpu,) = caps.accelerators
    assert (gpu.name, gpu.arch, gpu.memory_bytes, gpu.driver) == (
        "NVIDIA H200",
        "sm_90",
        150754820096,
        "580.159.04",
    )
    assert gpu.has("fp8_e4m3", "fp8_e5m2", "bf16", "tma", "wgmma", "triton", "cupy")
    assert not gpu.has("fp4_e2m1")
    assert gpu.torch_ops == CUDA_OPS_REGISTERED
    assert gpu.runnable and gpu.source == "nvml"
    assert caps.torch_version == "2.11.0+cu130"
    assert caps.libraries == {
        "cupy": "14.2.0",
        "pynvml": "13.610.43",
        "transformers": "5.17.0",
        "triton": "3.6.0",
    }
    assert caps.cpu.microarch == "emerald_rapids"
    assert caps.notes == ("amdsmi: amdsmi is not installed",)


def test_torch_cuda_describes_gpus_when_nvml_is_missing() -> None:
    torch_rec = json.loads((H200_DIR / "torch.json").read_text())
    caps = probe(ProbeSources(torch=fake_torch(torch_rec), missing={"pynvml": "pynvml is not installed"}))
    (gpu,) = caps.accelerators
    assert (gpu.name, gpu.arch, gpu.cores, gpu.memory_bytes) == ("NVIDIA H200", "sm_90", 132, 150109880320)
    assert gpu.runnable
    assert gpu.source == "torch.cuda (NVML: pynvml is not installed)"
    assert "nvml: pynvml is not installed; GPUs described by torch.cuda" in caps.notes


def test_cpu_only_torch_sees_gpus_it_cannot_run() -> None:
    torch_rec = {"version": "2.13.0+cpu", "cuda": None, "hip": None, "cuda_available": False, "ops": {}}
    (gpu,) = probe(ProbeSources(pynvml=_pynvml_like([H200]), torch=fake_torch(torch_rec))).accelerators
    assert not gpu.runnable
    assert gpu.source == "nvml; not runnable: torch 2.13.0+cpu was built without CUDA"
    assert gpu.torch_ops == frozenset()


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        (None, ["NVIDIA H200", "NVIDIA B200"]),
        ("1", ["NVIDIA B200"]),
        ("1,0", ["NVIDIA B200", "NVIDIA H200"]),
        ("GPU-77aa", ["NVIDIA B200"]),
        ("0,7,1", ["NVIDIA H200"]),
        ("", []),
    ],
)
def test_cuda_visible_devices_orders_and_filters(visible: str | None, names: list[str]) -> None:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    caps = probe(ProbeSources(pynvml=_pynvml_like([H200, B200]), environ=environ))
    assert [g.name for g in caps.accelerators] == names
    assert [g.index for g in caps.accelerators] == list(range(len(names)))


def test_blackwell_has_fp4_and_tcgen05() -> None:
    (gpu,) = probe(ProbeSources(pynvml=_pynvml_like([B200]))).accelerators
    assert gpu.arch == "sm_100"
    assert {"fp4_e2m1", "nvfp4", "mxfp4", "mxfp6", "mxfp8", "fp8_e4m3"} <= gpu.matrix_types
    assert gpu.features == {"tma", "tcgen05"}


@pytest.mark.parametrize(
    ("cc", "has", "lacks"),
    [
        ((7, 0), {"fp16"}, {"int8", "bf16"}),
        ((7, 5), {"fp16", "int8"}, {"bf16"}),
        ((8, 0), {"bf16", "tf32", "int8"}, {"fp8_e4m3"}),
        ((8, 6), {"bf16", "tf32"}, {"fp8_e4m3"}),
        ((8, 9), {"fp8_e4m3", "fp8_e5m2"}, {"fp4_e2m1"}),
        ((12, 0), {"fp4_e2m1", "mxfp4", "fp8_e4m3"}, set()),
    ],
)
def test_nvidia_matrix_table(cc: tuple[int, int], has: set[str], lacks: set[str]) -> None:
    matrix, _ = nvidia_arch(cc)
    assert has <= matrix and not lacks & matrix


def test_nvidia_table_edges() -> None:
    assert nvidia_arch((8, 8)) == nvidia_arch((8, 7))
    assert nvidia_arch((12, 0))[1] == {"tma"}
    assert nvidia_arch((13, 0)) is None
    assert nvidia_torch_ops(frozenset(CUDA_OPS_REGISTERED), (8, 0)) == {
        "_weight_int4pack_mm",
        "_convert_weight_to_int4pack",
        "_int_mm",
        "_weight_int8pack_mm",
    }
    assert "_scaled_grouped_mm" not in nvidia_torch_ops(frozenset(CUDA_OPS_REGISTERED), (8, 9))


def test_unknown_compute_capability_is_noted() -> None:
    future = {"name": "NVIDIA Next", "uuid": "GPU-1", "cc": (13, 0), "memory": 1}
    caps = probe(ProbeSources(pynvml=_pynvml_like([future])))
    assert caps.accelerators[0].arch == "sm_130"
    assert caps.accelerators[0].matrix_types == frozenset()
    assert "nvidia: compute capability 13.0 of NVIDIA Next is not in the table" in caps.notes


# amdsmi answers in the shape its Python binding returns them (amdsmi_interface.py): asic info keys
# market_name, vendor_id, device_id, num_compute_units, target_graphics_version; vram_size in MiB.
MI300X_ASIC = {
    "market_name": "AMD Instinct MI300X",
    "vendor_id": "0x1002",
    "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
    "subvendor_id": "0x1002",
    "device_id": "0x74a1",
    "rev_id": "0x00",
    "asic_serial": "0x5F2E3A1B7C9D4E60",
    "oam_id": 0,
    "num_compute_units": 304,
    "target_graphics_version": "gfx942",
}
MI300X = {
    "asic_info": MI300X_ASIC,
    "memory_total": 192 * GIB,
    "vram_info": {"vram_type": 20, "vram_vendor": "HYNIX", "vram_size": 196608, "vram_bit_width": 8192},
    "driver_info": {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01 00:00"},
    "errors": {},
}
ROCM_TORCH = {
    "version": "2.11.0+rocm7.1",
    "cuda": None,
    "hip": "7.1.25424",
    "cuda_available": True,
    "cuda_devices": [
        {
            "name": "AMD Instinct MI300X",
            "gcnArchName": "gfx942:sramecc+:xnack-",
            "total_memory": 205822885888,
            "multi_processor_count": 304,
            "capability": [9, 4],
        }
    ],
    "ops": {"CUDA": _ops(CUDA_OPS_REGISTERED), "CPU": _ops({"_int_mm"})},
}


def test_mi300x_via_amdsmi() -> None:
    found = {"triton": "3.6.0", "aiter": "0.1.5"}
    caps = probe(
        ProbeSources(
            amdsmi=fake_amdsmi({"devices": [MI300X]}),
            torch=fake_torch(ROCM_TORCH),
            find_spec=lambda m: m in found,
            version=found.get,
        )
    )
    (gpu,) = caps.accelerators
    assert (gpu.kind, gpu.vendor, gpu.name, gpu.arch) == ("rocm", "amd", "AMD Instinct MI300X", "gfx942")
    assert (gpu.memory_bytes, gpu.cores, gpu.driver) == (192 * GIB, 304, "6.10.5")
    assert gpu.matrix_types == {"fp16", "bf16", "int8", "tf32", "fp8_e4m3fnuz", "fp8_e5m2fnuz"}
    assert "fp8_e4m3" not in gpu.matrix_types
    assert gpu.features == {"mi300_class", "aiter"}
    assert gpu.libraries == {"triton", "aiter"}
    assert gpu.torch_ops == CUDA_OPS_REGISTERED
    assert gpu.runnable and gpu.source == "amdsmi"
    assert gpu.torch_device == "cuda:0"
    assert caps.device("cuda:0") is gpu
    assert caps.accelerators[0].sm is None


def test_amdsmi_vram_info_in_mib_when_memory_total_fails() -> None:
    dev = {**MI300X, "errors": {"memory_total": "AMDSMI_STATUS_NOT_SUPPORTED"}}
    (gpu,) = probe(ProbeSources(amdsmi=fake_amdsmi({"devices": [dev]}))).accelerators
    assert gpu.memory_bytes == 196608 * (1 << 20)
    assert not gpu.runnable
    assert gpu.source == "amdsmi; not runnable: torch is not importable"


def test_mi355x_is_ocp_fp8_with_fp4() -> None:
    asic = {**MI300X_ASIC, "market_name": "AMD Instinct MI355X", "target_graphics_version": "gfx950"}
    (gpu,) = probe(
        ProbeSources(amdsmi=fake_amdsmi({"devices": [{**MI300X, "asic_info": asic}]}))
    ).accelerators
    assert gpu.arch == "gfx950"
    assert gpu.features == {"mi350_class"}
    assert {"fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp4", "mxfp6", "mxfp8"} <= gpu.matrix_types
    assert not gpu.matrix_types & {"fp8_e4m3fnuz", "tf32"}


def test_rocm_torch_fallback_reads_gcn_arch_name() -> None:
    caps = probe(ProbeSources(torch=fake_torch(ROCM_TORCH)))
    (gpu,) = caps.accelerators
    assert (gpu.arch, gpu.cores, gpu.memory_bytes) == ("gfx942", 304, 205822885888)
    assert gpu.source == "torch.cuda (amdsmi: amdsmi is not importable)"
    assert "amdsmi: amdsmi is not importable; GPUs described by torch.cuda" in caps.notes


@pytest.mark.parametrize(
    ("raw", "gfx", "fp8"),
    [
        ("gfx90a", "gfx90a", False),
        ("GFX942", "gfx942", True),
        ("gfx1100", "gfx1100", False),
        ("gfx1201", "gfx1201", True),
    ],
)
def test_amd_table(raw: str, gfx: str, fp8: bool) -> None:
    assert gfx_target(raw) == gfx
    matrix, _ = amd_arch(gfx)
    assert {"fp16", "bf16", "int8"} <= matrix
    assert bool(matrix & {"fp8_e4m3", "fp8_e4m3fnuz"}) == fp8


def _xpu_torch(name: str) -> Any:
    rec = {
        "version": "2.11.0+xpu",
        "cuda": None,
        "hip": None,
        "cuda_available": False,
        "xpu_available": True,
        "xpu_devices": [
            {"name": name, "total_memory": 64 * GIB, "gpu_eu_count": 512, "driver_version": "1.6.31294"}
        ],
        "ops": {"XPU": _ops({"_weight_int4pack_mm", "_weight_int4pack_mm_with_scales_and_zeros"})},
    }
    return fake_torch(rec)


@pytest.mark.parametrize(
    ("name", "arch", "tf32"),
    [
        ("Intel(R) Data Center GPU Max 1550", "pvc", True),
        ("Intel(R) Arc(TM) A770 Graphics", "dg2", False),
        ("Intel(R) Arc(TM) B580 Graphics", "bmg", False),
    ],
)
def test_intel_xpu(name: str, arch: str, tf32: bool) -> None:
    found = {"intel_extension_for_pytorch": "2.8.10", "triton": "3.6.0"}
    caps = probe(ProbeSources(torch=_xpu_torch(name), find_spec=lambda m: m in found, version=found.get))
    (gpu,) = caps.accelerators
    assert (gpu.kind, gpu.vendor, gpu.arch, gpu.cores, gpu.driver) == ("xpu", "intel", arch, 512, "1.6.31294")
    assert {"fp16", "bf16", "int8"} <= gpu.matrix_types
    assert ("tf32" in gpu.matrix_types) == tf32
    assert gpu.libraries == {"ipex", "triton"}
    assert gpu.torch_ops == {"_weight_int4pack_mm", "_weight_int4pack_mm_with_scales_and_zeros"}
    assert gpu.runnable and gpu.torch_device == "xpu:0"
    assert caps.cpu.libraries == {"ipex"}


def test_integrated_intel_gpu_is_unknown_and_noted() -> None:
    caps = probe(ProbeSources(torch=_xpu_torch("Intel(R) Graphics [0x7d55]")))
    assert caps.accelerators[0].arch == "unknown"
    assert caps.accelerators[0].matrix_types == frozenset()
    assert "xpu: no matrix-unit table for 'Intel(R) Graphics [0x7d55]'" in caps.notes
