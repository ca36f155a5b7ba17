"""Code-book and float weight-only layers (NF4, bnb FP4, NVFP4, MXFP4, fp8 e4m3/e5m2, and the W8A8 fp8
schemes through their activation quantization) on CPUs without AVX-512 BF16: one GEMV per ISA on
cpu.native_lut's prepared layout, its descriptor extended by the fp32 code book and the fp8 format.

- ``cpu.avx2_lut``: ``native/csrc/lut_avx2.cpp`` built for x86-64-v3 (AVX2 + FMA + F16C).
- ``cpu.neon_lut``: ``native/csrc/lut_neon.cpp`` built for the host (aarch64 with NEON).

Both decode each step once per 4 activation rows into exact fp32 values and sum fp32 fused products,
block scales per fold (the files say how).
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .lut_native import LutLayout, can_run, prepare_lut
from .native_common import GEMV, IsaGemv, run_linear


class GemvLut(IsaGemv):
    """NF4/bnb FP4, fp8 e4m3/e5m2, NVFP4 and MXFP4 weight-only layers through one ISA's GEMV build:
    codes decoded to their exact fp32 values, fp32 fused products and sums, block scales per fold."""

    scheme_verdict = staticmethod(can_run)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        fn = self.entry_point()
        layout = prepare_lut(weight, spec, fn, gemv=True)
        pre = ""
        if layout.acts is not None:
            pre = f"fp8 activations ({layout.acts.granularity}) quantized as the scheme says, fp32 math + "
        return self.prepared(
            layout, [Strategy(ALL_M, pre + "gemv, 4 activation rows per pass", self.gemv)], spec
        )

    def gemv(
        self, layout: LutLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
    ) -> torch.Tensor:
        """The fused decode-and-dot GEMV (after the scheme's fp8 activation quantization, if any)."""
        if layout.acts is not None:
            x = layout.acts.apply(x)
        return run_linear(self.name, layout, x, bias, out, GEMV)


class Avx2Lut(GemvLut):
    name = "cpu.avx2_lut"
    description = "native AVX2 + FMA NF4/FP4/fp8/NVFP4/MXFP4 weight-only GEMV (x86-64-v3 build), cpu.native_lut's layout"
    source, isa, entry, arch = "lut_avx2", "avx2", "quantrt_lut_avx2_linear", "x86"
    features = ("avx2", "fma", "f16c")


class NeonLut(GemvLut):
    name = "cpu.neon_lut"
    description = "native Arm NEON NF4/FP4/fp8/NVFP4/MXFP4 weight-only GEMV, cpu.native_lut's layout"
    source, isa, entry, arch = "lut_neon", "native", "quantrt_lut_neon_linear", "aarch64"
    features = ("neon",)
