"""The CUDA kernels on a real GPU: dispatch picks them, they match the fp32 reference on
awkward shapes, and QuantLinear replays under a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.capability import probe
from quantrt.env import Overrides
from quantrt.layers import QuantLinear

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def build(
    scheme: str, K: int, N: int, dtype: torch.dtype, seed: int, kernel: str | None = None
) -> tuple[QuantLinear, object, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.03
    w[:, torch.randint(0, K, (3,), generator=g)] *= 6
    canon = reference.quantize(w, scheme, calib=torch.randn(64, K, generator=g))
    bias = torch.randn(N, generator=g)
    ov = Overrides(kernel=kernel) if kernel else None
    layer = QuantLinear.from_canonical(
        canon, bias=bias.to(dtype), device="cuda", act_dtype=dtype, overrides=ov
    )
    return layer, canon, bias


CASES = [
    ("w4a16-int-g128-asym", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-g128-sym", "cuda.triton_w4a16", torch.float16),
    ("w4a16-int-g32-sym", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-g128-asym-actorder", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-ch-asym", "cuda.triton_w4a16", torch.bfloat16),
    ("w8a16-int-ch-sym", "cuda.triton_w8a16", torch.bfloat16),
    ("w8a16-int-g128-asym", "cuda.triton_w8a16", torch.float16),
    ("w4a16-int-g128-asym", "cuda.torch_tinygemm", torch.bfloat16),
    ("w4a16-int-g128-sym-actorder", "cuda.torch_tinygemm", torch.bfloat16),
    ("w8a8-fp8-ch", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-fp8-tensor", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-fp8-tensor-static", "cuda.torch_scaled_mm", torch.float16),
    ("w8a8-fp8-ch-static", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-int-ch-sym", "cuda.torch_int_mm", torch.bfloat16),
    ("w8a8-int-ch-sym-static", "cuda.torch_int_mm", torch.float16),
    ("w8a8-int-tensor-sym-static", "cuda.torch_int_mm", torch.bfloat16),
]


@pytest.mark.parametrize("scheme,kernel,dtype", CASES, ids=lambda v: str(v))
def test_kernel_matches_reference(scheme: str, kernel: str, dtype: torch.dtype) -> None:
    for K, N in ((4096, 4096), (640, 176)):
        layer, canon, bias = build(
            scheme, K, N, dtype, seed=K + N, kernel=kernel if kernel == "cuda.torch_tinygemm" else None
        )
        assert layer.kernel_name == kernel, layer.selection.explain()
        for M in (1, 16, 17, 300):
            g = torch.Generator().manual_seed(M)
            x = torch.randn(M, K, generator=g).to("cuda", dtype)
            y = layer(x)
            ref = reference.linear(x.cpu(), canon, bias, out_dtype=torch.float32)
            assert y.dtype == dtype and y.shape == (M, N)
            assert rel(y.cpu(), ref) < TOL[dtype], (K, N, M, rel(y.cpu(), ref))
        xs = torch.randn(5, 2 * K, device="cuda", dtype=dtype)[:, ::2]
        assert (
            rel(layer(xs).cpu(), reference.linear(xs.cpu(), canon, bias, out_dtype=torch.float32))
            < TOL[dtype]
        )
        assert layer(torch.empty(0, K, device="cuda", dtype=dtype)).shape == (0, N)


@pytest.mark.parametrize(
    "scheme", ["w4a16-int-g128-asym", "w8a16-int-ch-sym", "w8a8-fp8-ch", "w8a8-int-ch-sym"]
)
def test_cuda_graph_replay_equals_eager(scheme: str) -> None:
    layer, _, _ = build(scheme, 4096, 4096, torch.bfloat16, seed=1)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    eager = layer(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(y, layer(x)) < 1e-3  # split-K reduces with fp32 atomics: summation order may differ
    assert eager.shape == y.shape


def test_probe_reports_this_gpu() -> None:
    caps = probe()
    dev = caps.device("cuda:0")
    assert (
        dev.runnable
        and dev.vendor == "nvidia"
        and dev.compute_capability == torch.cuda.get_device_capability(0)
    )
    major, minor = torch.cuda.get_device_capability(0)
    assert dev.arch == f"sm_{major}{minor}"
    if dev.arch == "sm_90":
        assert "fp8_e4m3" in dev.matrix_types and "fp4_e2m1" not in dev.matrix_types
        assert {"_scaled_mm", "_int_mm", "_weight_int4pack_mm"} <= dev.torch_ops
