"""4-bit code-book weights on the tensor-core kernel of ``mma_wna16``: NVFP4 and MXFP4
(``cuda.mma_fp4``) and bitsandbytes NF4/FP4 (``cuda.mma_bnb4``), weight-only (W4A16).

Their codes are 4-bit codes like int4's, so they take the same lane-order repack
(``wna16_layout.repack_codes``) and the same kernel, built with another ``CODE``
(``kernels/wna16_common.cuh``):

- ``E2M1``: a nibble becomes an fp16/bf16 pair by placing its bits as a subnormal (value times
  2^-14 or 2^-126); the group's scale is stored as one e5m3 byte (:func:`fp4_operands`), widened
  to an fp16/bf16 pair by one multiply-add, and one multiply gives code * scale * 2^-14 exactly in
  either dtype: the product has at most 6 significant bits.
- ``LUT4``: the codes keep their canonical nibble order, so each code byte indexes a 256-pair
  table (entry b = (book[b & 15], book[b >> 4])) that every block copies to shared memory once per
  bank (32 KiB): each lane reads its own copy, so random code bytes never collide on a bank. One
  lookup and one multiply by the scale per pair. (A single shared table conflicted on banks; the
  book in 8 registers, looked up by byte permutes, cost more instructions: both measured slower,
  ``bench/results/h200-2026-12-03-codebook-ab.json``.)

FP4 scales stay one byte per group (:func:`fp4_operands`): NVFP4's e4m3 scales times 2^7 and
MXFP4's e8m0 scales relative to their column's largest are exact e5m3 bytes, and the rest (the
global scale, the column's power of two, 2^14) is an fp32 factor per column applied to the sums
(the kernel's ``cs``). Prepared sizes per weight equal the stored ones: NVFP4 0.5625 bytes, MXFP4
0.53. bitsandbytes' absmax is split the same way (:func:`split_columns`: a power of two per
column on the sums, the rest in [0, 2) in the activation dtype, 2 bytes per block; its fp32
absmax and its code book round to the activation dtype, relative 2^-9 in bf16, 2^-12 in fp16):
0.53 bytes per weight at blocksize 64. Batches beyond the tuned small-M shapes dequantize K slices
for cuBLAS, as the integer kernels do.
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.backends.triton.lut4_kernel import prepare_bnb4, prepare_fp4
from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec

from .mma_wna16 import E2M1, LUT4, Operands, fit_tiles, groups_per_chunk, over_base, prepare_mma, sz_bytes
from .wna16_layout import KC, N_ALIGN
from .wna16_rules import device_conditions

#: fp4 scale bytes are e5m3: 5 exponent bits (bias 15) over 3 mantissa bits, fp16's bits 7..14
#: without the sign; the kernel widens one with a single multiply-add (``Fp4Scale``). Only normal
#: bytes are stored: this one stands in for a zero scale, whose block's codes are zeroed instead.
E5M3_UNIT = 0x08
#: e4m3 scales are stored times 2^7 (the largest, 448, then sits at the top of e5m3's range)
E4M3_LIFT = 7
#: the power of two a decoded product carries in either dtype (code placement times the widened byte)
PRODUCT_EXP = -14


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


def scale_layout(rel: torch.Tensor, K: int, G: int, act: torch.dtype) -> torch.Tensor:
    """Scales [N, K/G] -> the kernel's [groups over the padded K, Npad] in ``act`` (padding 0)."""
    N = rel.shape[0]
    n_groups = -(-K // KC[4]) * KC[4] // G
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    sz = torch.zeros(n_groups, n_pad, dtype=act, device=rel.device)
    sz[: K // G, :N] = rel.t().to(act)
    return sz.contiguous()


def e5m3_bytes(v: torch.Tensor) -> torch.Tensor:
    """Non-negative values that e5m3 holds exactly as normal numbers -> their bytes (uint8)."""
    bits = v.to(torch.float16).view(torch.int16).to(torch.int32)
    if not bool(((bits & 0x7F) == 0).all()) or not bool(((bits >> 10) & 31).ge(1).all()):
        raise AssertionError("scale not a normal e5m3 value")  # a bug here, not a checkpoint's fault
    return (bits >> 7).to(torch.uint8)


def fp4_operands(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K/2] as the kernel multiplies them; scale bytes [groups, Npad], the kernel's
    parameter layout; column factors fp32 [N]).

    NVFP4: byte = |e4m3| * 2^7 (exact: e4m3 spans 2^-9..448), column factor = global * 2^7; a
    negative scale flips its block's code signs (e2m1 is sign-magnitude, so exactly). MXFP4: byte
    = 2^(E - Emax + a) with Emax the column's largest exponent and a = min(15, Emax + 13) (keeps
    the column factor 2^(Emax - a - 113) a normal fp32); groups below 2^-14 there (more than 2^29
    under the column's largest) are dropped. Zero and dropped scales zero their block's codes.
    The decoded product code * byte carries 2^-14 in both dtypes (``Deq<T, E2M1>``).
    """
    codes, raw, row, kind = prepare_fp4(weight)
    N, K, G = weight.N, weight.K, weight.scheme.group_size
    assert G is not None
    if kind == "e4m3":
        s = raw.view(torch.float8_e4m3fn).to(torch.float32)
        flip, zero = s < 0, s == 0
        v = s.abs() * 2.0**E4M3_LIFT
        assert row is not None
        col = row.float() * 2.0 ** (-E4M3_LIFT - PRODUCT_EXP)
    else:
        e = raw.to(torch.int32)
        emax = e.amax(dim=1, keepdim=True)
        lift = torch.clamp(emax + 13, max=15)
        d = e - emax + lift
        flip, zero = torch.zeros_like(d, dtype=torch.bool), d < -14
        v = torch.exp2(d.clamp(min=-14).float())
        col = torch.exp2((emax - lift - 127 - PRODUCT_EXP).view(-1).float())
    b = torch.where(zero, E5M3_UNIT, e5m3_bytes(torch.where(zero, 1.0, v)).to(torch.int32)).to(torch.uint8)
    nbytes = G // 2  # code bytes per group
    keep = torch.where(zero, 0, 0xFF).to(torch.uint8).repeat_interleave(nbytes, dim=1)
    signs = torch.where(flip, 0x88, 0).to(torch.uint8).repeat_interleave(nbytes, dim=1)
    codes = ((codes ^ signs) & keep).contiguous()
    n_groups = -(-K // KC[4]) * KC[4] // G
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    sz = torch.zeros(n_groups, n_pad, dtype=torch.uint8, device=v.device)
    sz[: K // G, :N] = b.t()
    return codes, sz.contiguous(), col.contiguous()


def book_pairs(book: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """A 16-value code book -> int32 [256], the kernel's ``book``: entry b holds (book[b & 15],
    book[b >> 4]) in ``act``, low half first (one pair-table index per canonical code byte)."""
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


def fp4_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Code books may have their own sweep (``small_m_codebook``) over int4's shapes (unfolded);
    byte scales need 2 n8 tiles per warp at least (16-byte pieces of parameters per group)."""
    rows = over_base(table, "small_m_codebook", table["small_m"])
    return fit_tiles(rows, sz_bytes(torch.float16, E2M1))


class CudaMmaFp4(Kernel):
    name = "cuda.mma_fp4"
    description = (
        "CUDA NVFP4/MXFP4 weight-only on tensor cores (mma.sync, int4's lane-order repack, e2m1 decoded by "
        "bit placement, one multiply per pair); cuBLAS on dequantized slices for large M"
    )

    weight_only = True  # an activation-quantized scheme here is a weight-only substitute

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
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

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        codes, sz, col = fp4_operands(weight)
        return codes, sz, col, None

    @classmethod
    def tile_rows(cls, table: dict[str, Any]) -> list[dict[str, Any]]:
        return fp4_rows(table)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        return prepare_mma(
            self, weight, spec, bits=4, code=E2M1, operands=self.operands, tile_rows=self.tile_rows
        )


class CudaMmaBnb4(Kernel):
    name = "cuda.mma_bnb4"
    description = (
        "CUDA bitsandbytes NF4/FP4 weight-only on tensor cores (mma.sync, int4's lane-order repack, the code "
        "book as a shared-memory pair table); cuBLAS on dequantized slices for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
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

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        return bnb4_operands(weight, act)

    @classmethod
    def tile_rows(cls, table: dict[str, Any]) -> list[dict[str, Any]]:
        """The code book's own sweep (``small_m_bnb4``: its 32 KiB table changes what fits) over fp4's."""
        return over_base(table, "small_m_bnb4", fp4_rows(table))

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        return prepare_mma(
            self, weight, spec, bits=4, code=LUT4, operands=self.operands, tile_rows=self.tile_rows
        )
