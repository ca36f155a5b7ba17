"""An out-of-tree backend installed with pip plugs in through the ``quantrt.backends`` entry
points, exactly like the in-tree vendor folders, and dispatch picks its kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from quantrt.capability import probe

PLUGIN = '''
"""A tiny out-of-tree backend: dequantize once at load, then a dense matmul."""
import torch

from quantrt.kernels import Kernel, check
from quantrt.prepared import ALL_M, Strategy


def dense(w, x, bias, out, ws):
    y = torch.nn.functional.linear(x, w, bias)
    return out.copy_(y) if out is not None else y


class DenseAfterLoad(Kernel):
    name = "oot.dense_after_load"
    act_dtypes = (torch.float32, torch.bfloat16)

    @classmethod
    def can_implement(cls, spec, caps):
        return check((spec.scheme.name == "w4a16-int-g128-asym", "scheme is w4a16-int-g128-asym",
                      {"scheme": spec.scheme.name}))

    def prepare(self, weight, spec):
        from quantrt.reference import dequantize

        w = dequantize(weight).to(spec.act_dtype)
        return self.prepared(w, [Strategy(ALL_M, "F.linear", dense)], spec)


def register(registry):
    registry.register_ordered([DenseAfterLoad], device_kind="cpu", ahead=True)  # ahead of the in-tree CPU list
'''

SCRIPT = """
import json, torch, quantrt
from quantrt import reference
w = reference.quantize(torch.randn(64, 256) * 0.05, "w4a16-int-g128-asym")
layer = quantrt.QuantLinear.from_canonical(w, act_dtype=torch.float32)
x = torch.randn(3, 256)
ref = reference.linear(x, w)
other = quantrt.QuantLinear.from_canonical(reference.quantize(torch.randn(64, 256), "w8a16-int-ch-sym"),
                                           act_dtype=torch.float32)
print(json.dumps({"kernel": layer.kernel_name, "err": float((layer(x) - ref).norm() / ref.norm()),
                  "other": other.kernel_name, "backends": sorted(quantrt.registry().backends)}))
"""


def test_out_of_tree_backend_is_picked(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "quantrt_oot_example.py").write_text(PLUGIN)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "quantrt-oot-example"
        version = "0.0.1"

        [project.entry-points."quantrt.backends"]
        oot = "quantrt_oot_example:register"

        [tool.setuptools]
        py-modules = ["quantrt_oot_example"]
    """)
    )
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(pkg)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    env = {k: v for k, v in env.items() if not k.startswith("QUANTRT_")}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kernel"] == "oot.dense_after_load" and doc["err"] < 1e-5
    # schemes it does not support stay with the in-tree kernels (their AMX subclass where the CPU has AMX)
    amx = {"amx_bf16", "amx_tile"} <= set(probe().cpu.features)
    assert doc["other"] == ("cpu.amx_wint" if amx else "cpu.native_wint")
    assert "oot" in doc["backends"]
    ex = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantrt",
            "explain",
            "--scheme",
            "w4a16-int-g128-asym",
            "--device",
            "cpu",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**env, "QUANTRT_BACKEND": "oot"},
        cwd=tmp_path,
        timeout=300,
    )
    plan = json.loads(ex.stdout)
    assert plan["kernel"] == "oot.dense_after_load"
    assert {c["kernel"]: c["status"] for c in plan["candidates"]}["cpu.torch_int4pack"] == "skipped"
