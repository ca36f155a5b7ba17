"""4-bit code-book weights on the tensor-core kernel of ``mma_wna16``: NVFP4 and MXFP4
(``cuda.mma_fp4``) and bitsandbytes NF4/FP4 (``cuda.mma_bnb4``), weight-only (W4A16).

Their codes are 4-bit codes like int4's, so they take the same lane-order repack
(``wna16_layout.repack_codes``) and the same kernel, built with another ``CODE``
(``kernels/wna16_common.cuh``):

- ``E2M1``: a nibble becomes an fp16/bf16 pair by placing its bits as a subnormal (value times
  2^-14 or 2^-126), and one multiply by the stored scale, which carries that power back, gives
  code * scale exactly: the product has at most 7 significant bits.
- ``LUT4``: the 16-value code book is copied into shared memory as 256 pairs (one entry per code
  byte), so two lookups and two byte permutes give two pairs; one multiply by the scale.

Scales are prepared once at load (:func:`split_columns`): per column n the power of two ``c_n``
at or below its largest scale (times NVFP4's global scale) is split off and applied to the fp32
sums (the kernel's ``cs``), and each group scale over ``c_n`` (in [0, 2)) is stored in the
activation dtype, 2 bytes per group and column. e4m3 and e8m0 scales over ``c_n`` are exact in
bf16, and in fp16 unless a group lies 2^17 or more below its column's largest (then it rounds
as an fp16 subnormal: a contribution under 2^-14 of the column's). bitsandbytes' fp32 absmax and
its code book round to the activation dtype (relative 2^-9 in bf16, 2^-12 in fp16). Prepared
sizes per weight: NVFP4 0.625 bytes (stored 0.5625), MXFP4 0.5625 (0.53), NF4 with blocksize 64
0.53 (0.5 + 4/64, as the Triton kernel's fp32 absmax). Batches beyond the tuned small-M shapes
dequantize K slices for cuBLAS, as the integer kernels do.
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec

from .mma_wna16 import E2M1, LUT4, CudaMmaWNA16, groups_per_chunk
from .triton_lut4 import prepare_bnb4, prepare_fp4
from .wna16_layout import KC, N_ALIGN
from .wna16_rules import device_conditions

#: the exponent a decoded e2m1 code carries (fp16 / bf16 subnormal placement), returned by the scale
DECODE_EXP = {torch.float16: 14, torch.bfloat16: 126}


def split_columns(s: torch.Tensor, row: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group scales float64 [N, groups] (and a factor per row) -> (scales over the column factor,
    in [0, 2); column factors fp32 [N], powers of two times ``row``, kept normal fp32 since the
    kernel may flush subnormals)."""
    amax = s.abs().amax(dim=1)
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    c = torch.ldexp(torch.ones_like(amax), e - 1)  # 2^floor(log2 amax)
    col = c if row is None else c * row.to(torch.float64)
    _, ec = torch.frexp(torch.where(col > 0, col, torch.ones_like(col)))
    lift = torch.clamp(-125 - ec, min=0)  # powers of two moved from a subnormal factor into the scales
    return torch.ldexp(s / c[:, None], -lift[:, None]), torch.ldexp(col, lift).to(torch.float32).contiguous()


def scale_layout(rel: torch.Tensor, K: int, G: int, act: torch.dtype, times: float = 1.0) -> torch.Tensor:
    """Scales [N, K/G] -> the kernel's [groups over the padded K, Npad] in ``act`` (padding 0)."""
    N = rel.shape[0]
    n_groups = -(-K // KC[4]) * KC[4] // G
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    sz = torch.zeros(n_groups, n_pad, dtype=act, device=rel.device)
    sz[: K // G, :N] = (rel * times).t().to(act)
    return sz.contiguous()


def fp4_params(weight: CanonicalWeight, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales [groups, Npad] in ``act``, the kernel's parameter layout; column factors fp32 [N])."""
    _, raw, row, kind = prepare_fp4(weight)
    G = weight.scheme.group_size
    assert G is not None
    if kind == "e4m3":
        s = raw.view(torch.float8_e4m3fn).to(torch.float64)
    else:
        s = torch.ldexp(torch.ones((), dtype=torch.float64, device=raw.device), raw.to(torch.float64) - 127)
    rel, col = split_columns(s, row)
    return scale_layout(rel, weight.K, G, act, 2.0 ** DECODE_EXP[act]), col


def book_pairs(book: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """A 16-value code book -> int32 [256]: entry b holds (book[b & 15], book[b >> 4]) in ``act``,
    low half first (the kernel's shared-memory table)."""
    bits = book.to(act).view(torch.int16).to(torch.int64) & 0xFFFF
    b = torch.arange(256, device=book.device)
    pairs = bits[b & 15] | (bits[b >> 4] << 16)
    return (pairs - ((pairs >> 31) << 32)).to(torch.int32)  # as signed 32-bit words


def bnb4_operands(
    weight: CanonicalWeight, act: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K/2], low nibble = even k; scales in the kernel's layout; column factors; book)."""
    codes, absmax, book = prepare_bnb4(weight)
    G = weight.scheme.group_size
    assert G is not None
    if not torch.isfinite(absmax).all():
        bad = int((~torch.isfinite(absmax)).sum())
        raise ValueError(f"{weight.scheme.name}: {bad} of {absmax.numel()} absmax values are not finite")
    rel, col = split_columns(absmax.to(torch.float64), None)
    return codes, scale_layout(rel, weight.K, G, act), col, book_pairs(book, act)


class CudaMmaFp4(CudaMmaWNA16):
    name = "cuda.mma_fp4"
    description = (
        "CUDA NVFP4/MXFP4 weight-only on tensor cores (mma.sync, int4's lane-order repack, e2m1 decoded by "
        "bit placement, one multiply per pair); cuBLAS on dequantized slices for large M"
    )
    priority = 37  # after the native W4A4 path on sm_100 (35), before the Triton kernels (40)
    bits = 4
    code = E2M1

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        return spec.scheme.act is not None

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *device_conditions(spec, caps, "cupy", "NVRTC compiles the kernel"),
            (s.family in ("nvfp4", "mxfp4"), "NVFP4 or MXFP4 weights", {"weight": s.weight}),
            (
                s.group_size is not None and groups_per_chunk(4, s.group_size) > 1,
                f"groups of 16..{KC[4] // 2} dividing {KC[4]}",
                {"group_size": s.group_size},
            ),
        )

    def operands(
        self, weight: CanonicalWeight, group: int | None, act: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        sz, col = fp4_params(weight, act)
        return weight["qweight"], sz, col, None

    def tile_rows(self, table: dict[str, Any]) -> list[dict[str, Any]]:
        """Code books may have their own sweep (``small_m_codebook``), else int4's shapes (unfolded)."""
        return table.get("small_m_codebook", table["small_m"])


class CudaMmaBnb4(CudaMmaFp4):
    name = "cuda.mma_bnb4"
    description = (
        "CUDA bitsandbytes NF4/FP4 weight-only on tensor cores (mma.sync, int4's lane-order repack, the code "
        "book as a shared-memory pair table); cuBLAS on dequantized slices for large M"
    )
    code = LUT4

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        return False

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size
        return check(
            *device_conditions(spec, caps, "cupy", "NVRTC compiles the kernel"),
            (s.family == "bnb4", "bitsandbytes NF4/FP4 weights", {"weight": s.weight}),
            (
                G is not None and groups_per_chunk(4, G) > 0,
                f"blocksize {KC[4]} times a power of two, or 16..{KC[4]} dividing it",
                {"blocksize": G},
            ),
            (
                G is not None and spec.K_part % G == 0,
                "K a multiple of the blocksize (no block spans two rows)",
                {"K": spec.K_part, "blocksize": G},
            ),
        )

    def operands(
        self, weight: CanonicalWeight, group: int | None, act: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return bnb4_operands(weight, act)
