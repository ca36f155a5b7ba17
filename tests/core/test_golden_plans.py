"""Golden plans: the kernel every catalog scheme gets on every preset (or "no native kernel yet").

The files are reviewed expectations, not outputs accepted blindly: a kernel's new
``supports`` rule or priority shows up here as a diff to read (``python ci/golden_plans.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrt.capability import load_preset, preset_names
from quantrt.plans import NO_NATIVE, plan_catalog
from quantrt.schemes import catalog

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plans"


def test_every_preset_has_a_golden_plan() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(preset_names())


@pytest.mark.parametrize("preset", preset_names())
def test_golden_plan(preset: str) -> None:
    golden = json.loads((GOLDEN / f"{preset}.json").read_text())
    assert set(golden["plans"]) == {s.name for s in catalog()}, "every catalog scheme has an entry"
    caps = load_preset(preset)
    now = plan_catalog(caps, caps.default_device.torch_device)
    diff = {s: (golden["plans"][s], k) for s, k in now.items() if golden["plans"][s] != k}
    assert not diff, f"{preset}: scheme: (golden, now) = {diff}"


def test_golden_facts_that_must_hold() -> None:
    """A few plans stated independently of the files: hardware facts, not recorded outputs."""
    plans = {p: json.loads((GOLDEN / f"{p}.json").read_text())["plans"] for p in preset_names()}
    # sm_80 has no fp8 tensor cores: fp8 checkpoints run weight-only there, and say so
    assert plans["a100"]["w8a8-fp8-ch"] == "cuda.mma_fp8 (weight-only substitute)"
    assert plans["a100"]["w8a16-fp8-ch"] == "cuda.mma_fp8"
    assert plans["h100"]["w8a16-fp8e5m2-block128"] == "cuda.mma_fp8"
    assert plans["l40s"]["w8a8-fp8-ch"] == "cuda.triton_fp8"  # sm_89 does
    assert plans["h100"]["w8a8-fp8-block128"] == "cuda.triton_block_fp8"  # _scaled_mm takes no blocks
    assert plans["mi300x"]["w8a8-fp8-tensor"] == "rocm.torch_scaled_mm_fnuz"  # gfx942: e4m3fnuz
    assert plans["mi355x"]["w8a8-fp8-tensor"] == "rocm.torch_scaled_mm"  # gfx950: OCP e4m3
    assert plans["h100"]["w4a16-int-g128-asym"] == "cuda.mma_w4a16"  # mma.sync from sm_80
    assert plans["a100"]["w8a16-int-ch-sym"] == "cuda.mma_w8a16"
    assert plans["h100"]["w3a16-int-g128-asym"] == "cuda.mma_w2w3"  # widened to int4's nibbles
    assert plans["h100"]["w4a16-int-g128-asym-actorder"] == "cuda.mma_w4a16"
    assert plans["zen4"]["w4a16-int-g128-asym"] == "cpu.native_wint"  # AVX-512 BF16: the native kernels
    assert plans["zen4"]["w8a8-int-ch-sym"] == "cpu.native_w8a8_int8"  # VNNI
    assert plans["zen3"]["w4a16-int-g128-asym"] == "cpu.avx2_wint"  # AVX2 only: the x86-64-v3 builds
    assert plans["zen3"]["w4a16-nvfp4"] == "cpu.avx2_lut"
    assert plans["zen3"]["gguf-q4_k"] == "cpu.native_gguf"
    assert plans["graviton3"]["gguf-q4_k"] == "cpu.native_gguf"  # the NEON builds
    assert plans["graviton3"]["w4a16-int-g128-asym"] == "cpu.neon_wint"
    assert plans["graviton3"]["w4a16-nvfp4"] == "cpu.neon_lut"
    assert plans["mi300x"]["w4a16-int-g128-asym"] == "rocm.triton_w4a16"  # the portable Triton kernels
    assert plans["mi300x"]["w8a8-fp8-block128"] == "rocm.triton_block_fp8"
    assert plans["pvc"]["w4a16-nvfp4"] == "xpu.triton_fp4"
    assert plans["pvc"]["w8a8-fp8-ch"] == "xpu.triton_fp8_w8a16 (weight-only substitute)"  # no fp8 units
    for preset, least in (("mi300x", 40), ("mi355x", 40), ("pvc", 30)):  # issue 24's floor
        assert sum(k != NO_NATIVE for k in plans[preset].values()) >= least, preset
