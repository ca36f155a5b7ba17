"""Kernels built on torch's ops, against the fp32 reference, on awkward shapes and dtypes.

The CPU kernels run here for real. The CUDA/ROCm kernels' arithmetic (activation
quantization, the e4m3fn -> e4m3fnuz conversion, padding small batches) is the same torch
code on any device, so it is checked here through torch's CPU ``_scaled_mm``/``_int_mm``;
on the GPU, tests/gpu runs them again.
"""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu.torch_packed import CpuInt4Pack, CpuInt8Pack, CpuIntMM
from quantrt.backends.cuda.torch_ops import CudaIntMM, CudaScaledMMFp8, CudaTinygemm
from quantrt.backends.rocm.torch_ops import RocmIntMM, RocmScaledMMFp8, RocmScaledMMFp8Fnuz
from quantrt.capability import load_preset, probe
from quantrt.kernels import Kernel
from quantrt.plans import layer_spec
from quantrt.schemes import parse_scheme

TOL = {torch.float32: 2e-5, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def run_kernel(
    kernel: type[Kernel],
    scheme: str,
    K: int,
    N: int,
    M: int,
    dtype: torch.dtype,
    *,
    seed: int,
    bias: bool = True,
    noncontig: bool = False,
    weight_only_ref: bool = False,
) -> tuple[float, float]:
    g = torch.Generator().manual_seed(seed)
    s = parse_scheme(scheme)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (2,), generator=g)] *= 5
    x = torch.randn(M, 2 * K if noncontig else K, generator=g)
    if noncontig:
        x = x[:, ::2]
    x = x.to(dtype)
    canon = reference.quantize(w, s, calib=torch.randn(16, K, generator=g))
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    spec = layer_spec(s, K, N, act_dtype=dtype, bias=bias)
    k = kernel()
    state = k.prepare(canon, spec)
    y = k.apply(state, x, b)
    assert y.shape == (M, N) and y.dtype == dtype
    ref = reference.linear(x, canon, b, out_dtype=torch.float32, weight_only=weight_only_ref)
    out = torch.full((M, N), float("nan"), dtype=dtype)
    y2 = k.apply(state, x, b, out=out)
    assert y2 is out and not torch.isnan(out).any()
    return rel(y, ref), rel(out, ref)


CPU_CASES = [
    (CpuInt4Pack, "w4a16-int-g128-asym", 256, 48),
    (CpuInt4Pack, "w4a16-int-g32-sym", 96, 32),
    (CpuInt4Pack, "w4a16-int-g64-asym", 320, 16),
    (CpuInt4Pack, "w4a16-int-g128-sym-actorder", 384, 64),
    (CpuInt4Pack, "w4a16-int-g128-asym-actorder", 256, 32),
    (CpuInt8Pack, "w8a16-int-ch-sym", 112, 36),
    (CpuInt8Pack, "w8a16-int-ch-sym-sfp32", 64, 20),
    (CpuIntMM, "w8a8-int-ch-sym", 136, 40),
    (CpuIntMM, "w8a8-int-ch-sym-static", 64, 24),
    (CpuIntMM, "w8a8-int-tensor-sym-static", 72, 16),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kernel,scheme,K,N", CPU_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_cpu_kernels_match_reference(
    kernel: type[Kernel], scheme: str, K: int, N: int, dtype: torch.dtype
) -> None:
    caps = probe().cpu
    spec = layer_spec(scheme, K, N, act_dtype=dtype)
    assert kernel.supports(spec, caps).ok, kernel.supports(spec, caps).reason
    for i, M in enumerate((1, 7, 33)):
        e1, e2 = run_kernel(kernel, scheme, K, N, M, dtype, seed=100 * i + K, noncontig=(i == 1))
        assert e1 < TOL[dtype] and e2 < TOL[dtype], (M, e1, e2)


SHARED_CASES = [
    # (kernel, scheme, out dtype) through torch's CPU _scaled_mm / _int_mm
    (CudaScaledMMFp8, "w8a8-fp8-ch", torch.bfloat16),
    (CudaScaledMMFp8, "w8a8-fp8-tensor-static", torch.bfloat16),
    (CudaScaledMMFp8, "w8a8-fp8-tensor-dyn", torch.float16),
    (CudaScaledMMFp8, "w8a8-fp8-ch-static", torch.bfloat16),
    (RocmScaledMMFp8Fnuz, "w8a8-fp8-ch", torch.bfloat16),
    (RocmScaledMMFp8Fnuz, "w8a8-fp8-tensor-static", torch.bfloat16),
    (RocmScaledMMFp8, "w8a8-fp8-tensor", torch.bfloat16),
    (CudaIntMM, "w8a8-int-ch-sym", torch.bfloat16),
    (RocmIntMM, "w8a8-int-ch-sym-static", torch.float16),
]


@pytest.mark.parametrize("kernel,scheme,dtype", SHARED_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gpu_kernel_arithmetic_on_cpu(kernel: type[Kernel], scheme: str, dtype: torch.dtype) -> None:
    # torch's CPU _scaled_mm hands per-tensor scales to oneDNN where the CPU has AMX, and oneDNN
    # refuses e4m3fnuz there; torch's own loop runs the same arithmetic (ROCm runs hipBLASLt)
    onednn = kernel is not RocmScaledMMFp8Fnuz
    with torch.backends.mkldnn.flags(enabled=onednn):
        for M in (1, 16, 40):  # CUDA/ROCm int_mm pads batches of 16 rows or fewer
            e1, e2 = run_kernel(kernel, scheme, 128, 48, M, dtype, seed=M)
            assert e1 < TOL[dtype] and e2 < TOL[dtype], (M, e1, e2)


def test_small_batches_pad_in_the_workspace() -> None:
    """cuBLASLt's _int_mm wants M > 16: smaller batches run padded in the prepared layer's workspace
    (one buffer for every call, whatever the earlier batches left in it), larger ones unpadded."""
    g = torch.Generator().manual_seed(3)
    K, N = 64, 24
    canon = reference.quantize(torch.randn(N, K, generator=g) * 0.05, "w8a8-int-ch-sym")
    spec = layer_spec("w8a8-int-ch-sym", K, N)
    k = CudaIntMM()
    state = k.prepare(canon, spec)
    assert "padded to 17 rows" in k.strategy(state, 16) and "padded" not in k.strategy(state, 17)
    assert k.workspace_bytes(spec, 1) == k.workspace_bytes(spec, 4096) >= 17 * (K + 4 * N)
    buffers = set()
    for M in (16, 1, 5, 40, 3):
        x = torch.randn(M, K, generator=g).to(torch.bfloat16)
        y = k.apply(state, x)
        ref = reference.linear(x, canon, out_dtype=torch.float32)
        assert y.shape == (M, N) and rel(y, ref) < TOL[torch.bfloat16], M
        if M in (16, 1, 5):  # before the largest batch grows, every small one uses the same buffer
            buffers.add(state.workspace(M).data_ptr())
    assert len(buffers) == 1


def test_fnuz_conversion_keeps_values() -> None:
    """e4m3fn -> e4m3fnuz: same bits are half the value (scale doubles); e4m3fn -0 (0x80) is fnuz NaN."""
    s = parse_scheme("w8a8-fp8-tensor-static")
    q = torch.tensor([[0x80, 0x38, 0xB8, 0x7E, 0x01, 0x00, 0x08, 0xFE]], dtype=torch.uint8)
    w = reference.CanonicalWeight(
        s,
        1,
        8,
        {
            "qweight": q.view(torch.float8_e4m3fn).repeat(16, 2),
            "scales": torch.tensor([0.5]),
            "input_scale": torch.tensor([1.0]),
        },
    )
    state = RocmScaledMMFp8Fnuz().prepare(w, layer_spec(s, 16, 16))
    fnuz = state.layout.wt.t().float() * state.layout.w_scale
    fn = w["qweight"].float() * 0.5
    assert torch.equal(fnuz, fn.nan_to_num())  # 0x80 became +0, everything else identical
    assert not torch.isnan(fnuz).any()


def test_verdicts_name_predicate_and_values() -> None:
    cpu = probe().cpu
    v = CpuInt4Pack.supports(layer_spec("w4a16-int-g128-asym", 256, 40), cpu)
    assert (v.ok, v.predicate, dict(v.values)) == (False, "N % 16 == 0", {"N": 40})
    v = CpuInt4Pack.supports(
        layer_spec("w4a16-int-g128-asym-actorder", 512, 64, parallel="row", tp_size=2), cpu
    )
    assert (v.predicate, dict(v.values)) == (
        "act-order with the full K on this rank",
        {"K_part": 256, "K": 512},
    )
    v = CpuInt8Pack.supports(layer_spec("w8a16-int-ch-sym", 100, 64), cpu)
    assert (v.predicate, dict(v.values)) == ("K % 16 == 0", {"K": 100})
    v = CpuInt4Pack.supports(layer_spec("w4a16-int-ch-sym", 4096, 64), cpu)
    assert (v.predicate, dict(v.values)) == ("group size in (32, 64, 128, 256)", {"G": 4096})
    a100 = load_preset("a100").default_device
    v = CudaScaledMMFp8.supports(layer_spec("w8a8-fp8-ch", 4096, 4096), a100)
    assert (v.predicate, dict(v.values)) == ("sm >= 89 (fp8 tensor cores)", {"sm": 80})
    h100 = load_preset("h100").default_device
    assert CudaScaledMMFp8.supports(layer_spec("w8a8-fp8-ch", 4096, 4096), h100).ok
    v = CudaScaledMMFp8.supports(layer_spec("w8a8-fp8-ch", 4096, 4096, act_dtype=torch.float16), h100)
    assert v.predicate == "bf16 output for row-wise scales"
    v = CudaTinygemm.supports(layer_spec("w4a16-int-g128-asym", 4096, 4096, act_dtype=torch.float16), h100)
    assert (v.predicate, dict(v.values)) == ("activations (bfloat16)", {"act_dtype": torch.float16})
    mi300 = load_preset("mi300x").default_device
    assert RocmScaledMMFp8Fnuz.supports(layer_spec("w8a8-fp8-tensor", 4096, 4096), mi300).ok
    assert not RocmScaledMMFp8.supports(layer_spec("w8a8-fp8-tensor", 4096, 4096), mi300).ok
