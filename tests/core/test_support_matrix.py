"""The support matrix: the README's table is what ``ci/support_matrix.py`` generates from the kernel
registry now (a registry change without regenerating it fails here), and ``quantrt matrix`` agrees
with ``plan_catalog`` and refuses bad input with exit code 1, not a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from quantrt.capability import load_preset
from quantrt.cli import main
from quantrt.plans import NO_NATIVE, plan_catalog

ROOT = Path(__file__).resolve().parents[2]


def _support_matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("support_matrix", ROOT / "ci" / "support_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_matrix_is_generated_from_the_registry() -> None:
    sm = _support_matrix()
    table, load_errors = sm.generate()
    assert not load_errors, f"backends failed to load, the matrix would miss their kernels: {load_errors}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert sm.splice(readme, table) == readme, (
        "README.md's support matrix is stale: run python ci/support_matrix.py"
    )


def test_check_flags_a_stale_readme_and_refuses_missing_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sm = _support_matrix()
    stale = tmp_path / "README.md"
    stale.write_text(f"# x\n\n{sm.BEGIN}\n| old | table |\n{sm.END}\n\nafter\n", encoding="utf-8")
    assert sm.main(["--check", "--readme", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert sm.main(["--readme", str(stale)]) == 0  # rewritten in place, the text around it kept
    text = stale.read_text(encoding="utf-8")
    assert text.startswith("# x\n") and text.endswith("\nafter\n") and "| old |" not in text
    assert sm.main(["--check", "--readme", str(stale)]) == 0
    with pytest.raises(ValueError, match="support-matrix:begin"):
        sm.splice(f"{sm.END}\n{sm.BEGIN}\n", "table")


def test_matrix_json_agrees_with_plan_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--presets", "mi300x,zen4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["presets"]) == ["mi300x", "zen4"]
    caps = load_preset("mi300x")
    plans = plan_catalog(caps, caps.default_device.torch_device)
    assert doc["presets"]["mi300x"] == plans
    counts = doc["counts"]["mi300x"]
    assert counts["native"] == sum(k != NO_NATIVE for k in plans.values())
    assert counts["native"] + counts["reference"] == counts["total"] == len(plans)
    assert counts["substitute"] == sum(k.endswith("(weight-only substitute)") for k in plans.values())
    reasons = doc["reference_reasons"]["mi300x"]
    assert set(reasons) == {s for s, k in plans.items() if k == NO_NATIVE}
    assert all(r["reason"].startswith("requires ") for r in reasons.values())


def test_unknown_preset_is_a_clear_refusal() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTRT_")}
    r = subprocess.run(
        [sys.executable, "-m", "quantrt", "matrix", "--presets", "h100,h300"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert "quantrt matrix: error: 'h300' is neither a capability preset" in r.stderr
    assert "h100" in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
