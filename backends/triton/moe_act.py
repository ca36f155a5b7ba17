"""The gated activation between an expert's two projections in one Triton launch.

``h`` [A, 2I] holds the gate half then the up half (as :mod:`quantrt.moe.activation` defines them);
the result [A, I] is computed in fp32 and rounded once to ``h``'s dtype, as the torch version
computes it up to the fp32 rounding of exp/erf (which takes four launches: the fp32 copy, the
activation, the product and the cast). Kinds: silu, gelu (erf), gelu_tanh, swigluoai (gpt-oss: clamped, alpha and limit).
Nothing synchronises with the host, so a call captures into a CUDA graph.

:func:`gated_group_quant` fuses the activation with the per-token-group fp8 quantization a block-fp8
second projection takes (``PreparedExperts.activate_into``): the same codes and scales as the two
launches, without the activation's round trip through memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .act_quant import _TILE, _codes_args, _group_codes, _qmax, _warps, kernel_out
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
    y = _gate(g, u, alpha, limit, KIND)
    tl.store(Y + row * stride_ym + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gate(g, u, alpha, limit, KIND: tl.constexpr):
    """The gated activation of fp32 gate and up values, in fp32."""
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
    return y


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


@triton.jit
def _gated_group_quant_kernel(
    H, Q, S, inter, NG, stride_hm, alpha, limit, qmax,
    KIND: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, GB: tl.constexpr,
    HW_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    NAN: tl.constexpr, NEG_ZERO: tl.constexpr, QTY: tl.constexpr,
):  # fmt: skip
    """One row and GB groups of GROUP outputs per program: the activation rounded to h's dtype (the
    value the unfused path writes), then its group's amax, scale and fp8 codes as act_quant's
    per-group kernel makes them."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1) * GB + tl.arange(0, GB)
    j = tl.arange(0, GP)
    k = grp[:, None] * GROUP + j[None, :]
    mask = (j[None, :] < GROUP) & (k < inter)
    g = tl.load(H + row * stride_hm + k, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(H + row * stride_hm + inter + k, mask=mask, other=0.0).to(tl.float32)
    y = _gate(g, u, alpha, limit, KIND).to(H.dtype.element_ty).to(tl.float32)
    s, q = _group_codes(tl.where(mask, y, 0.0), qmax, HW_FP8, FMAX, MANT, EMIN, NAN, NEG_ZERO, QTY)
    tl.store(S + row * NG + grp, s, mask=grp < NG)
    tl.store(Q + row * inter + k, q, mask=mask)


_gated_group_quant_launch = Launcher(_gated_group_quant_kernel)


def gated_group_quant(
    h: torch.Tensor,
    kind: str,
    group: int,
    alpha: float = 1.702,
    limit: float = 7.0,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gated_activation` then ``act_quant.quantize_per_token_group`` in one launch: fp8 codes
    [A, I] and fp32 scales [A, ceil(I / group)], equal to the two launches' (the activation is rounded
    to h's dtype before it is quantized, as the unfused path stores it), without writing or reading
    the activation in between (the input of a block-fp8 second projection)."""
    if h.dim() != 2 or h.shape[1] % 2:
        raise ValueError(f"gated_group_quant: expected [A, 2I], found {list(h.shape)}")
    if kind not in KINDS:
        raise ValueError(f"gated_group_quant: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if group < 1:
        raise ValueError(f"gated_group_quant: group must be >= 1, found {group}")
    if h.stride(1) != 1:
        h = h.contiguous()
    A, inter = h.shape[0], h.shape[1] // 2
    q, meta = _codes_args(h[:, :inter], "fp8", fp8_dtype, "gated_group_quant")
    out = kernel_out(q, meta)
    meta = {k: v for k, v in meta.items() if k != "INT8"}
    ng = -(-inter // group)
    s = torch.empty(A, ng, dtype=torch.float32, device=h.device)
    if A == 0 or inter == 0:
        return q, s
    GP = next_power_of_2(group)
    GB = max(1, min(_TILE // GP, next_power_of_2(ng)))
    _gated_group_quant_launch((A, cdiv(ng, GB)),
        h, out, s, inter, ng, h.stride(0), float(alpha), float(limit), _qmax("fp8", None),
        KIND=KINDS[kind], GROUP=group, GP=GP, GB=GB, num_warps=_warps(GB * GP), **meta,
    )  # fmt: skip
    return q, s
