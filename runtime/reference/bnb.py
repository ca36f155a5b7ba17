"""Reference numerics for bitsandbytes 4-bit (NF4 and bnb FP4, optionally with double quant).

The canonical layout is bitsandbytes' own (see ``quantrt.canonical``): the weight is flattened
row-major and cut into blocks of G elements (a ragged last block has its own absmax), codes are
packed two per byte with the HIGH nibble holding the even element, and ``w = code[q] * absmax``.

Rounding decisions of the RTN quantizer:

* ``absmax = max |w|`` per block; ``q`` = the code book entry nearest to ``w / absmax`` (a true
  fp32 division). A tie (``w / absmax`` exactly on the fp32 midpoint of two neighbouring entries)
  goes to the LOWER value, as in bitsandbytes' torch backend (``torch.bucketize`` on midpoints) and
  its CUDA NF4 decision tree (its CUDA FP4 tree sends negative ties toward zero instead). Of equal
  entries (FP4's two zeros) the first is used, so zero is always code 0 in FP4. An all-zero block
  stores absmax 0 and the code of 0. On random weights this reproduced bitsandbytes 0.50.2's CPU
  ``quantize_4bit`` (with and without ``compress_statistics``) bit for bit after dequantization.
* Double quant, as ``bitsandbytes.functional.quantize_4bit(compress_statistics=True)``:
  ``offset = mean(absmax)``; ``absmax - offset`` is quantized in blocks of 256 with the signed
  8-bit dynamic map, ``nested_absmax = max |absmax - offset|`` per nested block, codes by the same
  nearest/ties-down rule. Dequantization is ``nested_code[c] * nested_absmax[i // 256] + offset``
  in fp32, in that order.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..canonical import NESTED_BLOCK, CanonicalWeight, dequantize_absmax, unpack_bnb4
from ..errors import ReferenceInputError
from ..schemes import Scheme
from .fp4 import check_weight

#: NF4 code book (bitsandbytes ``get_4bit_type("nf4")``, QLoRA's normal-float quantiles).
# fmt: off
NF4_CODE = torch.tensor(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    dtype=torch.float32,
)
# fmt: on
#: bitsandbytes' own FP4 code book (sign-magnitude, not e2m1), normalised by its max 12 in fp32. Entry 8
#: is +0.0: bitsandbytes lists it as the integer ``-0`` (``get_4bit_type("fp4")``), so its stored
#: ``quant_map`` has +0.0 there, and this table matches it bit for bit.
FP4_BNB_CODE = (
    torch.tensor(
        [0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0]
    )
    / 12.0
)
#: absmax values per nested block of double quant (bitsandbytes' ``nested_blocksize``)


def code_table(weight: str) -> torch.Tensor:
    """The 16-entry fp32 code book of a bnb 4-bit weight type (``nf4`` or ``fp4_bnb``)."""
    if weight == "nf4":
        return NF4_CODE.clone()
    if weight == "fp4_bnb":
        return FP4_BNB_CODE.clone()
    raise ReferenceInputError(f"bitsandbytes 4-bit weights are nf4 or fp4_bnb, found {weight!r}")


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map, ``create_dynamic_map(signed=True)``, fp32 [256] sorted.

    For exponent step i = 0..6 the decade [10^(i-6), 10^(i-5)) holds 2^i values: the midpoints of
    ``linspace(0.1, 1, 2^i + 1)`` (fp32) times 10^(i-6), and their negatives; then 0 and 1. The
    arithmetic is done in fp32 with the same torch ops so that every value matches bit for bit.
    """
    decades = []
    for i in range(7):
        bounds = torch.linspace(0.1, 1.0, 2**i + 1, dtype=torch.float32)
        decades.append((10.0 ** (i - 6)) * ((bounds[:-1] + bounds[1:]) / 2.0))
    pos = torch.cat(decades)
    return torch.cat([pos, -pos, torch.tensor([0.0, 1.0])]).sort().values


def pack_bnb4(codes: torch.Tensor) -> torch.Tensor:
    """Flat 4-bit codes -> uint8 [ceil(n/2)], high nibble = even element (an odd tail pads a 0 nibble)."""
    c = codes.reshape(-1).to(torch.uint8)
    c = F.pad(c, (0, c.numel() % 2))
    return ((c[0::2] & 0xF) << 4) | (c[1::2] & 0xF)


def nearest_code(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index (uint8) of the code book entry nearest to each x; ties go to the lower value.

    Of equal entries the first index wins (FP4's 0 at index 0 rather than -0 at index 8).
    """
    first = [i for i in range(code.numel()) if not bool((code[:i] == code[i]).any())]
    keep = torch.tensor(first, device=code.device)
    values, order = code[keep].sort()
    mids = (values[:-1] + values[1:]) / 2.0
    return keep[order][torch.bucketize(x.contiguous(), mids)].to(torch.uint8)


def _blockwise(flat: torch.Tensor, block: int, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """absmax per block of a flat fp32 vector (a ragged tail is its own block) and codes of x / absmax."""
    n = flat.numel()
    nb = -(-n // block)
    blocks = F.pad(flat, (0, nb * block - n)).view(nb, block)
    absmax = blocks.abs().amax(dim=1)
    den = absmax.unsqueeze(1)
    scaled = torch.where(den > 0, blocks / den, torch.zeros_like(blocks)).clamp(-1.0, 1.0)
    return absmax, nearest_code(scaled.reshape(-1)[:n], code)


def double_quantize_absmax(absmax: torch.Tensor) -> dict[str, torch.Tensor]:
    """bitsandbytes' nested quantization of fp32 absmax: uint8 codes, nested_absmax, nested_code, offset."""
    offset = absmax.mean()
    nested_code = dynamic_map().to(absmax.device)
    nested_absmax, codes = _blockwise(absmax - offset, NESTED_BLOCK, nested_code)
    return {
        "absmax": codes,
        "nested_absmax": nested_absmax,
        "nested_code": nested_code,
        "offset": offset.reshape(1),
    }


def quantize(
    w: torch.Tensor,
    scheme: Scheme,
    *,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    calib: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Round-to-nearest bitsandbytes 4-bit quantization of fp32 [N, K] into canonical tensors.

    Blocks run over the flattened weight, so any N and K work; ``output_sizes`` and ``calib`` do not
    change the numbers (bnb has no per-slice or activation scales).
    """
    code = code_table(scheme.weight)
    G = scheme.group_size
    assert G is not None
    w = check_weight(w, scheme, 1)
    if g_idx is not None:
        raise ReferenceInputError(f"{scheme.name}: g_idx (act-order) applies to integer schemes only")
    if output_sizes and sum(output_sizes) != w.shape[0]:
        raise ReferenceInputError(f"output_sizes {tuple(output_sizes)} do not add up to N={w.shape[0]}")
    absmax, q = _blockwise(w.reshape(-1), G, code.to(w.device))
    out = {"qweight": pack_bnb4(q), "code": code.to(w.device)}
    if scheme.double_quant:
        out.update(double_quantize_absmax(absmax))
        out["offset"] = out["offset"].expand(len(output_sizes) or 1).clone()
    else:
        out["absmax"] = absmax
    return out


def where_of(weight: CanonicalWeight) -> str:
    return f"bnb4 weight {weight.scheme.name} [N={weight.N}, K={weight.K}]"


def _expect(weight: CanonicalWeight, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    t = weight.get(name)
    where = where_of(weight)
    if t is None:
        raise ReferenceInputError(
            f"{where} is missing canonical tensor {name!r} (has {sorted(weight.tensors)})"
        )
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ReferenceInputError(
            f"{where}, canonical tensor {name!r}: expected {dtype} {list(shape)}, "
            f"found {t.dtype} {list(t.shape)}"
        )
    return t


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """The fp32 [N, K] weight that bnb 4-bit canonical tensors stand for (the stored code book is used)."""
    scheme = weight.scheme
    if scheme.family != "bnb4":
        raise ReferenceInputError(f"the bnb reference serves nf4 and fp4_bnb, not {scheme.name}")
    G = scheme.group_size
    assert G is not None
    n = weight.N * weight.K
    nb = -(-n // G)
    q = _expect(weight, "qweight", (-(-n // 2),), torch.uint8)
    code = _expect(weight, "code", (16,), torch.float32)
    if scheme.double_quant:
        offset = _expect(weight, "offset", (len(weight.output_sizes),), torch.float32)
        if offset.numel() > 1:  # a fused layer: each slice's quant state has its own offset
            if weight.K % G:
                raise ReferenceInputError(f"{where_of(weight)}: per-slice offsets need K % {G} == 0")
            rows = torch.arange(nb, device=offset.device) * G // weight.K
            offset = offset[weight.slice_index().to(offset.device)[rows]]
        absmax = dequantize_absmax(
            _expect(weight, "absmax", (nb,), torch.uint8),
            _expect(weight, "nested_absmax", (math.ceil(nb / NESTED_BLOCK),), torch.float32),
            _expect(weight, "nested_code", (256,), torch.float32),
            offset,
        )
    else:
        absmax = _expect(weight, "absmax", (nb,), torch.float32)
    vals = F.pad(code[unpack_bnb4(q, n).long()], (0, nb * G - n)).view(nb, G)
    return (vals * absmax.unsqueeze(1)).reshape(-1)[:n].view(weight.N, weight.K)
