"""The reference kernel: dequantize-then-matmul in fp32, on any device.

It is the oracle's arithmetic run as a kernel, so every scheme runs somewhere; dispatch
only falls back to it loudly (``QUANTRT_FALLBACK``) because it materialises the whole fp32
weight on every call.
"""

from __future__ import annotations

from typing import Any

import torch

from ..canonical import CanonicalWeight
from ..kernels import Kernel, Verdict
from ..specs import LayerSpec
from . import linear


class ReferenceKernel(Kernel):
    name = "reference"
    backend = "reference"
    device_kinds = ("cpu", "cuda", "rocm", "xpu")
    priority = 10_000
    description = "pure-torch dequantize-then-matmul in fp32 (the test oracle)"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        if spec.op != "linear":
            return Verdict.no("op == 'linear'", op=spec.op)
        return Verdict.yes()

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Any:
        return (weight, spec.out_dtype)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        # the fp32 weight and fp32 activations it materialises per call
        return 4 * (spec.N_part * spec.K_part + max_m * (spec.K_part + spec.N_part))

    def apply(
        self, state: Any, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight, out_dtype = state
        y = linear(x, weight, bias, out_dtype=out_dtype or x.dtype)
        if out is not None:
            out.copy_(y)
            return out
        return y
