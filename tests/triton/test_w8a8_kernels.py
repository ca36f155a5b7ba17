"""The NVIDIA W8A8 / fp8 weight-only kernels (backends/cuda/triton_w8a8.py) end to end: prepare
from canonical tensors, apply, compare with the fp32 reference (which quantizes activations as
the scheme says); every M strategy, static and dynamic activations, ragged shapes; what each
kernel supports on the GPU presets. On the CPU the Triton kernels run under the interpreter and
``torch._scaled_mm`` on its CPU implementation; tests/gpu repeats this on the H200."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import (
    CudaTritonBlockFp8,
    CudaTritonFp8,
    CudaTritonFp8WeightOnly,
    CudaTritonInt8,
)
from quantrt.capability import load_preset
from quantrt.plans import layer_spec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def check(kernel, scheme: str, K: int, N: int, ms, act: torch.dtype, tol: float, weight_only: bool = False):
    g = torch.Generator().manual_seed(K * 7 + N)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (3,), generator=g)] *= 8  # outlier columns
    calib = torch.randn(64, K, generator=g) * 2
    canon = reference.quantize(w, scheme, calib=calib if "static" in scheme else None)
    bias = torch.randn(N, generator=g)
    spec = layer_spec(scheme, K, N, act_dtype=act, bias=True)
    k = kernel()
    state = k.prepare(canon.to(DEV), spec)
    strategies = set()
    for m in ms:
        x = (torch.randn(m, K, generator=g) * 1.5).to(act)
        if m:
            x[0, :5] = 0.0  # part of a row at zero, and one value far out
            x[-1, 3] = 40.0
        y = k.apply(state, x.to(DEV), bias.to(act).to(DEV))
        assert y.shape == (m, N) and y.dtype == spec.output_dtype
        strategies.add(k.strategy(state, m))
        if m:
            ref = reference.linear(x, canon, bias, out_dtype=torch.float32, weight_only=weight_only)
            assert rel(y, ref) < tol, (scheme, m, rel(y, ref), k.strategy(state, m))
    return strategies


@pytest.mark.parametrize(
    "scheme", ["w8a8-fp8-ch", "w8a8-fp8-tensor", "w8a8-fp8-ch-static", "w8a8-fp8-tensor-static"]
)
def test_fp8_w8a8_every_strategy(scheme: str) -> None:
    # K, N multiples of 16 and a bf16 output: small M on Triton, M >= 65 on _scaled_mm
    seen = check(CudaTritonFp8, scheme, 256, 96, (0, 1, 5, 70), torch.bfloat16, 1e-2)
    assert any("_scaled_mm" in s for s in seen) and any("BM" in s for s in seen), seen
    # K not a multiple of 16, fp16 output: Triton at every M
    seen = check(CudaTritonFp8, scheme, 200, 77, (1, 70), torch.float16, 3e-3)
    assert not any("_scaled_mm" in s for s in seen), seen
    # fp16 output: _scaled_mm only where both scales are per tensor (its row-wise mode is bf16-only)
    seen = check(CudaTritonFp8, scheme, 256, 96, (70,), torch.float16, 3e-3)
    assert any("_scaled_mm" in s for s in seen) == (scheme == "w8a8-fp8-tensor-static"), seen


def test_block_fp8_ragged_blocks() -> None:
    check(CudaTritonBlockFp8, "w8a8-fp8-block128", 300, 200, (0, 1, 5, 33), torch.float16, 3e-3)
    check(CudaTritonBlockFp8, "w8a8-fp8-block128", 256, 128, (1, 17), torch.bfloat16, 1e-2)


@pytest.mark.parametrize(
    "scheme", ["w8a16-fp8-ch", "w8a16-fp8-tensor", "w8a16-fp8-block128", "w8a16-fp8e5m2-ch"]
)
def test_fp8_weight_only(scheme: str) -> None:
    check(CudaTritonFp8WeightOnly, scheme, 300, 77, (0, 1, 5, 33), torch.float16, 3e-3)


def test_fp8_weight_only_substitutes_w8a8_below_sm89() -> None:
    """On an A100 a W8A8 fp8 checkpoint runs weight-only, against the weight-only reference."""
    a100, h100 = load_preset("a100").default_device, load_preset("h100").default_device
    spec = layer_spec("w8a8-fp8-ch", 4096, 4096)
    assert CudaTritonFp8WeightOnly.supports(spec, a100).ok
    assert CudaTritonFp8WeightOnly.label(spec) == "weight-only substitute"
    assert CudaTritonFp8WeightOnly.label(layer_spec("w8a16-fp8-ch", 4096, 4096)) == "native"
    v = CudaTritonFp8WeightOnly.supports(spec, h100)
    assert not v.ok and "fp8 matrix units run W8A8 natively" in v.reason
    check(CudaTritonFp8WeightOnly, "w8a8-fp8-ch", 256, 64, (1, 9), torch.float16, 3e-3, weight_only=True)


@pytest.mark.parametrize(
    "scheme", ["w8a8-int-ch-sym", "w8a8-int-ch-sym-static", "w8a8-int-tensor-sym-static"]
)
@pytest.mark.parametrize("act", [torch.float16, torch.float32])
def test_int8_w8a8(scheme: str, act: torch.dtype) -> None:
    check(CudaTritonInt8, scheme, 200, 77, (0, 1, 5, 33), act, 3e-3 if act == torch.float16 else 1e-5)


def test_supports_on_presets() -> None:
    h100, l40s, a100 = (load_preset(p).default_device for p in ("h100", "l40s", "a100"))
    fp8 = layer_spec("w8a8-fp8-ch", 4096, 4096)
    assert CudaTritonFp8.supports(fp8, h100).ok and CudaTritonFp8.supports(fp8, l40s).ok
    v = CudaTritonFp8.supports(fp8, a100)
    assert (v.predicate, dict(v.values)["sm"]) == ("fp8 matrix units (sm >= 89)", 80)
    block = layer_spec("w8a8-fp8-block128", 4096, 4096)
    assert CudaTritonBlockFp8.supports(block, h100).ok
    assert not CudaTritonFp8.supports(block, h100).ok  # block scales are the block kernel's
    assert CudaTritonInt8.supports(layer_spec("w8a8-int-ch-sym", 4096, 4096), a100).ok
    v = CudaTritonInt8.supports(
        layer_spec("w8a8-int-ch-sym", 4096, 4096), load_preset("mi300x").default_device
    )
    assert not v.ok  # an AMD preset has no NVIDIA sm


@pytest.mark.parametrize(
    "scheme,kernel",
    [
        ("w8a8-fp8-ch", CudaTritonFp8),
        ("w8a8-fp8-block128", CudaTritonBlockFp8),
        ("w8a16-fp8-block128", CudaTritonFp8WeightOnly),
        ("w8a8-int-ch-sym-static", CudaTritonInt8),
    ],
)
def test_traced_op_for_torch_compile(scheme: str, kernel) -> None:
    """The op torch.compile traces (quantrt::linear on the prepared layer: its fake checked by
    torch's opcheck, a fullgraph trace without a graph break) computes what the eager path
    computes and mutates nothing."""
    g = torch.Generator().manual_seed(11)
    K, N, act = 256, 48, torch.float16
    canon = reference.quantize(
        torch.randn(N, K, generator=g) * 0.05, scheme, calib=torch.randn(8, K, generator=g)
    )
    k = kernel()
    spec = layer_spec(scheme, K, N, act_dtype=act, bias=True)
    st = k.prepare(canon.to(DEV), spec)
    x = torch.randn(3, K, generator=g).to(act).to(DEV)
    bias = torch.randn(N, generator=g).to(act).to(DEV)
    args = (x, bias, st.id)
    torch.library.opcheck(torch.ops.quantrt.linear.default, args, test_utils=("test_faketensor",))
    tensors = [x, bias, *(v for v in vars(st.layout).values() if isinstance(v, torch.Tensor))]
    before = [t.clone() for t in tensors]
    y = torch.ops.quantrt.linear(*args)
    # compare bytes: fp8 has no arithmetic on the CPU
    raw = [
        (t.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) for t, b in zip(tensors, before)
    ]
    assert all(torch.equal(t, b) for t, b in raw)  # no input mutated
    eager = k.apply(st, x, bias)
    assert y.dtype == spec.output_dtype and torch.equal(y, eager)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: st(t, bias), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), eager)


def test_scaled_mm_gets_what_cuda_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU _scaled_mm takes any output dtype with row-wise scales; cuBLASLt only bf16. Hold the
    calls to CUDA's rule: a 16-bit output other than bf16 only with per-tensor (0-dim) scales."""
    real = torch._scaled_mm
    seen = []

    def cuda_rule(a, b, scale_a, scale_b, out_dtype=None, **kw):
        rowwise = scale_a.numel() > 1 or scale_b.numel() > 1
        assert not rowwise or out_dtype == torch.bfloat16, (
            tuple(scale_a.shape),
            tuple(scale_b.shape),
            out_dtype,
        )
        seen.append(rowwise)
        return real(a, b, scale_a, scale_b, out_dtype=out_dtype, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", cuda_rule)
    for scheme in ("w8a8-fp8-tensor-static", "w8a8-fp8-ch", "w8a8-fp8-tensor"):
        for act in (torch.float16, torch.bfloat16):
            check(CudaTritonFp8, scheme, 256, 96, (70,), act, 1e-2)
    assert True in seen and False in seen  # both modes ran
