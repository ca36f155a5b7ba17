"""AMD's AITER kernels (``aiter``: CK and hand-written assembly GEMMs for MI300/MI350) as quantrt
kernels, where the package is importable.

AITER documents its fp8 GEMMs as faster than hipBLASLt on MI300 for DeepSeek-style block scales
(``gemm_a8w8_blockscale``) and for per-token x per-channel scales (``gemm_a8w8_CK``), so these rank
first on ROCm. They reuse the Triton kernels' prepared weights (codes in the device's fp8 flavour,
scales doubled for e4m3fnuz) and activation quantization; only the GEMM is AITER's. Verified
against the fake module's calls only (no AMD GPU has run them): docs/backends.md.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import torch

from quantrt.backends.triton.vendor import Condition
from quantrt.backends.triton.w8a8_kernel import TritonBlockFp8, TritonFp8
from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec
from quantrt.torchops import finish

from .policy import ROCM


def _aiter(caps: Any) -> Condition:
    return (
        "aiter" in caps.libraries,
        "aiter importable (AMD's CK / assembly GEMMs)",
        {"libraries": caps.libraries},
    )


class RocmAiterFp8(TritonFp8):
    """W8A8 fp8 per tensor/channel on ``aiter.gemm_a8w8_CK`` (per-token x per-channel scales)."""

    name = "rocm.aiter_fp8"
    short_name = "aiter_fp8"
    policy = ROCM
    description = (
        "fp8 W8A8: fused Triton activation quantization, aiter.gemm_a8w8_CK (scales in its epilogue)"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(_aiter(caps)) and super().can_implement(spec, caps)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from quantrt.backends.triton import w8a8_ops

        gemm = importlib.import_module("aiter").gemm_a8w8_CK  # bound at load: a call looks nothing up
        base = super().prepare(weight, spec)
        lay = replace(base.layout, w_scale=base.layout.w_scale.reshape(1, -1).contiguous())

        def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
            xq, a_scale = w8a8_ops.quantize(x, "fp8", lay.act, lay.in_scale, lay.fp8, lay.mult)
            a_scale = a_scale.float().reshape(-1, 1).expand(x.shape[0], 1).contiguous()
            return finish(
                gemm(xq, lay.w, a_scale, lay.w_scale, None, lay.out_dtype), bias, out, lay.out_dtype
            )

        strategy = Strategy(ALL_M, "triton quant + aiter.gemm_a8w8_CK", fn)
        return self.prepared(lay, [strategy], spec, lay.w.device)


class RocmAiterBlockFp8(TritonBlockFp8):
    """Block fp8 W8A8 (128x128 weight blocks, 1x128 activation groups) on ``aiter.gemm_a8w8_blockscale``."""

    name = "rocm.aiter_block_fp8"
    short_name = "aiter_block_fp8"
    policy = ROCM
    description = "block fp8 W8A8: Triton per-token-group quantization, aiter.gemm_a8w8_blockscale"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        block = spec.scheme.block
        return check(
            _aiter(caps),
            (
                block in (None, (128, 128)),
                "128x128 weight blocks (AITER's block-scale GEMM)",
                {"block": block},
            ),
        ) and super().can_implement(spec, caps)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from quantrt.backends.triton import act_quant

        gemm = importlib.import_module("aiter").gemm_a8w8_blockscale
        lay = super().prepare(weight, spec).layout

        def fn(lay: Any, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
            xq, xs = act_quant.quantize_per_token_group(x, lay.block[1], fp8_dtype=lay.fp8, qmax=lay.qmax)
            return finish(gemm(xq, lay.w, xs, lay.w_scale, dtype=lay.out_dtype), bias, out, lay.out_dtype)

        strategy = Strategy(ALL_M, "triton group quant + aiter.gemm_a8w8_blockscale", fn)
        return self.prepared(lay, [strategy], spec, lay.w.device)
