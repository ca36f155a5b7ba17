"""A package outside quantrt's tree adds a device kind and its kernels with no in-tree edit.

``tests/plugins/acme`` is installed with pip into a temporary folder and used from fresh
processes: the probe finds its device, capability files round-trip it, dispatch and
``quantrt explain`` walk its kernel list, a ``QuantLinear`` placed on ``acme:0`` runs its kernel
and matches the reference, and the conformance kit passes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "plugins" / "acme"

SCRIPT = r"""
import json, sys, torch, quantrt
from quantrt import reference
from quantrt.capability import kinds, load_capabilities, probe
from quantrt.dispatch import select
from quantrt.plans import layer_spec

caps = probe()
acme = [d for d in caps.accelerators if d.kind == "acme"]
path = sys.argv[1]
open(path, "w").write(json.dumps(caps.to_json()))
again = load_capabilities(path).device("acme:0")
w = reference.quantize(torch.randn(100, 192) * 0.05, "w8a16-int-ch-sym")
layer = quantrt.QuantLinear.from_canonical(w, act_dtype=torch.float32, device="acme:0")
x = torch.randn(5, 192)
ref = reference.linear(x, w)
rows = [layer(x[:1]), layer(x)]
other = select(layer_spec("w4a16-int-g128-asym", 4096, 4096), "acme:0")
print(json.dumps({
    "kinds": sorted(kinds()),
    "devices": [d.torch_device for d in acme],
    "device_name": acme[0].name if acme else None,
    "round_trip": [again.kind, again.name],
    "kernel": layer.kernel_name,
    "strategies": [layer._state.strategy(1).name, layer._state.strategy(5).name],
    "err_m1": float((rows[0] - ref[:1]).abs().max()),
    "err": float((rows[1] - ref).abs().max() / ref.abs().max()),
    "other": [other.kernel.name, other.fallback, {c.name: c.status for c in other.candidates}],
    "cpu": select(layer_spec("w8a16-int-ch-sym", 4096, 4096), "cpu").kernel.name,
}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("acme-site")
    build = tmp_path_factory.mktemp("acme-src")
    shutil.copytree(
        PACKAGE, build / "acme"
    )  # pip's in-tree build would leave build/ and *.egg-info in tests/
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--target", str(target), str(build / "acme")],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return target


def _env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTRT_")}
    return {**env, "PYTHONPATH": str(site)}


def test_device_kind_plugs_in(site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "caps.json")],
        capture_output=True,
        text=True,
        env=_env(site),
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert "acme" in doc["kinds"] and {"cpu", "cuda", "rocm", "xpu"} <= set(doc["kinds"])
    assert doc["devices"] == ["cpu"] and doc["device_name"] == "Acme NPU (host emulation)"
    assert doc["round_trip"] == ["acme", "Acme NPU (host emulation)"]
    assert doc["kernel"] == "acme.w8a16"
    assert doc["strategies"] == ["gemv (int8 codes, fp32)", "dequantize + matmul"]
    assert doc["err_m1"] < 1e-4 and doc["err"] < 1e-5
    # a scheme the acme list cannot run falls back to the reference, with acme's reason on record
    kernel, fallback, statuses = doc["other"]
    assert (kernel, fallback) == ("reference", True)
    assert statuses == {"acme.w8a16": "rejected", "reference": "chosen"}
    # the CPU keeps its own list: acme's kernels are registered for acme devices only
    assert doc["cpu"] != "acme.w8a16"


def test_explain_shows_the_acme_list(site: Path, tmp_path: Path) -> None:
    def explain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "quantrt", "explain", *args],
            capture_output=True,
            text=True,
            env=_env(site),
            cwd=tmp_path,
            timeout=300,
        )

    plan = json.loads(explain("--scheme", "w8a16-int-ch-sym", "--device", "acme:0", "--json").stdout)
    assert plan["kernel"] == "acme.w8a16" and plan["order"] == ["acme", "reference"]
    text = explain("--scheme", "w4a16-int-g128-asym", "--device", "acme:0").stdout
    assert "x acme.w8a16" in text and "requires symmetric int8 weights" in text
    order = json.loads(explain("--order", "--json").stdout)["order"]
    assert [r["kernel"] for r in order["acme"]] == ["acme.w8a16", "reference"]
