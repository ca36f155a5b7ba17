"""What an install must hold, whether editable or regular: every package, the package data,
the entry points of the in-tree backends, and a working command."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys

PACKAGES = [
    "quantrt",
    "quantrt.cli",
    "quantrt.reference",
    "quantrt.checkpoint",
    "quantrt.formats",
    "quantrt.capability",
    "quantrt.backends",
    "quantrt.backends.triton",
    "quantrt.backends.cuda",
    "quantrt.backends.rocm",
    "quantrt.backends.cpu",
    "quantrt.backends.xpu",
]


def test_every_package_imports() -> None:
    for name in PACKAGES:
        assert importlib.import_module(name).__file__
    from quantrt.checkpoint import open_checkpoint

    assert callable(open_checkpoint)


def test_entry_points_register_the_in_tree_backends() -> None:
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="quantrt.backends")}
    assert {"cuda", "rocm", "cpu", "xpu"} <= set(eps)
    from quantrt.kernels import registry

    reg = registry()
    assert not reg.load_errors, reg.load_errors
    assert {"cpu.torch_int4pack", "cuda.torch_tinygemm", "rocm.torch_scaled_mm_fnuz", "reference"} <= set(
        reg.names()
    )


def test_package_data_is_installed() -> None:
    from quantrt.capability import load_preset, preset_names

    assert set(preset_names()) >= {
        "h100",
        "h200",
        "b200",
        "a100",
        "l40s",
        "mi300x",
        "mi355x",
        "spr-amx",
        "zen4",
        "pvc",
        "arc",
    }
    assert load_preset("h200").default_device.arch == "sm_90"


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quantrt", "explain", "--scheme", "w8a8-fp8-ch", "--as", "h200", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    assert json.loads(out.stdout)["kernel"] == "cuda.triton_fp8"
