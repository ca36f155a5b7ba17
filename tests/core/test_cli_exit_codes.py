"""The quantrt command's exit codes and error paths, run as a script runs it (a subprocess): a
refusal (1), a usage error (2) and a bug (3) must differ, and no path may print a traceback
unless asked (-vv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantrt.capability import Capabilities, CapabilityError, load_capabilities, load_preset, probe
from quantrt.cli import main
from quantrt.dispatch import select
from quantrt.env import Overrides
from quantrt.errors import ConfigError
from quantrt.plans import layer_spec

REPO = Path(__file__).resolve().parents[2]
H200_EXAMPLE = REPO / "docs" / "examples" / "h200-probe.json"
SCHEME = ("--scheme", "w4a16-int-g128-asym", "--shape", "64x64", "--device", "cpu")

#: calls the CLI's main() with one command's handler replaced by one that raises, as a bug would
RAISING = """
import sys
from quantrt import cli
from quantrt.cli import probe
def handle(args):
    raise {exc}
probe.handle = handle
sys.exit(cli.main(sys.argv[1:]))
"""


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTRT_")}
    env.update(extra or {})
    return env


def quantrt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quantrt", *args],
        capture_output=True,
        text=True,
        env=_env(env),
        cwd="/",
        timeout=300,
    )


def raising(exc: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RAISING.format(exc=exc), *args],
        capture_output=True,
        text=True,
        env=_env(None),
        cwd="/",
        timeout=300,
    )


def test_internal_error_is_exit_3_with_one_line_and_traceback_only_under_vv() -> None:
    r = raising('ZeroDivisionError("went\\nwrong")', "probe")
    assert r.returncode == 3, r.stderr
    assert r.stderr == "quantrt probe: internal error (ZeroDivisionError: went wrong), please report it\n"
    # --json: the error object on stdout too; -v before and after the command add up to -vv
    r = raising('KeyError("x")', "-v", "probe", "--json", "-v")
    assert r.returncode == 3
    assert json.loads(r.stdout) == {"error": "KeyError", "kind": "internal", "message": "'x'"}
    assert r.stderr.startswith("quantrt probe: internal error (KeyError: 'x'), please report it\n")
    assert "Traceback (most recent call last)" in r.stderr and ", in handle\n" in r.stderr
    r = raising("KeyboardInterrupt()", "probe")
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "")


def test_refusals_are_exit_1_and_unknown_preset_is_refused_by_probe_too() -> None:
    r = quantrt("probe", "--json", env={"QUANTRT_CAPABILITIES": "h300"})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"] == "ConfigError" and doc["kind"] == "refused"
    assert "QUANTRT_CAPABILITIES=h300: 'h300' is neither a capability preset" in doc["message"]
    e = quantrt("explain", *SCHEME, env={"QUANTRT_CAPABILITIES": "h300"})
    assert e.returncode == 1
    # the same one-line message in both commands
    assert r.stderr.replace("quantrt probe:", "") == e.stderr.replace("quantrt explain:", "")
    assert r.stderr.count("\n") == 1 and doc["message"] in r.stderr


def test_verbose_after_the_command() -> None:
    r = quantrt("explain", *SCHEME, "-v")
    assert r.returncode == 0, r.stderr
    assert "quantrt: w4a16-int-g128-asym K=64 N=64" in r.stderr and " on cpu -> " in r.stderr


def test_closed_stdout_is_quiet() -> None:
    """``| true`` closes the pipe before quantrt writes (deterministic EPIPE); ``| head -c 1``
    closes it after the first bytes. Unbuffered stdout makes each print its own write."""
    py = sys.executable
    script = (
        f"{py} -m quantrt probe | true; echo rc=${{PIPESTATUS[0]}} >&2; "
        f"{py} -m quantrt explain --scheme all --as h100 --json | head -c 1; echo rc=${{PIPESTATUS[0]}} >&2"
    )
    r = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=_env({"PYTHONUNBUFFERED": "1"}),
        cwd="/",
        timeout=300,
    )
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    codes = [line for line in r.stderr.splitlines() if line.startswith("rc=")]
    assert codes[0] == "rc=141" and codes[1] in ("rc=0", "rc=141"), r.stderr
    assert r.stdout == "{"


def test_probe_json_loads_back(tmp_path: Path) -> None:
    out = quantrt("probe", "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)
    assert "probe_seconds" in first
    path = tmp_path / "caps.json"
    path.write_text(out.stdout)
    back = quantrt("probe", "--as", str(path), "--json")
    assert back.returncode == 0, back.stderr
    again = json.loads(back.stdout)
    assert again["origin"] == f"file:{path}"
    fields = ("cpu", "accelerators", "libraries", "torch_version", "notes")
    assert {k: again[k] for k in fields} == {k: first[k] for k in fields}
    plan = quantrt("explain", "--scheme", "all", "--json", env={"QUANTRT_CAPABILITIES": str(path)})
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["capabilities"] == f"file:{path}"


def test_capability_files_keep_refusing_unknown_keys(tmp_path: Path) -> None:
    caps = load_capabilities(str(H200_EXAMPLE))
    assert caps.accelerators[0].name == "NVIDIA H200" and caps.accelerators[0].arch == "sm_90"
    assert "probe_seconds" in json.loads(H200_EXAMPLE.read_text())
    doc = {**load_preset("zen4").to_json(), "probe_second": 0.1}
    with pytest.raises(CapabilityError, match=r"unknown field\(s\) \['probe_second'\]; known: \["):
        Capabilities.from_json(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cpu": {"kind": "cpu", "speed": 3}}))
    with pytest.raises(CapabilityError, match=r"bad.json: capabilities.cpu: unknown field\(s\) \['speed'\]"):
        load_capabilities(str(bad))


@pytest.mark.skipif(
    any(d.kind == "cuda" for d in probe().accelerators), reason="this machine has a CUDA device"
)
def test_backend_forced_without_its_device() -> None:
    r = quantrt("explain", *SCHEME, env={"QUANTRT_BACKEND": "cuda"})
    assert r.returncode == 1 and "no native kernel yet" not in r.stdout + r.stderr
    assert "quantrt explain: error: QUANTRT_BACKEND=cuda: this machine has no CUDA device" in r.stderr
    assert f"(the probe found: cpu {probe().cpu.name} (" in r.stderr


def test_backend_forced_without_its_device_in_presets() -> None:
    spec = layer_spec("w4a16-int-g128-asym", 4096, 4096)
    with pytest.raises(
        ConfigError,
        match=r"QUANTRT_BACKEND=cuda: capabilities preset:mi300x have no CUDA device "
        r"\(found: cpu .*, cuda:0 AMD Instinct MI300X \(rocm, gfx942\)\)",
    ):
        select(spec, "cuda:0", load_preset("mi300x"), Overrides(backend="cuda"))
    with pytest.raises(ConfigError, match=r"QUANTRT_BACKEND=rocm: capabilities preset:zen4 have no ROCm"):
        select(spec, "cpu", load_preset("zen4"), Overrides(backend="rocm"))
    # a backend whose device is there, and the reference (every device), plan as before
    assert select(spec, "cuda:0", load_preset("h100"), Overrides(backend="cuda")).kernel.backend == "cuda"
    assert select(spec, "cpu", load_preset("zen4"), Overrides(backend="reference")).kernel.name == "reference"


def test_sizes_and_counts_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    r = quantrt("run", "--m", "0", "--json")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert "argument --m: '0': expected positive integers, found 0" in r.stderr
    for argv in (
        ["run", "--m", "1,-4"],
        ["run", "--m", "-1"],
        ["run", "--m", "1,x"],
        ["run", "--repeat", "0"],
        ["explain", "--scheme", "w4a16-int-g128-asym", "--tp", "0", "--parallel", "column"],
        ["bench", "--device", "cpu", "--ms", "0"],
        ["bench", "--device", "cpu", "--ms", "8,-1"],
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        assert "error: argument --" in capsys.readouterr().err
