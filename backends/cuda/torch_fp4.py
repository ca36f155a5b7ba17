"""W4A4 NVFP4 on Blackwell's fp4 tensor cores through torch (``torch.nn.functional.scaled_mm``).

From sm_100, cuBLASLt multiplies e2m1 operands with e4m3 scales per 16 inputs natively, and
torch exposes it (``torch.float4_e2m1fn_x2`` operands, ``ScalingType.BlockWise1x16`` scales in
cuBLAS's swizzled 128x4 layout). This kernel quantizes the activations per call exactly as the
scheme's reference does (per row and 16 inputs: e4m3 scale of amax / (6 g), e2m1 codes rounded to
nearest even), lays the scales out for cuBLAS, and applies the two global scales (activations'
and the weight's, per fused slice) to the fp32 product. The weight's codes are used as stored: the
canonical packing (low nibble = even k) is torch's ``float4_e2m1fn_x2``.

Where torch lacks this API, or the GPU has no fp4 units, ``can_implement`` says so and the plan falls
back to ``cuda.triton_fp4`` as a weight-only substitute. Verified here: the activation codes and
scales against the reference, the scale layout against cuBLAS's documented index formula, and the
product by emulation; the cuBLASLt call itself needs an sm_100 GPU, which quantrt's test machines
do not have yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

BLOCK = 16  # inputs per NVFP4 scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0


def torch_fp4_api() -> tuple[bool, str]:
    """Whether the running torch exposes the NVFP4 block-scaled matmul, and what was looked for."""
    has_dtype = hasattr(torch, "float4_e2m1fn_x2")
    scaling = getattr(F, "ScalingType", None)
    has_mm = hasattr(F, "scaled_mm") and scaling is not None and "BlockWise1x16" in scaling.__members__
    return has_dtype and has_mm, "torch.float4_e2m1fn_x2 and F.scaled_mm with ScalingType.BlockWise1x16"


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, sign in bit 3) of fp32 values already divided by their scale: nearest,
    ties to even, saturating at 6. The grid has steps of 0.5 below 2, 1 below 4 and 2 above, so each
    range rounds with ``torch.round`` (half to even) at its own step."""
    mag = v.abs().clamp(max=E2M1_MAX)
    low = torch.round(mag * 2)  # 0..4 -> codes 0..4 (0, 0.5, 1, 1.5, 2)
    mid = torch.round(mag) + 2  # 2..4 -> codes 4..6 (2, 3, 4)
    high = torch.round(mag / 2) + 4  # 2..3 -> codes 6, 7 (4, 6)
    idx = torch.where(mag < 2, low, torch.where(mag < 4, mid, high)).to(torch.uint8)
    return idx | (torch.signbit(v).to(torch.uint8) << 3)


def quantize_activations(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K % 16 == 0) -> packed e2m1 codes uint8 [M, K/2] (low nibble = even k) and e4m3
    block scales [M, K/16], for the activations' global scale ``g`` (one fp32)."""
    M, K = x.shape
    xb = x.float().view(M, K // BLOCK, BLOCK)
    s = (xb.abs().amax(dim=-1) / (E2M1_MAX * g)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = (s.float() * g).unsqueeze(-1)
    codes = e2m1_codes(torch.where(step > 0, xb / step, torch.zeros_like(xb))).view(M, K)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), s


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [rows, cols] in cuBLAS's swizzled layout for 1x16 block scaling (flat): tiles
    of 128 rows x 4 columns, each stored as 32 lines of 16 bytes (row r % 32 holds rows r, r+32,
    r+64, r+96, four scales each). Padding (rows to 128, columns to 4) is zero."""
    rows, cols = scales.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    padded = torch.zeros(rb * 128, cb * 4, dtype=scales.dtype, device=scales.device)
    padded[:rows, :cols] = scales
    tiles = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)  # [rb, cb, 128, 4]
    return tiles.reshape(rb, cb, 4, 32, 4).transpose(2, 3).reshape(-1).contiguous()


@dataclass(frozen=True)
class Nvfp4Layout:
    w: torch.Tensor  # float4_e2m1fn_x2 [N, K/2]
    w_scales: torch.Tensor  # e4m3, blocked
    in_global: torch.Tensor  # fp32 [1]
    alpha: torch.Tensor  # fp32 [N]: the activations' global scale times the weight's, per row
    out_dtype: torch.dtype


def _nvfp4_mm(lay: Nvfp4Layout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    codes, sx = quantize_activations(x, lay.in_global)
    recipe = [F.ScalingType.BlockWise1x16]
    swz = [F.SwizzleType.SWIZZLE_32_4_4]
    y = F.scaled_mm(
        codes.view(torch.float4_e2m1fn_x2), lay.w.t(), [to_blocked(sx)], recipe, [lay.w_scales], recipe,
        swizzle_a=swz, swizzle_b=swz, output_dtype=torch.float32,
    )  # fmt: skip
    y = y * lay.alpha
    if bias is not None:
        y = y + bias.float()
    if out is not None:
        return out.copy_(y)
    return y.to(lay.out_dtype)


class CudaScaledMMNvfp4(Kernel):
    """W4A4 NVFP4 on fp4 tensor cores (sm_100+) through torch's block-scaled ``scaled_mm``."""

    name = "cuda.torch_scaled_mm_nvfp4"
    description = (
        "W4A4 NVFP4 natively: activations quantized to e2m1 + e4m3 blocks in torch ops, "
        "F.scaled_mm (cuBLASLt fp4, BlockWise1x16) on sm_100+"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        api, what = torch_fp4_api()
        return check(
            ((caps.sm or 0) >= 100 and "nvfp4" in caps.matrix_types, "fp4 tensor cores (sm >= 100)",
             {"sm": caps.sm}),
            (api, f"torch exposes {what}", {"torch": torch.__version__}),
            (s.family == "nvfp4" and s.act == "nvfp4", "W4A4 NVFP4 (fp4 activations)",
             {"weight": s.weight, "act": s.act}),
            (spec.K_part % 32 == 0, "K % 32 == 0 (16-byte rows of fp4 codes)", {"K": spec.K_part}),
        )  # fmt: skip

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        g = weight["global_scale"].float()
        in_g = weight["input_global_scale"].float().reshape(1)
        rows = g[weight.slice_index().to(g.device)]
        w = weight["qweight"].contiguous().view(torch.float4_e2m1fn_x2)
        layout = Nvfp4Layout(
            w, to_blocked(weight["scales"]), in_g, (rows * in_g).contiguous(), spec.output_dtype
        )
        name = "e2m1 + e4m3 activation quant + F.scaled_mm (cuBLASLt fp4)"
        return self.prepared(layout, [Strategy(ALL_M, name, _nvfp4_mm)], spec, w.device)
