"""Integer weight-only layers on x86 CPUs without AVX-512 (``native/csrc/wint_avx2.cpp``, built for
x86-64-v3): AVX2 + FMA, fp32 products and sums.

They read cpu.native_wint's prepared layout (wint.cpp's tiles of 16 rows), so the two builds share
one ``prepare``; this one has a single strategy, a GEMV that decodes each step once per 4 activation
rows. Chosen where the CPU lacks AVX-512 BF16 (an AVX2-only machine, or ``QUANTRT_CPU_ISA=avx2``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .native_common import CPU_DTYPES, GEMV, linear_library, run_linear
from .wint_native import WintLayout, can_run, prepare_wint

#: what the library is compiled for (x86-64-v3)
AVX2_FEATURES = ("avx2", "fma", "f16c")


def _library() -> ctypes.CDLL:
    return linear_library("wint_avx2", "avx2", "quantrt_wint_avx2_linear")


def gemv(
    layout: WintLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The fused decode-and-dot GEMV, 4 activation rows per pass over the codes."""
    return run_linear(Avx2Wint.name, layout, x, bias, out, GEMV)


class Avx2Wint(Kernel):
    """int2/3/4/8 weight-only layers (symmetric or zero-point, group/channel/tensor scales, act-order)
    with AVX2 + FMA: exact integer codes, fp32 fused products and sums, scales per fold."""

    name = "cpu.avx2_wint"
    act_dtypes = CPU_DTYPES
    description = "native AVX2 + FMA int2/3/4/8 weight-only GEMV (x86-64-v3 build), cpu.native_wint's layout"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return can_run(spec, caps, AVX2_FEATURES)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = prepare_wint(weight, spec, _library().quantrt_wint_avx2_linear)
        return self.prepared(layout, [Strategy(ALL_M, "gemv, 4 activation rows per pass", gemv)], spec)
