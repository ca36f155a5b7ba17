"""The one-launch W8A8 kernel for small batches (backends/triton/w8a8_fused.py): activation codes
found inside the GEMM equal the two-pass path's (act_quant), so the outputs match the fp32
reference as closely as the two-pass GEMM's; every mode (fp8 / int8, per-token / static), ragged
K and N, non-contiguous x, bias; and the layers route batches up to 16 rows to it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import CudaTritonFp8, CudaTritonInt8
from quantrt.backends.triton import w8a8_ops
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.w8a8_fused import FUSED_MAX_M, fused_strategy
from quantrt.plans import layer_spec

DEV = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL = {"fp8": CudaTritonFp8, "int8": CudaTritonInt8}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


@pytest.mark.parametrize(
    "scheme", ["w8a8-fp8-ch", "w8a8-fp8-tensor-static", "w8a8-int-ch-sym", "w8a8-int-tensor-sym-static"]
)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=str)
def test_fused_matches_the_reference(scheme: str, act: torch.dtype) -> None:
    K, N = 300, 70  # K past one 256-wide tile, N past two 32-wide column blocks
    g = torch.Generator().manual_seed(K + N + len(scheme))
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (3,), generator=g)] *= 8
    calib = torch.randn(64, K, generator=g) * 2
    canon = reference.quantize(w, scheme, calib=calib if "static" in scheme else None)
    bias = torch.randn(N, generator=g).to(act)
    kind = "int8" if "-int-" in scheme else "fp8"
    kernel = KERNEL[kind]()
    state = kernel.prepare(canon.to(DEV), layer_spec(scheme, K, N, act_dtype=act, bias=True))
    lay32 = replace(state.layout, out_dtype=torch.float32)
    two_pass_fn = (w8a8_ops.int8 if kind == "int8" else w8a8_ops.fp8_triton)(TileConfig(16, 32, 64))
    for m in (1, 5, 16):
        x = (torch.randn(m, 2 * K, generator=g) * 1.5).to(act)[:, ::2]  # non-contiguous
        x[0, :5] = 0.0
        x[-1, 3] = 40.0  # a value past a static scale's range: codes saturate
        assert kernel.strategy(state, m).startswith("fused"), kernel.strategy(state, m)
        y = kernel.apply(state, x.to(DEV), bias.to(DEV))
        ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
        tol = 4e-3 if act == torch.bfloat16 else 1e-3  # one rounding of the output
        assert y.shape == (m, N) and rel(y, ref) < tol, (m, rel(y, ref))
        # fp32 out: the codes and scales are the two-pass path's, so only the summation order differs
        fused = fused_strategy(kind)(lay32, x.to(DEV), None, None, None)
        two_pass = two_pass_fn(lay32, x.to(DEV), None, None, None)
        assert (
            rel(fused, two_pass) < 1e-6
            and rel(fused, reference.linear(x, canon, out_dtype=torch.float32)) < 1e-5
        )
    assert not kernel.strategy(state, FUSED_MAX_M + 1).startswith("fused")
    zero = kernel.apply(state, torch.zeros(3, K, dtype=act, device=DEV), None)
    assert torch.equal(zero.cpu(), torch.zeros(3, N, dtype=zero.dtype))  # all-zero rows: scale 1, codes 0
