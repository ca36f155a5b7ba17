"""Dispatch: candidate order, every rejection kept with its predicate and values, the overrides,
the fallback policy, and the execution re-check under QUANTRT_CAPABILITIES."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from quantrt import reference
from quantrt.capability import load_preset
from quantrt.dispatch import REJECTED, SKIPPED, build, select
from quantrt.env import Overrides
from quantrt.errors import ConfigError, DispatchError
from quantrt.layers import QuantLinear
from quantrt.plans import explain, layer_spec


def ov(**env: str) -> Overrides:
    return Overrides.from_env(env)


def cands(sel) -> dict[str, tuple[str, str, dict]]:
    return {c.name: (c.status, c.verdict.predicate, dict(c.verdict.values)) for c in sel.candidates}


def test_h100_plan_for_w4_picks_the_mma_kernel_and_keeps_rejections() -> None:
    caps = load_preset("h100")
    sel = select(layer_spec("w4a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov())
    assert sel.kernel.name == "cuda.mma_w4a16" and not sel.fallback and sel.label == "native"
    c = cands(sel)
    assert c["cuda.triton_w4a16"][0] == "also supports"
    assert c["cuda.torch_tinygemm"][0] == "also supports"
    assert c["cuda.torch_scaled_mm"] == (REJECTED, "scheme.weight == 'fp8_e4m3'", {"weight": "int"})
    assert c["cuda.torch_int_mm"][0] == REJECTED
    assert c["reference"][0] == "also supports"
    assert [x.name for x in sel.candidates][-1] == "reference"


def test_fp16_activations_reject_tinygemm_with_the_reason() -> None:
    sel = select(
        layer_spec("w4a16-int-g128-asym", 4096, 4096, act_dtype=torch.float16),
        "cuda:0",
        load_preset("h100"),
        ov(QUANTRT_FALLBACK="allow", QUANTRT_DISABLE_KERNELS="cuda.triton_w4a16,cuda.mma_w4a16"),
    )
    assert sel.kernel.name == "reference" and sel.fallback
    assert cands(sel)["cuda.torch_tinygemm"] == (
        REJECTED,
        "activations (bfloat16)",
        {"act_dtype": torch.float16},
    )
    assert "no native kernel yet" in sel.explain()


def test_a100_runs_w8a8_fp8_weight_only_by_arch() -> None:
    """No fp8 matrix units below sm_89: the native fp8 kernels say so, and the checkpoint runs as a
    weight-only substitute, labelled as one."""
    sel = select(
        layer_spec("w8a8-fp8-ch", 4096, 4096), "cuda:0", load_preset("a100"), ov(QUANTRT_FALLBACK="allow")
    )
    assert (sel.kernel.name, sel.label) == ("cuda.mma_fp8", "weight-only substitute")
    assert cands(sel)["cuda.torch_scaled_mm"] == (REJECTED, "sm >= 89 (fp8 tensor cores)", {"sm": 80})
    assert cands(sel)["cuda.triton_fp8"][:2] == (REJECTED, "fp8 matrix units (sm >= 89)")


def test_mi300x_plans_fnuz_fp8_and_the_triton_kernels() -> None:
    caps = load_preset("mi300x")
    assert (
        select(layer_spec("w8a8-fp8-tensor", 4096, 4096), "cuda:0", caps, ov()).kernel.name
        == "rocm.torch_scaled_mm_fnuz"
    )
    sel = select(layer_spec("w4a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov())
    assert sel.kernel.name == "rocm.triton_w4a16" and sel.label == "native"
    names = [c.name for c in sel.candidates]
    assert {"rocm.torch_scaled_mm_fnuz", "rocm.torch_scaled_mm", "rocm.torch_int_mm"} <= set(names)
    assert all(c.verdict.reason for c in sel.candidates)
    assert not [n for n in names if n.startswith(("cuda.", "xpu."))]  # only the device's own vendor
    # 3-bit weights: no kernel anywhere, and every rejection says why
    sel = select(layer_spec("w3a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov(QUANTRT_FALLBACK="allow"))
    assert sel.kernel.name == "reference"
    assert cands(sel)["rocm.triton_w4a16"][:2] == (REJECTED, "4-bit integer weights")


def test_vendor_device_conditions_name_what_is_missing() -> None:
    """A GPU the vendor's Triton backend does not target is refused with its arch named."""
    caps = load_preset("mi300x")
    sel = select(layer_spec("w4a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov())
    rdna = dataclasses.replace(caps.default_device, arch="gfx1100")
    v = sel.kernel.supports(layer_spec("w4a16-int-g128-asym", 4096, 4096), rdna)
    assert not v.ok and "gfx942" in v.predicate and dict(v.values) == {"arch": "gfx1100"}
    pvc = load_preset("pvc")
    sel = select(layer_spec("w8a8-fp8-ch", 4096, 4096), "xpu:0", pvc, ov(QUANTRT_FALLBACK="allow"))
    assert (sel.kernel.name, sel.label) == ("xpu.triton_fp8_w8a16", "weight-only substitute")


def test_spr_amx_plans_cpu_kernels() -> None:
    caps = load_preset("spr-amx")
    assert caps.cpu.has("amx_int8", "amx_bf16")
    # AMX: the native layouts with oneDNN's AMX matmul for large batches; the AVX-512 native kernel
    # and torch's packed ops stay as the next candidates
    sel = select(layer_spec("w4a16-int-g128-sym", 4096, 4096), "cpu", caps, ov())
    assert sel.kernel.name == "cpu.amx_wint" and cands(sel)["cpu.native_wint"][0] != SKIPPED
    assert cands(sel)["cpu.torch_int4pack"][0] != SKIPPED
    sel = select(layer_spec("w8a8-int-ch-sym", 4096, 4096), "cpu", caps, ov())
    assert sel.kernel.name == "cpu.native_w8a8_int8"
    assert "cpu.torch_int_mm" in cands(sel)


def test_backend_override() -> None:
    caps = load_preset("h100")
    sel = select(
        layer_spec("w4a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov(QUANTRT_BACKEND="reference")
    )
    assert sel.kernel.name == "reference" and not sel.fallback
    assert cands(sel)["cuda.torch_tinygemm"][0] == SKIPPED
    with pytest.raises(ConfigError, match=r"QUANTRT_BACKEND='nvidia': no such backend; loaded: .*cuda"):
        select(layer_spec("w4a16-int-g128-asym", 4096, 4096), "cuda:0", caps, ov(QUANTRT_BACKEND="nvidia"))


def test_disable_kernels() -> None:
    caps = load_preset("h100")
    sel = select(
        layer_spec("w4a16-int-g128-asym", 4096, 4096),
        "cuda:0",
        caps,
        ov(
            QUANTRT_DISABLE_KERNELS="cuda.torch_tinygemm,cuda.triton_w4a16,cuda.mma_w4a16",
            QUANTRT_FALLBACK="allow",
        ),
    )
    assert sel.kernel.name == "reference"
    status, predicate, _ = cands(sel)["cuda.torch_tinygemm"]
    assert (status, predicate) == (SKIPPED, "kernel not in QUANTRT_DISABLE_KERNELS")


def test_forced_kernel() -> None:
    caps = load_preset("h100")
    spec = layer_spec("w4a16-int-g128-asym", 4096, 4096)
    sel = select(spec, "cuda:0", caps, ov(QUANTRT_KERNEL="reference"))
    assert sel.forced and sel.kernel.name == "reference"
    sel = select(spec, "cuda:0", caps, ov(QUANTRT_KERNEL="w4a16-int-g128-asym=cuda.torch_tinygemm"))
    assert sel.forced and sel.kernel.name == "cuda.torch_tinygemm"
    with pytest.raises(
        DispatchError,
        match=r"QUANTRT_KERNEL='cuda.torch_scaled_mm' cannot implement "
        r"w4a16-int-g128-asym .* requires scheme.weight == 'fp8_e4m3' "
        r"\(found weight=int\)",
    ):
        select(spec, "cuda:0", caps, ov(QUANTRT_KERNEL="cuda.torch_scaled_mm"))
    with pytest.raises(DispatchError, match=r"no such kernel; kernels for cuda: .*cuda.torch_tinygemm"):
        select(spec, "cuda:0", caps, ov(QUANTRT_KERNEL="cuda.marlin"))
    with pytest.raises(DispatchError, match="runs on cpu, not on cuda:0"):
        select(spec, "cuda:0", caps, ov(QUANTRT_KERNEL="cpu.torch_int4pack"))
    with pytest.raises(ConfigError, match="bad scheme"):
        ov(QUANTRT_KERNEL="w4a16-int-g128=cuda.torch_tinygemm")


def test_fallback_policy(caplog: pytest.LogCaptureFixture) -> None:
    caps = load_preset("h100")
    spec = layer_spec("w4a8-int-g128-sym-afp8", 4096, 1536)
    with pytest.raises(DispatchError, match=r"QUANTRT_FALLBACK=strict: .*runs on the reference kernel"):
        select(spec, "cuda:0", caps, ov(QUANTRT_FALLBACK="strict"))
    with caplog.at_level(logging.WARNING, logger="quantrt.dispatch"):
        select(spec, "cuda:0", caps, ov())
        select(spec, "cuda:0", caps, ov())  # logged once per distinct case, not per call
    warnings = [r for r in caplog.records if "w4a8-int-g128-sym-afp8 K=4096 N=1536" in r.getMessage()]
    assert (
        len(warnings) == 1 and "cuda.torch_tinygemm: requires weight-only scheme" in warnings[0].getMessage()
    )
    with pytest.raises(ConfigError, match="QUANTRT_FALLBACK='loud'"):
        ov(QUANTRT_FALLBACK="loud")


def test_capability_file_and_execution_recheck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caps = load_preset("h100").to_json()
    path = tmp_path / "caps.json"
    path.write_text(json.dumps(caps))
    monkeypatch.setenv("QUANTRT_CAPABILITIES", str(path))
    sel = explain("w8a8-fp8-ch", 4096, 4096)
    assert sel.kernel.name == "cuda.triton_fp8" and sel.device.arch == "sm_90"
    # building for execution checks this machine (no GPU here) and says so
    with pytest.raises(
        DispatchError,
        match=r"this machine has no such device .*QUANTRT_CAPABILITIES=.* "
        r"changes planning only",
    ):
        build(layer_spec("w8a8-fp8-ch", 4096, 4096), "cuda:0")


def test_planned_cpu_kernel_refused_when_this_cpu_cannot_run_it(tmp_path: Path) -> None:
    """A capability file claiming a torch op this build lacks: planning picks the kernel, building refuses."""
    doc = load_preset("zen4").to_json()
    doc["cpu"]["torch_ops"] = sorted(set(doc["cpu"]["torch_ops"]) | {"_weight_int4pack_mm_for_cpu"})
    path = tmp_path / "caps.json"
    path.write_text(json.dumps(doc))
    w = reference.quantize(torch.randn(64, 256) * 0.02, "w4a16-int-g128-asym")
    plan_env = Overrides(capabilities=str(path), disabled=frozenset({"cpu.native_wint", "cpu.avx2_wint"}))
    assert (
        select(layer_spec(w.scheme, 256, 64), "cpu", overrides=plan_env).kernel.name == "cpu.torch_int4pack"
    )
    import quantrt.dispatch as d

    real = d.probe()
    crippled = type(real)(
        cpu=type(real.cpu)(**{**real.cpu.__dict__, "torch_ops": frozenset()}),
        accelerators=real.accelerators,
        libraries=real.libraries,
        torch_version=real.torch_version,
        origin=real.origin,
        notes=real.notes,
    )
    original = d.probe
    d.probe = lambda: crippled  # the real machine, minus the op
    try:
        with pytest.raises(
            DispatchError,
            match=r"cpu.torch_int4pack was planned .* but this machine's cpu .* "
            r"cannot run it: requires torch op _weight_int4pack_mm_for_cpu",
        ):
            QuantLinear.from_canonical(w, act_dtype=torch.float32, overrides=plan_env)
    finally:
        d.probe = original


def test_unknown_preset_and_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"QUANTRT_CAPABILITIES=h300: .*h100"):
        select(
            layer_spec("w4a16-int-g128-asym", 4096, 4096), "cpu", overrides=ov(QUANTRT_CAPABILITIES="h300")
        )
    bad = tmp_path / "bad.json"
    bad.write_text('{"cpu": {"kind": "cpu", "cores": "two"}}')
    with pytest.raises(ConfigError, match=r"bad.json.*cpu.cores: expected int, found str 'two'"):
        select(
            layer_spec("w4a16-int-g128-asym", 4096, 4096), "cpu", overrides=ov(QUANTRT_CAPABILITIES=str(bad))
        )


def test_emulated_and_substitute_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    import quantrt.dispatch as d
    from quantrt.kernels import Kernel, Registry, check
    from quantrt.reference.kernel import ReferenceKernel

    class Emulated(ReferenceKernel):
        name, emulated = "test.emulated", True

        @classmethod
        def can_implement(cls, spec, caps):
            return check((spec.scheme.name == "gguf-q4_k", "gguf-q4_k only", {"scheme": spec.scheme.name}))

    class WeightOnly(ReferenceKernel):
        name = "test.nvfp4_weight_only"

        @classmethod
        def can_implement(cls, spec, caps):
            return check((spec.scheme.family == "nvfp4", "nvfp4 weights", {"family": spec.scheme.family}))

        @classmethod
        def is_substitute(cls, spec):
            return spec.scheme.act is not None

    assert issubclass(Emulated, Kernel)
    reg = Registry()
    reg.set_fallback(ReferenceKernel, "reference")
    reg.register_ordered([Emulated, WeightOnly], device_kind="cpu", backend="test")
    reg.backends.update(reference="quantrt.reference", test="tests")
    monkeypatch.setattr(d, "registry", lambda: reg)
    caps = load_preset("zen4")
    sel = select(layer_spec("gguf-q4_k", 4096, 4096), "cpu", caps, ov(QUANTRT_FALLBACK="allow"))
    assert (sel.kernel, sel.label, sel.fallback) == (Emulated, "emulated", True)
    with pytest.raises(DispatchError, match=r"runs on emulated kernel test.emulated: no native kernel here"):
        select(layer_spec("gguf-q4_k", 4096, 2048), "cpu", caps, ov(QUANTRT_FALLBACK="strict"))
    sel = select(layer_spec("w4a4-nvfp4", 4096, 4096), "cpu", caps, ov())
    assert (sel.kernel, sel.label, sel.fallback) == (WeightOnly, "weight-only substitute", False)
    assert "test.nvfp4_weight_only (weight-only substitute)" in sel.explain()
    assert select(layer_spec("w4a16-nvfp4", 4096, 4096), "cpu", caps, ov()).label == "native"
