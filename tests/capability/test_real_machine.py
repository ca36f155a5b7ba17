"""The probe on the machine running the tests: its answers, its speed, and record/replay of it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import quantrt.capability as capability
from quantrt.capability import probe
from quantrt.capability.cpu import cpu_from_cpuinfo
from quantrt.capability.record import load_recording, main, record

CAPABILITY_DIR = Path(capability.__file__).resolve().parent


def _proc_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def _is_the_zen4_dev_machine() -> bool:
    text = _proc_cpuinfo() or ""
    return "AuthenticAMD" in text and "cpu family\t: 25\nmodel\t\t: 17\n" in text


def test_real_probe_matches_proc_cpuinfo_and_is_cached() -> None:
    caps = probe()
    assert probe() is caps
    assert caps.origin == "probe"
    text = _proc_cpuinfo()
    if text is not None and cpu_from_cpuinfo(text) is not None:
        expected = cpu_from_cpuinfo(text)
        assert (caps.cpu.vendor, caps.cpu.features, caps.cpu.cores) == (
            expected.vendor,
            expected.features,
            expected.cores,
        )
    assert caps.cpu.runnable and "_int_mm" in caps.cpu.torch_ops


@pytest.mark.skipif(not _is_the_zen4_dev_machine(), reason="asserts the project's Zen 4 EPYC machine")
def test_real_probe_on_the_zen4_machine() -> None:
    cpu = probe().cpu
    assert (cpu.vendor, cpu.arch, cpu.microarch) == ("amd", "x86_64", "zen4")
    assert {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"} <= cpu.features
    assert not cpu.features & {"amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "avx512_fp16"}


def test_probe_costs_little_beyond_importing_torch(tmp_path: Path) -> None:
    """The probe reads files and libraries, it never compiles or starts a device context: in a
    fresh process with torch already imported, importing quantrt.capability and probing takes
    well under a second (milliseconds here). Importing torch itself (~2 s) is not ours to time."""
    code = (
        "import time, torch; t = time.perf_counter(); import quantrt.capability as c; c.probe(); "
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    took = float(out.stdout.strip().splitlines()[-1])
    assert took < 1.0, f"import quantrt.capability + probe took {took:.2f} s"


def test_record_and_replay_this_machine(tmp_path: Path) -> None:
    files = record(tmp_path, with_py_cpuinfo=False)
    assert {p.name for p in files} == {
        "cpuinfo.txt",
        "nvml.json",
        "amdsmi.json",
        "torch.json",
        "software.json",
        "environ.json",
        "capabilities.json",
    }
    replayed = probe(load_recording(tmp_path))
    assert replayed.to_json() == json.loads((tmp_path / "capabilities.json").read_text())
    assert replayed.cpu == probe().cpu


def test_record_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: python -m quantrt.capability.record OUTDIR" in capsys.readouterr().err


def test_capability_imports_nothing_else_from_quantrt() -> None:
    for path in sorted(CAPABILITY_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, f"{path.name}:{node.lineno} imports from outside quantrt.capability"
                if node.level == 0 and node.module:
                    assert not node.module.startswith("quantrt"), f"{path.name}:{node.lineno}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("quantrt"), f"{path.name}:{node.lineno}"


def test_public_api() -> None:
    assert sorted(capability.__all__) == [
        "Capabilities",
        "CapabilityError",
        "DeviceCaps",
        "DeviceKind",
        "ProbeSources",
        "kind_of",
        "kinds",
        "load_capabilities",
        "load_preset",
        "preset_names",
        "probe",
        "reset_kinds",
        "reset_probe",
    ]
