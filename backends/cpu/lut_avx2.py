"""Code-book and float weight-only layers (NF4, bnb FP4, NVFP4, MXFP4, fp8 e4m3/e5m2, and the W8A8
fp8 schemes through their activation quantization) on x86 CPUs without AVX-512
(``native/csrc/lut_avx2.cpp``, built for x86-64-v3): AVX2 + FMA, fp32 products and sums.

They read cpu.native_lut's prepared layout, its descriptor extended by the fp32 code book and the fp8
format; one strategy, a GEMV that decodes each step once per 4 activation rows. Chosen where the CPU
lacks AVX-512 BF16 (an AVX2-only machine, or ``QUANTRT_CPU_ISA=avx2``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .lut_native import LutLayout, can_run, prepare_lut
from .native_common import CPU_DTYPES, GEMV, linear_library, run_linear

#: what the library is compiled for (x86-64-v3)
AVX2_FEATURES = ("avx2", "fma", "f16c")


def _library() -> ctypes.CDLL:
    return linear_library("lut_avx2", "avx2", "quantrt_lut_avx2_linear")


def gemv(
    layout: LutLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The fused decode-and-dot GEMV (after the scheme's fp8 activation quantization, if any)."""
    if layout.acts is not None:
        x = layout.acts.apply(x)
    return run_linear(Avx2Lut.name, layout, x, bias, out, GEMV)


class Avx2Lut(Kernel):
    """NF4/bnb FP4, fp8 e4m3/e5m2, NVFP4 and MXFP4 weight-only layers with AVX2 + FMA: codes decoded
    to their exact fp32 values, fp32 fused products and sums, block scales per fold."""

    name = "cpu.avx2_lut"
    act_dtypes = CPU_DTYPES
    description = "native AVX2 + FMA NF4/FP4/fp8/NVFP4/MXFP4 weight-only GEMV (x86-64-v3 build), cpu.native_lut's layout"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return can_run(spec, caps, AVX2_FEATURES)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = prepare_lut(weight, spec, _library().quantrt_lut_avx2_linear, avx2=True)
        pre = ""
        if layout.acts is not None:
            pre = f"fp8 activations ({layout.acts.granularity}) quantized as the scheme says, fp32 math + "
        return self.prepared(layout, [Strategy(ALL_M, pre + "gemv, 4 activation rows per pass", gemv)], spec)
