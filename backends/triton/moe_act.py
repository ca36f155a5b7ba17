"""The gated activation between an expert's two projections in one Triton launch.

``h`` [A, 2I] holds the gate half then the up half (as :mod:`quantrt.moe.activation` defines them);
the result [A, I] is computed in fp32 and rounded once to ``h``'s dtype, as the torch version
computes it up to the fp32 rounding of exp/erf (which takes four launches: the fp32 copy, the
activation, the product and the cast). Kinds: silu, gelu (erf), gelu_tanh, swigluoai (gpt-oss: clamped, alpha and limit).
Nothing synchronises with the host, so a call captures into a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import Launcher, cdiv, next_power_of_2

#: Activation.kind -> the kernel's KIND constexpr
KINDS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swigluoai": 3}


@triton.jit
def _gated_kernel(
    H, Y, inter, stride_hm, stride_ym, alpha, limit,
    KIND: tl.constexpr, BI: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BI + tl.arange(0, BI)
    mask = offs < inter
    g = tl.load(H + row * stride_hm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(H + row * stride_hm + inter + offs, mask=mask, other=0.0).to(tl.float32)
    if KIND == 0:
        y = g * tl.sigmoid(g) * u
    elif KIND == 1:
        y = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476)) * u
    elif KIND == 2:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh
        y = 0.5 * g * (1.0 + t) * u
    else:
        gc = tl.minimum(g, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        y = (uc + 1.0) * gc * tl.sigmoid(gc * alpha)
    tl.store(Y + row * stride_ym + offs, y.to(Y.dtype.element_ty), mask=mask)


_gated_launch = Launcher(_gated_kernel)


def gated_activation(h: torch.Tensor, kind: str, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """[A, 2I] (gate, up) -> [A, I] in h's dtype; h's rows may be strided, its columns contiguous."""
    if h.dim() != 2 or h.shape[1] % 2:
        raise ValueError(f"gated_activation: expected [A, 2I], found {list(h.shape)}")
    if kind not in KINDS:
        raise ValueError(f"gated_activation: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if h.stride(1) != 1:
        h = h.contiguous()
    A, inter = h.shape[0], h.shape[1] // 2
    y = torch.empty(A, inter, dtype=h.dtype, device=h.device)
    if A == 0 or inter == 0:
        return y
    BI = min(next_power_of_2(inter), 1024)
    _gated_launch(
        (A, cdiv(inter, BI)), h, y, inter, h.stride(0), y.stride(0), float(alpha), float(limit),
        KIND=KINDS[kind], BI=BI, num_warps=4,
    )  # fmt: skip
    return y
