"""Integer weights (weight ``int``, 2/3/4/8 bits): round-to-nearest quantizer and reference dequant.

Canonical layout (see :mod:`quantrt.canonical`): ``qweight`` uint8 bit stream of unsigned codes
along K, ``scales`` fp32 (tensor [S] | channel [N, 1] | group [N, K/G]), ``zeros`` int16 of the
same shape when asymmetric, ``g_idx`` int32 [K] with act-order. The reference computes

    w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)],   g(k) = g_idx[k] if present else k // G

in fp32: ``q - z`` is an exact small integer, so the only rounding is the one product.
"""

from __future__ import annotations

import torch

from ..canonical import CanonicalWeight
from ..errors import ReferenceInputError
from ..packing import pack_codes, unpack_codes
from ..schemes import Scheme

_SCALE_TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def round_scale(s: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """Round positive scales up to the next value of ``scale_dtype``; returned as fp32.

    Pass the exact ratio (``amax / qmax`` in float64). Rounding up, not to nearest, keeps
    ``amax / s`` inside the code range, so no group's extreme is clipped by a scale that
    rounding made slightly too small and every element keeps the bound ``|w - dq| <= s/2``.
    The cost is under one ulp of the scale dtype.
    """
    if scale_dtype not in _SCALE_TORCH:
        raise ReferenceInputError(f"scales are stored as fp32, fp16 or bf16 here, found {scale_dtype!r}")
    dt = _SCALE_TORCH[scale_dtype]
    s = s.to(torch.float64)
    r = s.to(dt)
    r = torch.where(r.to(torch.float64) < s, torch.nextafter(r, torch.full_like(r, float("inf"))), r)
    out = r.to(torch.float32)
    if not bool(torch.isfinite(out).all()):
        raise ReferenceInputError(f"a scale of {float(s.max()):.6g} does not fit in {scale_dtype}")
    return out


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in a floating tensor: NaN and infinities reach the extremes, so one
    ``aminmax`` pass (no temporaries; an ``isfinite`` pass writes a mask as large as ``t``) says."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.reshape(-1))
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_weight(w: torch.Tensor, what: str) -> tuple[int, int]:
    """Shape and value checks shared by the RTN quantizers: a finite, floating, 2-D [N, K] weight."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        shape = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ReferenceInputError(f"{what}: expected a 2-D [N, K] weight, found {shape}")
    if not w.is_floating_point():
        raise ReferenceInputError(f"{what}: expected a floating-point weight, found {w.dtype}")
    N, K = w.shape
    if N == 0 or K == 0:
        raise ReferenceInputError(f"{what}: empty weight of shape [{N}, {K}]")
    if not all_finite(w):
        raise ReferenceInputError(f"{what}: the weight holds NaN or infinite values")
    return N, K


def slice_index(output_sizes: tuple[int, ...], N: int, device: torch.device) -> torch.Tensor:
    """For each output row, the fused slice it belongs to ([N] int64); checks the sizes add up."""
    if not output_sizes or any(s <= 0 for s in output_sizes) or sum(output_sizes) != N:
        raise ReferenceInputError(f"output_sizes {tuple(output_sizes)} must be positive and add up to N={N}")
    sizes = torch.tensor(output_sizes, device=device)
    return torch.repeat_interleave(torch.arange(len(output_sizes), device=device), sizes)


def _reduce(w: torch.Tensor, index: torch.Tensor, count: int, dim: int, op: str) -> torch.Tensor:
    """Max or min of ``w`` over positions sharing an index along ``dim``; empty groups give 0."""
    shape = list(w.shape)
    shape[dim] = count
    out = torch.zeros(shape, dtype=w.dtype, device=w.device)
    idx = index.view([-1 if d == dim else 1 for d in range(w.dim())]).expand_as(w)
    return out.scatter_reduce(dim, idx, w, op, include_self=False)


def build_g_idx(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """An act-order group index: channels sorted by descending column norm, G per group.

    A stand-in for GPTQ's Hessian order (which needs calibration data): it yields a
    non-contiguous g_idx with the same structure, so act-order paths get real permutations.
    """
    K = w.shape[1]
    order = torch.argsort(torch.linalg.vector_norm(w, dim=0), descending=True, stable=True)
    g_idx = torch.empty(K, dtype=torch.int32, device=w.device)
    g_idx[order] = (torch.arange(K, device=w.device) // group_size).to(torch.int32)
    return g_idx


def check_g_idx(g_idx: torch.Tensor, K: int, num_groups: int, what: str) -> torch.Tensor:
    """Validate an act-order group index (length K, integer, values in [0, num_groups)) -> int64."""
    if not isinstance(g_idx, torch.Tensor) or g_idx.dim() != 1 or g_idx.shape[0] != K:
        shape = list(g_idx.shape) if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ReferenceInputError(
            f"{what}: g_idx must have shape [{K}] (one group per input channel), found {shape}"
        )
    if g_idx.is_floating_point() or g_idx.is_complex() or g_idx.dtype == torch.bool:
        raise ReferenceInputError(f"{what}: g_idx must be an integer tensor, found {g_idx.dtype}")
    g = g_idx.to(torch.int64)
    lo, hi = int(g.min()), int(g.max())
    if lo < 0 or hi >= num_groups:
        raise ReferenceInputError(
            f"{what}: g_idx values must lie in [0, {num_groups - 1}], found [{lo}, {hi}]"
        )
    return g


#: range factors the mse search tries, 1 first (GPTQ's grid of 100 over its first 20 % of shrink)
SEARCH_GRID = tuple(1 - i / 100 for i in range(21))


def _scale_zero(
    wmax: torch.Tensor, wmin: torch.Tensor, scheme: Scheme
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales (rounded up to the scale dtype) and zero points (asymmetric) for these ranges."""
    b = scheme.bits
    if scheme.symmetric:
        half = 1 << (b - 1)
        amax = torch.maximum(wmax.abs(), wmin.abs())
        s = round_scale(
            torch.where(amax > 0, amax.double() / (half - 1), torch.ones_like(amax)), scheme.scale_dtype
        )
        return s, None
    qmax = (1 << b) - 1
    lo = wmin.clamp(max=0.0)
    hi = wmax.clamp(min=0.0)
    span = hi - lo
    s = round_scale(torch.where(span > 0, span.double() / qmax, torch.ones_like(span)), scheme.scale_dtype)
    return s, torch.round(-lo / s).clamp(0, qmax)


def _round_trip(w3: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, bits: int) -> torch.Tensor:
    """fp32 [N, ng, G] weights through codes and back, with per-group s, z [N, ng]."""
    s3 = s[..., None]
    if z is None:
        half = 1 << (bits - 1)
        return torch.round(w3 / s3).clamp(1 - half, half - 1) * s3
    z3 = z[..., None]
    return ((torch.round(w3 / s3) + z3).clamp(0, (1 << bits) - 1) - z3) * s3


def _search_range(
    w3: torch.Tensor, wmax: torch.Tensor, wmin: torch.Tensor, scheme: Scheme
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group [N, ng], the range shrunk by the SEARCH_GRID factor of least squared error."""
    best_err = torch.full_like(wmax, float("inf"))
    best = torch.ones_like(wmax)
    for p in SEARCH_GRID:
        s, z = _scale_zero(wmax * p, wmin * p, scheme)
        err = (_round_trip(w3, s, z, scheme.bits) - w3).square().sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, p), best)
    return wmax * best, wmin * best


def _check_scheme(scheme: Scheme) -> None:
    if scheme.family != "int":
        raise ReferenceInputError(f"intq handles integer weights, not {scheme}")


def quantize(
    w: torch.Tensor,
    scheme: Scheme,
    *,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    calib: torch.Tensor | None = None,
    search: str | None = None,
) -> dict[str, torch.Tensor]:
    """Round-to-nearest integer quantization of an fp32 [N, K] weight into canonical tensors.

    Symmetric: ``s = amax / (2^(b-1) - 1)``, codes ``round(w/s) + 2^(b-1)`` in [1, 2^b - 1].
    Asymmetric: the range is widened to hold 0, ``s = (max - min) / (2^b - 1)``,
    ``z = round(-min / s)``, codes ``round(w/s) + z`` in [0, 2^b - 1]. Scales are rounded to the
    scheme's scale dtype before the codes are computed, so the codes match the stored scales.
    A group whose range is zero gets ``s = 1``. ``calib`` is unused (static activation scales
    are made by :func:`quantrt.reference.activations.static_input_scales`).

    ``search="mse"`` (group and channel scales, no act-order): each group's range is first shrunk
    by the factor of :data:`SEARCH_GRID` whose round trip has the least squared error, as GPTQ's
    ``mse`` quantizer and llama.cpp's scale search do: clipping a few outliers buys a finer step
    for the rest. Factor 1 is tried first, so no group ends worse than plain round to nearest.
    """
    _check_scheme(scheme)
    what = f"quantize {scheme}"
    N, K = check_weight(w, what)
    w = w.detach().to(torch.float32)
    b = scheme.bits
    qmax = (1 << b) - 1
    gran = scheme.granularity
    if g_idx is not None and not scheme.act_order:
        raise ReferenceInputError(f"{what}: g_idx was given but the scheme has no act-order")

    gid: torch.Tensor | None = None
    if gran == "tensor":
        rows = slice_index(tuple(output_sizes) or (N,), N, w.device)
        S = int(rows.max()) + 1
        wmax = _reduce(w.amax(dim=1), rows, S, 0, "amax")
        wmin = _reduce(w.amin(dim=1), rows, S, 0, "amin")
    elif gran == "channel":
        wmax, wmin = w.amax(dim=1, keepdim=True), w.amin(dim=1, keepdim=True)
    else:
        G = scheme.group_size
        assert G is not None
        if K % G:
            raise ReferenceInputError(f"{what}: K={K} is not divisible by the group size G={G}")
        ng = K // G
        if scheme.act_order:
            gid = build_g_idx(w, G).to(torch.int64) if g_idx is None else check_g_idx(g_idx, K, ng, what)
            wmax = _reduce(w, gid, ng, 1, "amax")
            wmin = _reduce(w, gid, ng, 1, "amin")
        else:
            gid = torch.arange(K, device=w.device) // G
            wg = w.reshape(N, ng, G)
            wmax, wmin = wg.amax(dim=2), wg.amin(dim=2)

    if search is not None:
        if search != "mse":
            raise ReferenceInputError(f"{what}: search={search!r}: the search offered is 'mse'")
        if gran not in ("group", "channel") or scheme.act_order:
            raise ReferenceInputError(
                f"{what}: the mse search covers group and channel scales without act-order"
            )
        G = K if gran == "channel" else scheme.group_size
        assert G is not None
        wmax, wmin = _search_range(w.reshape(N, K // G, G), wmax.reshape(N, -1), wmin.reshape(N, -1), scheme)
        wmax, wmin = (wmax, wmin) if gran == "group" else (wmax.reshape(N, 1), wmin.reshape(N, 1))
    s, z = _scale_zero(wmax, wmin, scheme)

    if gran == "tensor":
        s_full, z_full = s[rows][:, None], (z[rows][:, None] if z is not None else None)
    elif gran == "channel":
        s_full, z_full = s, z
    else:
        assert gid is not None
        s_full, z_full = s[:, gid], (z[:, gid] if z is not None else None)

    if z_full is None:
        half = 1 << (b - 1)
        q = (torch.round(w / s_full).clamp(1 - half, half - 1) + half).to(torch.uint8)
    else:
        q = (torch.round(w / s_full) + z_full).clamp(0, qmax).to(torch.uint8)

    out = {"qweight": pack_codes(q, b), "scales": s.contiguous()}
    if z is not None:
        out["zeros"] = z.to(torch.int16).contiguous()
    if scheme.act_order:
        assert gid is not None
        out["g_idx"] = gid.to(torch.int32)
    return out


def _expand(t: torch.Tensor, weight: CanonicalWeight, name: str, gid: torch.Tensor | None) -> torch.Tensor:
    """Scales or zeros broadcast to [N, K] (tensor, group) or [N, 1] (channel), with shape checks."""
    N = weight.N
    gran = weight.scheme.granularity
    where = f"dequantize {weight.scheme}: {name}"
    if gran == "tensor":
        S = len(weight.output_sizes)
        if tuple(t.shape) != (S,):
            raise ReferenceInputError(
                f"{where} must have shape [{S}] (one per output slice), found {list(t.shape)}"
            )
        return t[weight.slice_index().to(t.device)][:, None]
    if gran == "channel":
        if tuple(t.shape) != (N, 1):
            raise ReferenceInputError(f"{where} must have shape [{N}, 1], found {list(t.shape)}")
        return t
    assert gid is not None
    return t[:, gid]


def _group_index(weight: CanonicalWeight) -> torch.Tensor:
    """The scale column of every input channel: g_idx when present, else k // G; checked against scales."""
    where = f"dequantize {weight.scheme}"
    N, K, G = weight.N, weight.K, weight.scheme.group_size
    scales = weight["scales"]
    if scales.dim() != 2 or scales.shape[0] != N:
        raise ReferenceInputError(
            f"{where}: scales must have shape [{N}, num_groups], found {list(scales.shape)}"
        )
    ng = scales.shape[1]
    g = weight.get("g_idx")
    if g is not None:
        return check_g_idx(g, K, ng, where).to(scales.device)
    assert G is not None
    if -(-K // G) > ng:
        raise ReferenceInputError(
            f"{where}: K={K} in groups of {G} needs {-(-K // G)} scale columns, found {ng}"
        )
    return torch.arange(K, device=scales.device) // G


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """fp32 [N, K] from canonical integer tensors: ``(q - z[g]) * s[g]``.

    Zeros are read as stored, so GPTQ v1's ``2^b`` (stored ``2^b - 1`` plus one) gives codes
    below the usual range, as vLLM's kernels do. Under row-parallel act-order a rank holds
    ``K_part`` columns with global ``g_idx`` values and the full scales; the rule is unchanged.
    Scales are not assumed positive (auto-round writes negative symmetric scales).
    """
    scheme = weight.scheme
    _check_scheme(scheme)
    N, K, b = weight.N, weight.K, scheme.bits
    where = f"dequantize {scheme}"
    qw = weight["qweight"]
    nbytes = -(-K * b // 8)
    if qw.dtype != torch.uint8 or tuple(qw.shape) != (N, nbytes):
        raise ReferenceInputError(
            f"{where}: qweight must be uint8 [{N}, {nbytes}] ({K} codes of {b} bits per row), "
            f"found {qw.dtype} {list(qw.shape)}"
        )
    q = unpack_codes(qw, b, K).to(torch.float32)
    gid = _group_index(weight) if scheme.granularity == "group" else None
    s = _expand(weight["scales"].to(torch.float32), weight, "scales", gid)
    if scheme.symmetric:
        z: torch.Tensor | float = float(1 << (b - 1))
    else:
        zt = weight.get("zeros")
        if zt is None:
            raise ReferenceInputError(f"{where}: asymmetric weights need a zeros tensor")
        if tuple(zt.shape) != tuple(weight["scales"].shape):
            raise ReferenceInputError(
                f"{where}: zeros shape {list(zt.shape)} differs from scales shape "
                f"{list(weight['scales'].shape)}"
            )
        z = _expand(zt.to(torch.float32), weight, "zeros", gid)
    return (q - z) * s
