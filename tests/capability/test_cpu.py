"""CPU probing from recorded /proc/cpuinfo and py-cpuinfo outputs of real machines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrt.capability import ProbeSources, probe
from quantrt.capability.cpu import consistent_microarch, cpu_from_cpuinfo, normalize_x86, x86_microarch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "probe"

AMX = {"amx_tile", "amx_bf16", "amx_int8", "amx_fp16"}
ZEN4_FEATURES = {
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
}
SPR_FEATURES = ZEN4_FEATURES | {"avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}


def _cpuinfo(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_zen4_epyc_from_proc_cpuinfo() -> None:
    caps = probe(ProbeSources(cpuinfo_text=_cpuinfo("zen4-epyc.cpuinfo")))
    cpu = caps.cpu
    assert (cpu.kind, cpu.vendor, cpu.name, cpu.arch, cpu.microarch) == (
        "cpu",
        "amd",
        "AMD EPYC",
        "x86_64",
        "zen4",
    )
    assert cpu.cores == 2
    assert cpu.features == ZEN4_FEATURES
    assert not cpu.features & (AMX | {"avx512_fp16", "avx_vnni"})
    assert cpu.matrix_types == {"bf16", "int8"}
    assert cpu.source == "/proc/cpuinfo"


def test_sapphire_rapids_with_amx() -> None:
    cpu = probe(ProbeSources(cpuinfo_text=_cpuinfo("spr-xeon-8480c.cpuinfo"))).cpu
    assert (cpu.vendor, cpu.name, cpu.arch) == ("intel", "Intel(R) Xeon(R) Platinum 8480C", "x86_64")
    assert cpu.microarch == "sapphire_rapids"
    assert cpu.cores == 224  # the excerpt is the last of 224 logical CPUs
    assert cpu.features == SPR_FEATURES
    assert "amx_fp16" not in cpu.features
    assert cpu.matrix_types == {"bf16", "int8", "fp16"}


def test_emerald_rapids_host_of_the_h200_machine() -> None:
    cpu = probe(ProbeSources(cpuinfo_text=_cpuinfo("h200-recording/cpuinfo.txt"))).cpu
    assert (cpu.vendor, cpu.name, cpu.microarch, cpu.cores) == (
        "intel",
        "Intel(R) Xeon(R) Processor",
        "emerald_rapids",
        16,
    )
    assert cpu.features == SPR_FEATURES
    assert cpu.has("amx_bf16", "amx_int8", "bf16", "int8", "fp16")


def test_graviton3_neoverse_v1() -> None:
    cpu = probe(ProbeSources(cpuinfo_text=_cpuinfo("graviton3.cpuinfo"))).cpu
    assert (cpu.vendor, cpu.name, cpu.arch, cpu.microarch) == ("arm", "Neoverse-V1", "aarch64", "neoverse_v1")
    assert cpu.cores == 2
    assert cpu.features == {"neon", "fp16", "dotprod", "fhm", "sve", "sve_i8mm", "sve_bf16", "i8mm", "bf16"}
    assert "sve2" not in cpu.features
    assert cpu.matrix_types == {"bf16", "int8", "fp16"}


def test_py_cpuinfo_is_the_fallback_when_proc_cpuinfo_is_missing() -> None:
    info = json.loads((FIXTURES / "zen4-epyc.py-cpuinfo.json").read_text())
    caps = probe(ProbeSources(cpuinfo_text=None, py_cpuinfo=lambda: info))
    cpu = caps.cpu
    assert (cpu.vendor, cpu.name, cpu.arch, cpu.microarch, cpu.cores) == (
        "amd",
        "AMD EPYC",
        "x86_64",
        "zen4",
        2,
    )
    assert cpu.features == ZEN4_FEATURES
    assert cpu.source == "py-cpuinfo"
    assert any(n.startswith("cpu: /proc/cpuinfo unavailable") for n in caps.notes)


def test_py_cpuinfo_is_not_called_when_proc_cpuinfo_parses() -> None:
    def explode() -> dict:
        raise AssertionError("py-cpuinfo called although /proc/cpuinfo was readable")

    cpu = probe(ProbeSources(cpuinfo_text=_cpuinfo("zen4-epyc.cpuinfo"), py_cpuinfo=explode)).cpu
    assert cpu.source == "/proc/cpuinfo"


def test_unparseable_cpuinfo_falls_back_and_says_so() -> None:
    info = json.loads((FIXTURES / "zen4-epyc.py-cpuinfo.json").read_text())
    caps = probe(ProbeSources(cpuinfo_text="processor\t: 0\ncpu\t\t: POWER9\n", py_cpuinfo=info))
    assert caps.cpu.source == "py-cpuinfo"
    assert "cpu: /proc/cpuinfo has no x86 flags or arm64 Features this probe can read" in caps.notes


def test_no_cpu_source_gives_unknown_cpu_and_notes() -> None:
    caps = probe(ProbeSources(missing={"cpuinfo": "FileNotFoundError: /proc/cpuinfo"}))
    assert caps.cpu.kind == "cpu"
    assert caps.cpu.vendor == "unknown" and caps.cpu.features == frozenset()
    assert "cpu: /proc/cpuinfo unavailable: FileNotFoundError: /proc/cpuinfo" in caps.notes
    assert "cpu: py-cpuinfo unavailable" in caps.notes


def test_features_are_those_of_every_cpu() -> None:
    text = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: lm avx2 avx512f amx_tile\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: lm avx2\n"
    )
    assert cpu_from_cpuinfo(text).features == {"avx2"}


def test_other_spellings_are_normalized() -> None:
    assert normalize_x86(["AVX512VNNI", "avx512bf16", "amx-bf16", "avxvnni", "sse2"]) == {
        "avx512_vnni",
        "avx512_bf16",
        "amx_bf16",
        "avx_vnni",
    }


@pytest.mark.parametrize(
    ("vendor", "family", "model", "stepping", "expected"),
    [
        ("amd", 25, 0x11, 1, "zen4"),
        ("amd", 25, 0x61, 2, "zen4"),
        ("amd", 25, 0xA0, 1, "zen4"),
        ("amd", 25, 0x01, 1, "zen3"),
        ("amd", 26, 0x02, 0, "zen5"),
        ("amd", 23, 0x31, 0, "zen2"),
        ("intel", 6, 143, 8, "sapphire_rapids"),
        ("intel", 6, 207, 2, "emerald_rapids"),
        ("intel", 6, 85, 7, "cascade_lake"),
        ("intel", 6, 85, 4, "skylake_server"),
        ("intel", 6, 250, 0, "unknown"),
        ("amd", 25, 0x35, 0, "unknown"),
    ],
)
def test_x86_microarch_table(vendor: str, family: int, model: int, stepping: int, expected: str) -> None:
    assert x86_microarch(vendor, family, model, stepping) == expected


@pytest.mark.parametrize(
    ("part", "micro"), [("0xd0c", "neoverse_n1"), ("0xd40", "neoverse_v1"), ("0xd4f", "neoverse_v2")]
)
def test_arm_parts(part: str, micro: str) -> None:
    text = f"processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: {part}\n"
    cpu = cpu_from_cpuinfo(text)
    assert (cpu.vendor, cpu.microarch, cpu.features) == ("arm", micro, {"neon"})


def test_a_model_number_that_contradicts_the_features_is_not_believed() -> None:
    """A Xeon with AMX under a hypervisor reported family 6 model 167 (Rocket Lake, no AMX)."""
    assert x86_microarch("intel", 6, 167, 1) == "rocket_lake"
    assert consistent_microarch("rocket_lake", {"avx512f", "amx_tile", "amx_bf16"}) == "unknown"
    assert consistent_microarch("sapphire_rapids", {"amx_tile", "amx_bf16"}) == "sapphire_rapids"
    assert consistent_microarch("rocket_lake", {"avx512f"}) == "rocket_lake"
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\nflags\t\t: fpu lm avx2 avx512f amx_tile amx_bf16\n"
    cpu = cpu_from_cpuinfo(text)
    assert cpu is not None and cpu.microarch == "unknown" and "amx_tile" in cpu.features
