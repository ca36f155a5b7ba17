"""The portable Triton kernels under AMD's and Intel's policies, through the interpreter on the CPU
(no AMD or Intel GPU here): each vendor's classes pinned to one target receive that vendor's tile
tables (backends/rocm/tunings, backends/xpu/tunings) and fp8 flavour, and still match the fp32
reference. MI300 (gfx942) multiplies e4m3fnuz: the weight codes are re-read as fnuz with doubled
scales and the activations quantized to fnuz, so its products equal the OCP reference's."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.rocm.policy import RocmPolicy, arch_target
from quantrt.backends.triton import tile_table
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.lut4_kernel import TritonFp4
from quantrt.backends.triton.vendor import Target, specialise
from quantrt.backends.triton.w8a8_kernel import TritonBlockFp8, TritonFp8, TritonInt8
from quantrt.backends.triton.wna16_kernel import TritonW4A16
from quantrt.backends.xpu.policy import XpuPolicy
from quantrt.plans import layer_spec

DEV = "cpu"  # the interpreter: the pinned target stands in for the GPU


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def _run(kernel: type, scheme: str, K: int, N: int, ms: tuple[int, ...], act: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    calib = torch.randn(32, K, generator=g) * 2
    canon = reference.quantize(w, scheme, calib=calib if "static" in scheme else None)
    bias = torch.randn(N, generator=g)
    spec = layer_spec(scheme, K, N, act_dtype=act, bias=True)
    k = kernel()
    state = k.prepare(canon, spec)
    worst = 0.0
    for m in ms:
        x = torch.randn(m, K, generator=g).to(act)
        y = k.apply(state, x, bias.to(act))
        assert y.shape == (m, N) and y.dtype == spec.output_dtype
        if m:
            ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
            worst = max(worst, rel(y, ref))
    return state, worst


def _table_configs(package: str, name: str, arch: str, section: str | None, K: int, N: int) -> tuple:
    doc = tile_table.load(package, name, arch)
    return tile_table.tile_configs(doc[section] if section else doc, N, K, TileConfig)


@pytest.mark.parametrize("scheme", ["w8a8-fp8-ch", "w8a8-fp8-tensor", "w8a8-fp8-tensor-static"])
def test_gfx942_quantizes_fp8_in_fnuz(scheme: str) -> None:
    """MI300's products: the interpreter cannot hold fp8e4b8 in a dot (tests/triton/test_amd_compiles.py
    compiles that GEMM for gfx942), so the fnuz operands the GEMM receives (weights prepared, activations
    quantized by the Triton pass under the interpreter) are multiplied here in fp32: the reference's
    result, and codes equal to torch's conversion of half the OCP codes."""
    from quantrt.backends.triton import act_quant, w8a8_ops

    (kernel,) = specialise(RocmPolicy(arch_target("gfx942")), TritonFp8)
    assert kernel.name == "rocm.triton_fp8"
    g = torch.Generator().manual_seed(11)
    K, N = 200, 48
    canon = reference.quantize(
        torch.randn(N, K, generator=g) * 0.05, scheme, calib=torch.randn(32, K, generator=g)
    )
    bias = torch.randn(N, generator=g)
    state = kernel().prepare(canon, layer_spec(scheme, K, N, act_dtype=torch.float16, bias=True))
    lay = state.layout
    assert lay.w.dtype == torch.float8_e4m3fnuz and lay.fp8 == torch.float8_e4m3fnuz and lay.mult == 2.0
    assert not [s for s in state.strategies if "_scaled_mm" in s.name]  # hipBLASLt is its own kernel
    for m in (1, 5, 70):
        x = torch.randn(m, K, generator=g).half()
        x[0, 3] = 40.0
        xq, a_scale = w8a8_ops.quantize(x, "fp8", lay.act, lay.in_scale, lay.fp8, lay.mult)
        assert xq.dtype == torch.float8_e4m3fnuz
        if lay.act == "token":  # the OCP codes of the same pass, halved into fnuz by torch
            ocp, ocp_scale = act_quant.quantize_per_token(x, "fp8")
            want = (ocp.float() / 2).to(torch.float8_e4m3fnuz)
            assert torch.equal(xq.view(torch.uint8), want.view(torch.uint8))
            assert torch.equal(a_scale, ocp_scale * 2)
        y = (xq.float() * a_scale.float().reshape(-1, 1)) @ (
            lay.w.float() * lay.w_scale.reshape(-1, 1)
        ).T + bias
        ref = reference.linear(x, canon, bias.half(), out_dtype=torch.float32)
        assert rel(y, ref) < 3e-3, (m, rel(y, ref))


def test_gfx942_fnuz_codes_equal_torch_conversion() -> None:
    """The prepared weight: every code torch's own float8_e4m3fnuz conversion of half the OCP value
    gives, the scales doubled."""
    (kernel,) = specialise(RocmPolicy(arch_target("gfx942")), TritonFp8)
    g = torch.Generator().manual_seed(5)
    canon = reference.quantize(torch.randn(64, 96, generator=g), "w8a8-fp8-ch")
    state = kernel().prepare(canon, layer_spec("w8a8-fp8-ch", 96, 64, act_dtype=torch.bfloat16))
    want = (canon["qweight"].float() / 2).to(torch.float8_e4m3fnuz)
    assert torch.equal(state.layout.w.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(state.layout.w_scale, canon["scales"].float().reshape(-1) * 2)


def test_gfx942_block_fp8_groups_in_fnuz() -> None:
    """Block fp8 on MI300: activation groups quantized to fnuz against 224 (doubled scales), block
    scales doubled; the fp32 product of those operands is the reference's."""
    from quantrt.backends.triton import act_quant

    (kernel,) = specialise(RocmPolicy(arch_target("gfx942")), TritonBlockFp8)
    g = torch.Generator().manual_seed(3)
    K, N = 384, 160
    canon = reference.quantize(torch.randn(N, K, generator=g) * 0.05, "w8a8-fp8-block128")
    state = kernel().prepare(canon, layer_spec("w8a8-fp8-block128", K, N, act_dtype=torch.float16))
    lay = state.layout
    assert lay.w.dtype == torch.float8_e4m3fnuz and lay.qmax == 224.0
    x = torch.randn(17, K, generator=g).half()
    xq, xs = act_quant.quantize_per_token_group(x, 128, fp8_dtype=lay.fp8, qmax=lay.qmax)
    ocp, ocp_s = act_quant.quantize_per_token_group(x, 128)
    assert torch.equal(xq.view(torch.uint8), (ocp.float() / 2).to(torch.float8_e4m3fnuz).view(torch.uint8))
    assert torch.equal(xs, ocp_s * 2)
    xd = (xq.float().unflatten(1, (-1, 128)) * xs[..., None]).flatten(1)
    ws = lay.w_scale.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    y = xd @ (lay.w.float() * ws).T
    assert rel(y, reference.linear(x, canon, out_dtype=torch.float32)) < 3e-3


def test_gfx950_runs_ocp_fp8_with_its_own_table() -> None:
    (kernel,) = specialise(RocmPolicy(arch_target("gfx950")), TritonFp8)
    state, err = _run(kernel, "w8a8-fp8-ch", 256, 64, (1, 20), torch.float16, 7)
    assert state.layout.w.dtype == torch.float8_e4m3fn and state.layout.mult == 1.0
    assert err < 3e-3, err
    want = _table_configs("quantrt.backends.rocm", "w8a8", "gfx950", "fp8_rowwise", 256, 64)
    got = {s.name for s in state.strategies}
    assert got <= {f"triton quant + {tile_table.describe(c)}" for c in want}, got
    assert all(c.num_stages <= 2 for c in want)  # AMD's two-stage pipelines, not NVIDIA's


def test_int4_weight_only_on_amd_and_intel_tables() -> None:
    for policy, package, arch in (
        (RocmPolicy(arch_target("gfx942")), "quantrt.backends.rocm", "gfx942"),
        (XpuPolicy(Target("pvc")), "quantrt.backends.xpu", "pvc"),
    ):
        (kernel,) = specialise(policy, TritonW4A16)
        state, err = _run(kernel, "w4a16-int-g64-asym", 320, 72, (1, 3, 33), torch.float16, 2)
        assert err < 3e-3, (kernel.name, err)
        doc = tile_table.load(package, "w4a16", arch)
        large = doc["large"]
        assert state.strategies[-1].name == tile_table.describe(
            tile_table.tile_configs(doc, 72, 320, TileConfig, block=(None, 64))[-1]
        )
        if arch == "pvc":
            assert large["num_warps"] >= 16  # Intel's wide work-groups on large tiles
        assert tile_table.load(package, "w4a16", arch) != tile_table.load(
            "quantrt.backends.cuda", "w4a16", "default"
        )


def test_fp4_and_int8_on_pvc() -> None:
    (fp4, int8) = specialise(XpuPolicy(Target("pvc")), TritonFp4, TritonInt8)
    assert (fp4.name, int8.name) == ("xpu.triton_fp4", "xpu.triton_int8")
    _, err = _run(fp4, "w4a16-mxfp4", 256, 40, (1, 4), torch.float16, 9)
    assert err < 3e-3, err
    _, err = _run(int8, "w8a8-int-ch-sym", 96, 40, (1, 9), torch.float16, 4)
    assert err < 3e-3, err
