"""cuda.torch_scaled_mm_nvfp4 (backends/cuda/torch_fp4.py) without an sm_100 GPU: the activation
codes and scales against the scheme's reference, the swizzled scale layout against cuBLAS's
documented index formula, the whole call against an fp64 emulation of the block-scaled matmul
that decodes its operands by that formula, and the plans that pick it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantrt import reference
from quantrt.backends.cuda import torch_fp4
from quantrt.capability import load_preset
from quantrt.dispatch import select
from quantrt.reference.fp4 import E2M1_VALUES, fake_quantize_nvfp4_activations
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec


def blocked_offset(r: int, c: int, cols: int) -> int:
    """cuBLAS's 1D block-scaling layout (cuBLAS docs, "1D Block Scaling Factors Layout"): 128x4 tiles
    in row-major tile order; inside one, row r sits at (r % 32) * 16 + (r % 128) // 32 * 4, column c % 4."""
    cb = -(-cols // 4)
    return (r // 128) * cb * 512 + (c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4


def decode(codes: torch.Tensor, scales: torch.Tensor, g: float) -> torch.Tensor:
    M = codes.shape[0]
    c = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(M, -1)
    v = E2M1_VALUES[c.long()].double().view(M, -1, 16)
    return (v * scales.double().unsqueeze(-1) * g).view(M, -1)


@pytest.mark.parametrize("M,K", [(1, 16), (7, 64), (33, 272)])
def test_activation_codes_match_the_reference(M: int, K: int) -> None:
    x = torch.randn(M, K) * torch.rand(M, 1) * 10
    x[0, :16] = 0  # an all-zero block
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -1.75, -5.0, 7.0, -0.0, 0.1])
    x[-1, : grid.numel()] = grid  # midpoints (ties to even), saturation, -0
    x[-1, 15] = 6.0  # the block's amax: scale 1 when g = 1 / 448... exactly on the grid
    g = torch.tensor([0.0123])
    codes, s = torch_fp4.quantize_activations(x, g)
    assert codes.shape == (M, K // 2) and s.shape == (M, K // 16) and s.dtype == torch.float8_e4m3fn
    ref = fake_quantize_nvfp4_activations(x, g)
    assert torch.equal(decode(codes, s, float(g)).float(), ref)


def test_e2m1_rounding_on_every_midpoint() -> None:
    v = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 9.0, -0.25, -2.5, -0.0])
    want = torch.tensor([0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 12, 8], dtype=torch.uint8)
    assert torch.equal(torch_fp4.e2m1_codes(v), want)


@pytest.mark.parametrize("rows,cols", [(128, 4), (200, 7), (1, 1), (300, 20)])
def test_blocked_layout_follows_the_cublas_formula(rows: int, cols: int) -> None:
    s = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    b = torch_fp4.to_blocked(s)
    assert b.numel() == -(-rows // 128) * 128 * -(-cols // 4) * 4
    seen = torch.zeros(b.numel(), dtype=torch.bool)
    for r in range(rows):
        for c in range(cols):
            off = blocked_offset(r, c, cols)
            assert b[off] == s[r, c], (r, c)
            seen[off] = True
    assert not b[~seen].any(), "padding must be zero"


def emulated_scaled_mm(a, b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None,
                       bias=None, output_dtype=torch.bfloat16, **_):  # fmt: skip
    """fp64 NVFP4 x NVFP4 with the scales read back through cuBLAS's layout formula."""
    assert recipe_a == [F.ScalingType.BlockWise1x16] == recipe_b
    assert swizzle_a == [F.SwizzleType.SWIZZLE_32_4_4] == swizzle_b
    assert a.dtype == b.dtype == torch.float4_e2m1fn_x2
    A = a.view(torch.uint8)
    B = b.t().contiguous().view(torch.uint8)  # [N, K/2]

    def unblock(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        u8 = flat.view(torch.uint8)
        idx = torch.tensor([[blocked_offset(r, c, cols) for c in range(cols)] for r in range(rows)])
        return u8[idx].view(torch.float8_e4m3fn)

    K = A.shape[1] * 2
    sa = unblock(scale_a[0], A.shape[0], K // 16)
    sb = unblock(scale_b[0], B.shape[0], K // 16)
    y = decode(A, sa, 1.0) @ decode(B, sb, 1.0).T
    return y.to(output_dtype)


def test_apply_matches_the_w4a4_reference_by_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    scheme = "w4a4-nvfp4"
    N, K = 96, 160
    w = torch.randn(N, K) * 0.05
    calib = torch.randn(32, K)
    canon = reference.quantize(w, scheme, calib=calib, output_sizes=(64, 32))
    spec = LayerSpec(canon.scheme, K, N, act_dtype=torch.bfloat16, output_sizes=(64, 32))
    kernel = torch_fp4.CudaScaledMMNvfp4()
    state = kernel.prepare(canon, spec)
    monkeypatch.setattr(torch_fp4.F, "scaled_mm", emulated_scaled_mm)
    x = torch.randn(5, K).to(torch.bfloat16)
    bias = torch.randn(N).to(torch.bfloat16)
    y = kernel.apply(state, x, bias)
    ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
    assert y.dtype == torch.bfloat16
    assert float((y.float() - ref).norm() / ref.norm()) < 4e-3  # the bf16 output rounding only


def test_plans_pick_native_fp4_on_b200_and_the_substitute_on_hopper() -> None:
    spec = LayerSpec(parse_scheme("w4a4-nvfp4"), 4096, 4096, act_dtype=torch.bfloat16)
    api, _ = torch_fp4.torch_fp4_api()
    b200 = select(spec, "cuda:0", caps=load_preset("b200"))
    assert b200.kernel.name == ("cuda.torch_scaled_mm_nvfp4" if api else "cuda.mma_fp4")
    h200 = select(spec, "cuda:0", caps=load_preset("h200"))
    assert (h200.kernel.name, h200.label) == ("cuda.mma_fp4", "weight-only substitute")
    why = {c.name: c.verdict.reason for c in h200.candidates}["cuda.torch_scaled_mm_nvfp4"]
    assert "sm >= 100" in why, why
