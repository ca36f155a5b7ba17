"""FP8 weights (``fp8_e4m3`` -> float8_e4m3fn, ``fp8_e5m2`` -> float8_e5m2): RTN quantizer and dequant.

Canonical layout: ``qweight`` fp8 [N, K]; ``scales`` fp32 multipliers, tensor [S] (one per
output slice), channel [N, 1] or block (bn, bk) [ceil(N/bn), ceil(K/bk)], a ragged last block
keeping its own row/column. ``w[n, k] = float(q[n, k]) * s[...]``.
"""

from __future__ import annotations

import torch

from ..canonical import FP8_DTYPES, CanonicalWeight
from ..errors import ReferenceInputError
from ..schemes import Scheme
from .intq import check_weight, round_scale, slice_index


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def to_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Saturating round-to-nearest-even cast: values beyond the range become ±max, NaN stays NaN.

    Clamping first makes saturation explicit instead of relying on the cast's overflow rule.
    """
    m = fp8_max(dtype)
    return x.clamp(-m, m).to(dtype)


def _block_amax(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    N, K = w.shape
    nb, kb = -(-N // bn), -(-K // bk)
    padded = torch.nn.functional.pad(w.abs(), (0, kb * bk - K, 0, nb * bn - N))
    return padded.view(nb, bn, kb, bk).amax(dim=(1, 3))


def expand_blocks(s: torch.Tensor, N: int, K: int, bn: int, bk: int) -> torch.Tensor:
    """Block scales [ceil(N/bn), ceil(K/bk)] repeated to [N, K]; the ragged ends are cropped."""
    return s.repeat_interleave(bn, dim=0)[:N].repeat_interleave(bk, dim=1)[:, :K]


def _check_scheme(scheme: Scheme) -> None:
    if scheme.family != "fp8":
        raise ReferenceInputError(f"fp8 handles fp8 weights, not {scheme}")


def quantize(
    w: torch.Tensor,
    scheme: Scheme,
    *,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    calib: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Round-to-nearest fp8 quantization of an fp32 [N, K] weight into canonical tensors.

    ``s = amax / fmax`` per slice, row or block, rounded up to the scheme's scale dtype (so the
    extreme maps inside the fp8 range), ``s = 1`` where amax is 0; codes are the saturating
    cast of ``w / s``. ``g_idx`` must be None; ``calib`` is unused here.
    """
    _check_scheme(scheme)
    what = f"quantize {scheme}"
    N, K = check_weight(w, what)
    if g_idx is not None:
        raise ReferenceInputError(f"{what}: fp8 weights have no act-order g_idx")
    w = w.detach().to(torch.float32)
    dtype = FP8_DTYPES[scheme.weight]
    fmax = fp8_max(dtype)
    gran = scheme.granularity
    if gran == "tensor":
        rows = slice_index(tuple(output_sizes) or (N,), N, w.device)
        amax = torch.zeros(int(rows.max()) + 1, device=w.device).scatter_reduce(
            0, rows, w.abs().amax(dim=1), "amax", include_self=False
        )
    elif gran == "channel":
        amax = w.abs().amax(dim=1, keepdim=True)
    else:
        bn, bk = scheme.block  # type: ignore[misc]
        amax = _block_amax(w, bn, bk)
    s = round_scale(torch.where(amax > 0, amax.double() / fmax, torch.ones_like(amax)), scheme.scale_dtype)
    if gran == "tensor":
        s_full = s[rows][:, None]
    elif gran == "channel":
        s_full = s
    else:
        s_full = expand_blocks(s, N, K, bn, bk)
    return {"qweight": to_fp8(w / s_full, dtype), "scales": s.contiguous()}


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """fp32 [N, K] = float(q) * s; fp8 NaN codes (e4m3fn 0x7F/0xFF) come out as NaN."""
    scheme = weight.scheme
    _check_scheme(scheme)
    N, K = weight.N, weight.K
    where = f"dequantize {scheme}"
    q = weight["qweight"]
    dtype = FP8_DTYPES[scheme.weight]
    if q.dtype != dtype or tuple(q.shape) != (N, K):
        raise ReferenceInputError(
            f"{where}: qweight must be {dtype} [{N}, {K}], found {q.dtype} {list(q.shape)}"
        )
    s = weight["scales"].to(torch.float32)
    gran = scheme.granularity
    if gran == "tensor":
        S = len(weight.output_sizes)
        if tuple(s.shape) != (S,):
            raise ReferenceInputError(
                f"{where}: scales must have shape [{S}] (one per output slice), found {list(s.shape)}"
            )
        s_full = s[weight.slice_index().to(s.device)][:, None]
    elif gran == "channel":
        if tuple(s.shape) != (N, 1):
            raise ReferenceInputError(f"{where}: scales must have shape [{N}, 1], found {list(s.shape)}")
        s_full = s
    else:
        bn, bk = scheme.block  # type: ignore[misc]
        want = (-(-N // bn), -(-K // bk))
        if tuple(s.shape) != want:
            raise ReferenceInputError(
                f"{where}: block scales must have shape {list(want)}, found {list(s.shape)}"
            )
        s_full = expand_blocks(s, N, K, bn, bk)
    return q.to(torch.float32) * s_full
