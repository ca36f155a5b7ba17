"""Integer weight-only layers on CPUs without AVX-512 BF16: one GEMV per ISA on cpu.native_wint's
prepared layout (wint.cpp's tiles of 16 rows), so every build shares one ``prepare``.

- ``cpu.avx2_wint``: ``native/csrc/wint_avx2.cpp`` built for x86-64-v3 (AVX2 + FMA + F16C): x86 CPUs
  without AVX-512 BF16, or ``QUANTRT_CPU_ISA=avx2``.
- ``cpu.neon_wint``: ``native/csrc/wint_neon.cpp`` built for the host (aarch64 with NEON).

Both decode each step once per 4 activation rows into exact fp32 codes and sum fp32 fused products,
scales and zero points per fold (the files say how).
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .native_common import GEMV, IsaGemv, run_linear
from .wint_native import WintLayout, can_run, prepare_wint


class GemvWint(IsaGemv):
    """int2/3/4/8 weight-only layers (symmetric or zero-point, group/channel/tensor scales, act-order)
    through one ISA's GEMV build: exact integer codes, fp32 fused products and sums, scales per fold."""

    scheme_verdict = staticmethod(can_run)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        fn = self.entry_point()
        layout = prepare_wint(weight, spec, fn)
        return self.prepared(layout, [Strategy(ALL_M, "gemv, 4 activation rows per pass", self.gemv)], spec)

    def gemv(
        self,
        layout: WintLayout,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None,
        ws: Any,
    ) -> torch.Tensor:
        """The fused decode-and-dot GEMV."""
        return run_linear(self.name, layout, x, bias, out, GEMV)


class Avx2Wint(GemvWint):
    name = "cpu.avx2_wint"
    description = "native AVX2 + FMA int2/3/4/8 weight-only GEMV (x86-64-v3 build), cpu.native_wint's layout"
    source, isa, entry, arch = "wint_avx2", "avx2", "quantrt_wint_avx2_linear", "x86"
    features = ("avx2", "fma", "f16c")


class NeonWint(GemvWint):
    name = "cpu.neon_wint"
    description = "native Arm NEON int2/3/4/8 weight-only GEMV, cpu.native_wint's layout"
    source, isa, entry, arch = "wint_neon", "native", "quantrt_wint_neon_linear", "aarch64"
    features = ("neon",)
