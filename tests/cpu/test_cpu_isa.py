"""QUANTRT_CPU_ISA: holding the probed CPU to a lower ISA level picks the kernels built for that level
(the AVX2 builds on this AVX-512 machine), says so in explain, and refuses what it cannot mean."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu import gguf_native
from quantrt.capability import load_preset, probe
from quantrt.capability.cpu import ISA_LEVELS, isa_limit, limit_isa
from quantrt.dispatch import machine_capabilities, select
from quantrt.env import Overrides
from quantrt.errors import ConfigError
from quantrt.layers import QuantLinear
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

CPU = probe().cpu
X86_AVX2 = CPU.arch.startswith("x86") and {"avx2", "fma", "f16c"} <= CPU.features
needs_avx2 = pytest.mark.skipif(not X86_AVX2, reason="needs an x86 CPU with AVX2, FMA and F16C")


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


@needs_avx2
def test_the_level_only_removes_features() -> None:
    held = limit_isa(CPU, "avx2")
    assert held.features <= CPU.features and held.features <= ISA_LEVELS["avx2"]
    assert {"avx2", "fma", "f16c"} <= held.features
    assert not any(f.startswith(("avx512", "amx")) for f in held.features)
    assert "bf16" not in held.matrix_types
    assert isa_limit(held) == "avx2" and isa_limit(CPU) is None
    assert limit_isa(CPU, "native") is CPU
    with pytest.raises(ValueError, match="unknown ISA level 'sse2'"):
        limit_isa(CPU, "sse2")
    arm = dataclasses.replace(CPU, arch="aarch64", features=frozenset({"neon", "dotprod"}))
    with pytest.raises(ValueError, match="x86 level"):
        limit_isa(arm, "avx2")


def test_the_variable_is_parsed_and_checked() -> None:
    assert Overrides.from_env({}).cpu_isa == "native"
    assert Overrides.from_env({"QUANTRT_CPU_ISA": " AVX2 "}).cpu_isa == "avx2"
    assert Overrides.from_env({"QUANTRT_CPU_ISA": "avx2"}).describe()["QUANTRT_CPU_ISA"] == "avx2"
    with pytest.raises(ConfigError, match="QUANTRT_CPU_ISA='avx9': expected one of native, avx2"):
        Overrides.from_env({"QUANTRT_CPU_ISA": "avx9"})


@needs_avx2
@pytest.mark.parametrize(
    "scheme,native,held",
    [
        ("w4a16-int-g128-sym", "native_wint", "cpu.avx2_wint"),
        ("w2a16-int-g64-asym", "native_wint", "cpu.avx2_wint"),
        ("gguf-q4_k", "native_gguf", "cpu.native_gguf"),
        ("w4a16-nvfp4", "native_lut", "cpu.avx2_lut"),
        ("w8a16-fp8-ch", "native_lut", "cpu.avx2_lut"),
    ],
)
def test_held_to_avx2_the_avx2_builds_run(
    monkeypatch: pytest.MonkeyPatch, scheme: str, native: str, held: str
):
    """Planned and built under the variable: the AVX2 kernel, its verdict naming the build, and the
    layer's output against the fp32 reference (the GGUF kernel quantizes its activations: 1e-2)."""
    gen = torch.Generator().manual_seed(3)
    w = reference.quantize(torch.randn(48, 512, generator=gen) * 0.02, scheme)
    monkeypatch.setenv("QUANTRT_CPU_ISA", "avx2")
    ov = Overrides.from_env()
    cpu = machine_capabilities(ov).cpu
    assert isa_limit(cpu) == "avx2"
    sel = select(LayerSpec(parse_scheme(scheme), 512, 48), "cpu", overrides=ov)
    assert sel.kernel.name == held and "held to avx2 by QUANTRT_CPU_ISA" in sel.explain()
    if held == "cpu.native_gguf":
        assert "AVX2 build" in next(c.verdict.note for c in sel.candidates if c.name == held)
    else:  # the AVX-512 build is refused for the features the level removed
        no = next(c for c in sel.candidates if c.name == f"cpu.{native}")
        assert "avx512" in no.verdict.reason
    layer = QuantLinear.from_canonical(w, device="cpu", act_dtype=torch.bfloat16)
    assert layer.kernel_name == held
    x = torch.randn(3, 512, generator=gen).bfloat16()
    assert rel(layer(x), reference.linear(x, w, out_dtype=torch.float32)) < 1e-2


@needs_avx2
def test_explain_json_names_the_level() -> None:
    cmd = [
        sys.executable,
        "-m",
        "quantrt",
        "explain",
        "--scheme",
        "w4a16-int-g128-sym",
        "--device",
        "cpu",
        "--json",
    ]
    env = {**os.environ, "QUANTRT_CPU_ISA": "avx2"}
    out = json.loads(
        subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=120).stdout
    )
    assert out["cpu_isa"] == "avx2" and out["kernel"] == "cpu.avx2_wint"
    env["QUANTRT_CPU_ISA"] = "native"
    out = json.loads(
        subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=120).stdout
    )
    assert out["cpu_isa"] == "native" and out["kernel"] != "cpu.avx2_wint"


def test_gguf_picks_the_avx_vnni_build() -> None:
    """AVX-VNNI without AVX-512 (an Alder Lake-like CPU made from the Sapphire Rapids preset) runs the
    gguf library's avx2_vnni build; without AVX-VNNI the avx2 one; with AVX-512 VNNI the host's; and
    QUANTRT_CPU_ISA=avx2 keeps avx_vnni, so such a CPU held to AVX2 runs avx2_vnni too."""
    spr = load_preset("spr-amx").cpu
    assert "avx_vnni" in spr.features and gguf_native.library_isa(spr) == "native"
    client = dataclasses.replace(
        spr, features=frozenset(f for f in spr.features if not f.startswith(("avx512", "amx")))
    )
    assert gguf_native.library_isa(client) == "avx2_vnni"
    assert gguf_native.library_isa(limit_isa(spr, "avx2")) == "avx2_vnni"
    no_vnni = dataclasses.replace(client, features=client.features - {"avx_vnni"})
    assert gguf_native.library_isa(no_vnni) == "avx2"
    assert gguf_native.library_isa(load_preset("zen3").cpu) == "avx2"
    spec = LayerSpec(parse_scheme("gguf-q4_k"), 512, 48)
    verdict = gguf_native.can_run(spec, client)
    if verdict:  # a toolchain is present: the note names the build
        assert "AVX2 build (x86-64-v3 with AVX-VNNI)" in verdict.note
