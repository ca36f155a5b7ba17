"""Presets load, round-trip JSON exactly, agree with the probe's tables; loading errors are clear."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest

from quantrt.capability import Capabilities, CapabilityError, load_capabilities, load_preset, preset_names
from quantrt.capability.amd import amd_arch
from quantrt.capability.cpu import cpu_matrix_types
from quantrt.capability.nvidia import nvidia_arch
from quantrt.capability.xpu import XPU_ARCHS

PRESETS = [
    "a100", "arc", "b200", "graviton3", "h100", "h200", "l40s", "mi300x", "mi355x", "pvc", "spr-amx", "zen3", "zen4",
]  # fmt: skip
CPU_ONLY = ("spr-amx", "zen4", "zen3", "graviton3")


def _preset_text(name: str) -> str:
    return (
        resources.files("quantrt.capability")
        .joinpath("presets")
        .joinpath(f"{name}.json")
        .read_text(encoding="utf-8")
    )


def test_preset_names() -> None:
    assert preset_names() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_round_trips_exactly(name: str) -> None:
    caps = load_preset(name)
    assert caps.origin == f"preset:{name}"
    assert json.dumps(caps.to_json(), indent=2) + "\n" == _preset_text(name)
    assert Capabilities.from_json(json.loads(json.dumps(caps.to_json()))) == caps
    assert hash(caps) == hash(Capabilities.from_json(caps.to_json()))
    assert load_capabilities(name) == caps


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_complete_and_agrees_with_the_tables(name: str) -> None:
    caps = load_preset(name)
    devices = [caps.cpu, *caps.accelerators]
    assert all(d.runnable for d in devices)
    assert all(d.name != "unknown" and d.arch != "unknown" and d.cores for d in devices)
    assert (
        caps.cpu.arch == ("aarch64" if name == "graviton3" else "x86_64") and caps.cpu.microarch != "unknown"
    )
    assert caps.cpu.matrix_types == cpu_matrix_types(caps.cpu.features)
    assert "_weight_int4pack_mm_for_cpu" in caps.cpu.torch_ops
    for dev in caps.accelerators:
        assert dev.memory_bytes
        assert "triton" in dev.libraries and "triton" in caps.libraries
        if dev.kind == "cuda":
            assert (dev.matrix_types, dev.features) == nvidia_arch(dev.compute_capability)
            assert "cupy" in dev.libraries
            assert {"_int_mm", "_weight_int4pack_mm", "_convert_weight_to_int4pack"} <= dev.torch_ops
        elif dev.kind == "rocm":
            assert (dev.matrix_types, dev.features) == amd_arch(dev.arch)
        else:
            assert dev.matrix_types == XPU_ARCHS[dev.arch]
    assert bool(caps.accelerators) == (name not in CPU_ONLY)


def test_h200_and_b200() -> None:
    h200 = load_preset("h200").device("cuda:0")
    assert (h200.name, h200.arch, h200.compute_capability) == ("NVIDIA H200", "sm_90", (9, 0))
    assert h200.has("fp8_e4m3", "fp8_e5m2", "wgmma", "tma", "_scaled_mm", "_scaled_grouped_mm")
    assert "fp4_e2m1" not in h200.matrix_types
    b200 = load_preset("b200").device("cuda")
    assert b200.arch == "sm_100" and b200.has("fp4_e2m1", "nvfp4", "mxfp4", "tcgen05")
    a100 = load_preset("a100").device("cuda:0")
    assert not a100.has("fp8_e4m3") and "_scaled_mm" not in a100.torch_ops


def test_cpu_and_amd_presets() -> None:
    spr = load_preset("spr-amx").cpu
    assert spr.has("amx_tile", "amx_bf16", "amx_int8", "avx512_fp16") and spr.microarch == "sapphire_rapids"
    zen4 = load_preset("zen4").cpu
    assert zen4.has("avx512_bf16", "avx512_vnni") and not zen4.features & {"amx_tile", "avx512_fp16"}
    zen3 = load_preset("zen3").cpu  # AVX2 only: the x86-64-v3 builds
    assert zen3.has("avx2", "fma", "f16c") and not any(f.startswith("avx512") for f in zen3.features)
    graviton3 = load_preset("graviton3").cpu
    assert (graviton3.arch, graviton3.microarch) == ("aarch64", "neoverse_v1")
    assert graviton3.has("neon", "dotprod", "i8mm", "sve") and graviton3.matrix_types == {
        "bf16",
        "fp16",
        "int8",
    }
    mi300x = load_preset("mi300x").device("cuda:0")
    assert (mi300x.kind, mi300x.arch) == ("rocm", "gfx942") and mi300x.has("mi300_class", "fp8_e4m3fnuz")
    mi355x = load_preset("mi355x").device("cuda:0")
    assert mi355x.has("mi350_class", "fp8_e4m3", "fp4_e2m1") and not mi355x.has("fp8_e4m3fnuz")


def test_a_capability_file_round_trips(tmp_path: Path) -> None:
    caps = load_preset("mi300x")
    path = tmp_path / "caps.json"
    path.write_text(json.dumps(caps.to_json()))
    loaded = load_capabilities(str(path))
    assert loaded.origin == f"file:{path}"
    assert dataclasses.replace(loaded, origin=caps.origin) == caps


def _error(spec: str) -> str:
    with pytest.raises(CapabilityError) as info:
        load_capabilities(spec)
    return str(info.value)


def test_unknown_preset_lists_the_known_ones() -> None:
    msg = _error("h300")
    assert msg == (
        "'h300' is neither a capability preset nor a .json file; known presets: "
        "a100, arc, b200, graviton3, h100, h200, l40s, mi300x, mi355x, pvc, spr-amx, zen3, zen4"
    )
    with pytest.raises(CapabilityError, match="unknown capability preset 'x'; known presets: a100, arc"):
        load_preset("x")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert _error(str(path)) == f"capability file {path} does not exist"
    assert _error(str(tmp_path) + "/") == f"capability file {tmp_path} is a directory, not a file"


def test_invalid_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "cpu": {"kind": "cpu",}\n}\n')
    assert _error(str(path)) == (
        f"capability file {path} is not valid JSON: line 2 column 25: Expecting property name enclosed in double quotes"
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda d: d["cpu"].update(cores="224"),
            "capabilities.cpu.cores: expected int, found str '224'",
        ),
        (
            lambda d: d["accelerators"][0].update(compute_capability="9.0"),
            "capabilities.accelerators[0].compute_capability: expected [major, minor], found '9.0'",
        ),
        (
            lambda d: d["accelerators"][0].update(matrix_types="fp8_e4m3"),
            "capabilities.accelerators[0].matrix_types: expected a list of strings, found 'fp8_e4m3'",
        ),
        (
            lambda d: d["accelerators"][0].update(runnable="yes"),
            "capabilities.accelerators[0].runnable: expected bool, found str 'yes'",
        ),
        (
            lambda d: d["accelerators"][0].update(kind="gpu"),
            "capabilities.accelerators[0].kind: expected one of ('cpu', 'cuda', 'rocm', 'xpu'), found 'gpu'",
        ),
        (lambda d: d.update(accelerators={}), "capabilities.accelerators: expected a list, found dict"),
    ],
)
def test_wrong_field_type_names_file_field_and_types(tmp_path: Path, edit, expected: str) -> None:
    data = load_preset("h200").to_json()
    edit(data)
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(data, indent=2))
    assert _error(str(path)) == f"capability file {path}: {expected}"


def test_empty_spec() -> None:
    assert _error("  ").startswith("empty capability spec; give a preset (a100, arc")
