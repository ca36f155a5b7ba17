"""Reference numerics for the FP4 families: NVFP4 and OCP MXFP4 (canonical layouts in ``quantrt.canonical``).

Both store e2m1 codes two per byte along K, low nibble = even element. They differ in the block
scale: NVFP4 has an e4m3 scale per 16 elements times an fp32 global multiplier per output slice,
MXFP4 a bare power-of-two (e8m0) scale per 32 elements.

Rounding decisions, stated once because kernels and tests rely on them:

* e2m1: round to nearest, ties to even (the code with an even mantissa bit), saturating at ±6;
  the sign bit follows the input's, so a small negative input becomes -0 (code 0x8).
* NVFP4 (RTN, ModelOpt's recipe in multiplier form): ``global = amax(slice) / (448 * 6)``
  (1.0 when that is 0 in fp32: any positive value dequantizes zeros to zero, 1.0 keeps its
  reciprocal finite); ``s = e4m3(amax(block) / (6 * global))`` saturating at 448;
  ``codes = e2m1(w / (s * global))``, all zero where ``s == 0``.
* MXFP4 (OCP MX v1.0): ``E = clamp(floor(log2(amax(block))) - 2 + 127, 0, 254)`` (2 is e2m1's
  largest exponent), so ``w / 2^(E-127)`` lies in [4, 8) and the top of the block saturates at 6;
  an all-zero block gets ``E = 0`` and zero codes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..canonical import E2M1_VALUES, CanonicalWeight, unpack_fp4
from ..errors import ReferenceInputError
from ..schemes import Scheme
from .intq import all_finite

#: e2m1 value of each 4-bit code: bit 3 is the sign, bits 0-2 index the magnitudes; 0x8 is -0.
E2M1_MAX = 6.0
E2M1_EMAX = 2
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
#: fp32 multiplier that maps a tensor amax onto the top of e4m3 x e2m1: amax / (448 * 6)
_NVFP4_RANGE = E4M3_MAX * E2M1_MAX

# Midpoints between neighbouring e2m1 magnitudes. bucketize(right=False) sends a tie down, which is
# the even code except at these three midpoints, whose upper neighbour (1.0, 2.0, 4.0) is even.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIES_UP = (0.75, 1.75, 3.5)


# -- element and scale encodings -------------------------------------------------------------------


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8, one per element) of ``x``: round-to-nearest-even, saturating at ±6."""
    x = x.to(torch.float32)
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(mag, torch.tensor(_E2M1_MIDPOINTS, device=x.device))
    idx = (idx + torch.isin(mag, torch.tensor(_E2M1_TIES_UP, device=x.device))).to(torch.uint8)
    return idx | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of e2m1 codes (uint8 0..15, one per element)."""
    return E2M1_VALUES.to(codes.device)[codes.long()]


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded onto the e2m1 grid (nearest, ties to even, saturating at ±6), as fp32."""
    return e2m1_decode(e2m1_encode(x))


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim, low nibble = even element (NVFP4/OCP order)."""
    if codes.shape[-1] % 2:
        raise ReferenceInputError(
            f"fp4 packing needs an even last dimension, found shape {list(codes.shape)}"
        )
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def e8m0_decode(exponents: torch.Tensor) -> torch.Tensor:
    """``2^(E - 127)`` for e8m0 bytes, built from fp32 bits so every value is exact; E = 255 is NaN.

    E = 0 gives 2^-127, an fp32 subnormal (exp2 could flush it); E = 254 gives 2^127.
    """
    if exponents.dtype != torch.uint8:
        raise ReferenceInputError(f"e8m0 scales must be uint8, found {exponents.dtype}")
    e = exponents.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    return torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits).view(torch.float32)


def e4m3_scale(x: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 scales to float8_e4m3fn, round-to-nearest-even, saturating at 448."""
    return x.to(torch.float32).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


# -- NVFP4 -----------------------------------------------------------------------------------------


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """The fp32 global multiplier for a tensor amax: ``amax / (448 * 6)``, 1.0 where that is 0."""
    g = amax.to(torch.float32) / _NVFP4_RANGE
    return torch.where(g > 0, g, torch.ones_like(g))


def _nvfp4_blocks(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 block scales [..., B] and e2m1 codes [..., B, 16] of x [..., B, 16]; g broadcasts to [..., B]."""
    s = e4m3_scale(x.abs().amax(dim=-1) / (6.0 * g))
    step = (s.float() * g).unsqueeze(-1)
    scaled = torch.where(step > 0, x / step, torch.zeros_like(x))
    return s, e2m1_encode(scaled)


def _nvfp4_quantize(
    w: torch.Tensor, scheme: Scheme, output_sizes: tuple[int, ...], calib: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    N, K = w.shape
    slice_amax = torch.stack(
        [
            part.abs().amax() if part.numel() else w.new_zeros(())
            for part in w.split(list(output_sizes), dim=0)
        ]
    )
    global_scale = nvfp4_global_scale(slice_amax)
    sizes = torch.tensor(output_sizes, device=w.device)
    g_row = global_scale.repeat_interleave(sizes).view(N, 1)
    scales, codes = _nvfp4_blocks(w.view(N, K // NVFP4_BLOCK, NVFP4_BLOCK), g_row)
    out = {"qweight": pack_fp4(codes.view(N, K)), "scales": scales, "global_scale": global_scale}
    if scheme.act == "nvfp4":
        if calib is None:
            raise ReferenceInputError(
                f"{scheme.name} quantizes activations: quantize() needs calib activations [M, K={K}] "
                "to set input_global_scale"
            )
        if calib.dim() < 1 or calib.shape[-1] != K or calib.numel() == 0:
            raise ReferenceInputError(f"calib must be non-empty [M, K={K}], found shape {list(calib.shape)}")
        c = calib.detach().to(device=w.device, dtype=torch.float32)
        if not torch.isfinite(c).all():
            raise ReferenceInputError("calib activations contain NaN or Inf")
        out["input_global_scale"] = nvfp4_global_scale(c.abs().amax()).reshape(1)
    return out


def fake_quantize_nvfp4_activations(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """Activations [..., K] as an NVFP4 W4A4 kernel sees them, dequantized to fp32.

    Per row, per 16 channels: ``sb = e4m3(amax / (6 g))``, ``x̂ = e2m1(x / (sb g)) * sb * g`` with
    ``g = input_global_scale``; a ragged last group is quantized on its own, an all-zero group is 0.
    """
    g = input_global_scale.to(device=x.device, dtype=torch.float32).reshape(-1)
    if g.numel() != 1 or not bool(torch.isfinite(g).all() and (g > 0).all()):
        raise ReferenceInputError(f"input_global_scale must be one positive finite value, found {g.tolist()}")
    x = x.to(torch.float32)
    K = x.shape[-1]
    xp = F.pad(x, (0, -K % NVFP4_BLOCK)).unflatten(-1, (-1, NVFP4_BLOCK))
    sb, codes = _nvfp4_blocks(xp, g)
    xq = e2m1_decode(codes) * sb.float().unsqueeze(-1) * g
    return xq.flatten(-2)[..., :K]


def _nvfp4_dequantize(weight: CanonicalWeight) -> torch.Tensor:
    N, K = weight.N, weight.K
    S = len(weight.output_sizes)
    q = _expect(weight, "qweight", (N, K // 2), torch.uint8)
    s = _expect(weight, "scales", (N, K // NVFP4_BLOCK), torch.float8_e4m3fn)
    g = _expect(weight, "global_scale", (S,), torch.float32)
    v = e2m1_decode(unpack_fp4(q)).view(N, K // NVFP4_BLOCK, NVFP4_BLOCK)
    g_row = g[weight.slice_index().to(g.device)].view(N, 1, 1)
    return (v * s.float().unsqueeze(-1) * g_row).view(N, K)


# -- MXFP4 -----------------------------------------------------------------------------------------


def mxfp4_exponents(amax: torch.Tensor) -> torch.Tensor:
    """OCP shared exponents (uint8 e8m0) for block amaxes: floor(log2(amax)) - 2 + 127, clamped to 0..254.

    frexp gives floor(log2) exactly (subnormals included); an all-zero block gets E = 0.
    """
    _, exp = torch.frexp(amax.to(torch.float32))
    e = (exp.to(torch.int32) - 1 - E2M1_EMAX + 127).clamp(0, 254)
    return torch.where(amax > 0, e, torch.zeros_like(e)).to(torch.uint8)


def _mxfp4_quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    N, K = w.shape
    blocks = w.view(N, K // MXFP4_BLOCK, MXFP4_BLOCK)
    e = mxfp4_exponents(blocks.abs().amax(dim=-1))
    codes = e2m1_encode(blocks / e8m0_decode(e).unsqueeze(-1))
    return {"qweight": pack_fp4(codes.view(N, K)), "scales": e}


def _mxfp4_dequantize(weight: CanonicalWeight) -> torch.Tensor:
    N, K = weight.N, weight.K
    q = _expect(weight, "qweight", (N, K // 2), torch.uint8)
    e = _expect(weight, "scales", (N, K // MXFP4_BLOCK), torch.uint8)
    v = e2m1_decode(unpack_fp4(q)).view(N, K // MXFP4_BLOCK, MXFP4_BLOCK)
    return (v * e8m0_decode(e).unsqueeze(-1)).view(N, K)


# -- module contract -------------------------------------------------------------------------------


def _block(scheme: Scheme) -> int:
    if scheme.family == "nvfp4":
        return NVFP4_BLOCK
    if scheme.family == "mxfp4":
        return MXFP4_BLOCK
    raise ReferenceInputError(
        f"the fp4 reference serves nvfp4 and mxfp4, not {scheme.name} (family {scheme.family})"
    )


def _expect(weight: CanonicalWeight, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    t = weight.get(name)
    fam = weight.scheme.family
    if t is None:
        raise ReferenceInputError(
            f"{fam} weight [N={weight.N}, K={weight.K}] is missing canonical tensor "
            f"{name!r} (has {sorted(weight.tensors)})"
        )
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ReferenceInputError(
            f"{fam} canonical tensor {name!r} of a [N={weight.N}, K={weight.K}] weight: "
            f"expected {dtype} {list(shape)}, found {t.dtype} {list(t.shape)}"
        )
    return t


def check_weight(w: torch.Tensor, scheme: Scheme, block: int) -> torch.Tensor:
    """Validate a dense weight for a block quantizer and return it as fp32 (shared with the bnb reference)."""
    if w.dim() != 2:
        raise ReferenceInputError(f"{scheme.name}: expected a 2-D [N, K] weight, found shape {list(w.shape)}")
    if w.shape[1] % block:
        raise ReferenceInputError(
            f"{scheme.name}: K={w.shape[1]} is not a multiple of the block size {block}"
        )
    w = w.detach().to(torch.float32).contiguous()
    if not all_finite(w):
        raise ReferenceInputError(f"{scheme.name}: the weight contains NaN or Inf")
    return w


def quantize(
    w: torch.Tensor,
    scheme: Scheme,
    *,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    calib: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Round-to-nearest NVFP4 or MXFP4 quantization of fp32 [N, K] into canonical tensors.

    ``output_sizes`` sets one NVFP4 global scale per fused slice; ``calib`` [M, K] is required for
    W4A4 (``input_global_scale``) and ignored otherwise.
    """
    block = _block(scheme)
    w = check_weight(w, scheme, block)
    if g_idx is not None:
        raise ReferenceInputError(f"{scheme.name}: g_idx (act-order) applies to integer schemes only")
    sizes = tuple(output_sizes) or (w.shape[0],)
    if sum(sizes) != w.shape[0]:
        raise ReferenceInputError(f"output_sizes {sizes} do not add up to N={w.shape[0]}")
    if scheme.family == "nvfp4":
        return _nvfp4_quantize(w, scheme, sizes, calib)
    return _mxfp4_quantize(w)


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """The fp32 [N, K] weight that NVFP4 or MXFP4 canonical tensors stand for."""
    block = _block(weight.scheme)
    if weight.K % block:
        raise ReferenceInputError(
            f"{weight.scheme.name}: K={weight.K} is not a multiple of the block size {block}"
        )
    if weight.scheme.family == "nvfp4":
        return _nvfp4_dequantize(weight)
    return _mxfp4_dequantize(weight)
