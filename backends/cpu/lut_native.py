"""Native code-book and float weight-only kernels for x86 CPUs (``native/csrc/lut.cpp``).

Covers NF4 and bitsandbytes FP4 (with or without double quant), fp8 e4m3/e5m2 (tensor, channel or
block scales), NVFP4 and MXFP4. W8A8 fp8 schemes run here too, with the scheme's activation
quantization applied (e4m3 codes times their scales, in fp32: this CPU has no fp8 arithmetic) and
the fp32 activations split exactly into bf16 parts, so the numbers are the scheme's, not a
weight-only substitute's. W4A4 NVFP4 stays on the reference. Why: every one of these formats decodes through a small
table (16 code values, or 128 fp8 magnitudes) into exact bf16 words, so the integer kernels' design
carries over: one re-tiled layout per weight, a fused decode-and-dot GEMV for small M and a
decode-a-panel-then-GEMM path for large M. The layouts are documented in ``lut.cpp``.

bitsandbytes' flat blocks are re-tiled into rows, which needs ``K % blocksize == 0`` (then no block
spans two rows); double-quant absmax is resolved to fp32 once, at load, which keeps the prepared
bytes within 1.10x of the checkpoint's for blocksizes from 64 on.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import (
    E2M1_VALUES,
    FP8_DTYPES,
    CanonicalWeight,
    dequantize_absmax,
    unpack_bnb4,
    unpack_fp4,
)
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec
from quantrt.torchops import SCHEME_FP8_MAX, dynamic_scale, quantize_fp8

from .native import build
from .native_common import (
    CPU_DTYPES,
    DTYPE_CODE,
    GEMV,
    PANEL_GEMM,
    PANEL_GEMM_TILES,
    check_rows,
    round_up,
    run_linear,
)
from .native_common import native_verdict as _native_verdict

TILE = 16  # output rows per tile of the prepared layout
FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
#: field order of the int64 descriptor read by lut.cpp (enum LutField)
FIELDS = (
    "q",
    "scales",
    "rowscale",
    "tab",
    "N",
    "K",
    "Kp",
    "T",
    "ng",
    "bits",
    "fold",
    "skind",
    "kc",
    "haslo",
    "pre",
)
#: the fields the GEMV builds (lut_avx2.cpp, lut_neon.cpp) read after those: the fp32 code book (4
#: bits) and the fp8 format (1: e5m2)
GEMV_FIELDS = ("tab32", "fp8")
#: e8m0 codes the panel GEMM may multiply into the decoded panel: every e2m1 value (0.5 .. 6) times
#: 2^(E - 127) is then an exact normal bf16, and its products with activations stay normal fp32 down
#: to |x| = 2^-63 (AVX-512 BF16 and AMX flush subnormal products, which the unscaled codes of the
#: per-group path never produce). Real MXFP4 checkpoints keep E near 127; outside, the group fold runs.
E8M0_EXACT = (64, 190)
#: scale kinds of lut.cpp (enum ScaleKind)
SK_NONE, SK_F32, SK_E4M3, SK_E8M0 = 0, 1, 2, 3
#: fold length for tensor/channel scales (applied once per row at the end)
CHANNEL_FOLD = 256
#: codes per K chunk of the large-M panel (64 rows x 2048 bf16 = 256 KiB, within Zen 4's L2)
PANEL_CODES = 2048
#: batch sizes from which the large-M strategy runs, by weight bits (measured on Zen 4, 1 thread: the 4-bit
#: GEMV loses to the panel from 3 rows on, the fp8 one from about 12)
LARGE_M = {4: 3, 8: 12}
#: double-quant absmax resolved to fp32 grows the layer by 4/G - 1/G bytes per weight: within
#: 1.10x of the stored 0.5 + 1/G bytes only from G = 64 on
DQ_MIN_BLOCK = 64


def _library() -> ctypes.CDLL:
    lib = build.library("lut")
    if not getattr(lib, "_quantrt_typed", False):
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
        lib.quantrt_lut_isa.restype = i32
        lib.quantrt_lut_linear.restype = i32
        lib.quantrt_lut_linear.argtypes = [
            ctypes.POINTER(i64), ptr, i32, i64, i64, i64, ptr, i32, ptr, i32, i64, i32, i32,
        ]  # fmt: skip
        lib.quantrt_lut_amx_ready.restype = i32
        lib.quantrt_lut_amx_ready.argtypes = [ctypes.POINTER(i64)]
        lib.quantrt_lut_dequant_rows.restype = i32
        lib.quantrt_lut_dequant_rows.argtypes = [ctypes.POINTER(i64), ptr, i64, i64, ptr, i32, i64, i32]
        lib._quantrt_typed = True
    return lib


# -- layout helpers ----------------------------------------------------------------------------


def tile_codes(codes: torch.Tensor, bits: int, Np: int, Kp: int) -> torch.Tensor:
    """Codes [N, K] (uint8: nibbles, or fp8 bytes) in the tiled layout of lut.cpp: uint8 [T, steps, bytes].

    Padding rows and columns hold code 0.
    """
    N, K = codes.shape
    c = torch.zeros((Np, Kp), dtype=torch.uint8)
    c[:N, :K] = codes
    T = Np // TILE
    if bits == 8:
        return c.view(T, TILE, Kp // 2, 2).permute(0, 2, 1, 3).reshape(T, Kp // 2, 32).contiguous()
    q = c.view(T, TILE, Kp // 8, 4, 2).to(torch.int32)  # [..., pair p, e]
    words = (q << (4 * torch.arange(4, dtype=torch.int32)).view(4, 1)).sum(dim=-2)  # [T, 16, Kp/8, 2]
    words = words.permute(0, 2, 1, 3).reshape(T, Kp // 8, 32).to(torch.int16)  # int16 wraps like uint16
    return words.contiguous().view(torch.uint8)


def tile_columns(t: torch.Tensor, Np: int) -> torch.Tensor:
    """Per-row block scales [N, ng] as [T, ng, 16] (padding rows 0)."""
    N, ng = t.shape
    padded = torch.zeros((Np, ng), dtype=t.dtype)
    padded[:N] = t
    return padded.view(Np // TILE, TILE, ng).permute(0, 2, 1).contiguous()


def bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to bf16, as int16 bit patterns."""
    return v.to(torch.bfloat16).view(torch.int16)


def code_tables(code: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The 16-entry code book as the 4-bit decode tables (bf16 values x2, residuals x2), and whether
    the residuals are non-zero (the book is not exact in bf16)."""
    code = code.float().cpu()
    hi = code.to(torch.bfloat16).float()
    lo = code - hi
    tab = torch.cat([bf16_bits(hi).repeat(2), bf16_bits(lo).repeat(2)]).contiguous()
    return tab, bool(lo.ne(0).any())


def fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """The bf16 bit patterns of the 128 non-negative fp8 codes (every one is exact in bf16)."""
    return bf16_bits(torch.arange(128, dtype=torch.uint8).view(dtype).float()).contiguous()


def _row_values(weight: CanonicalWeight, per_slice: torch.Tensor, Np: int) -> torch.Tensor:
    """A per-slice fp32 value repeated over the slice's rows, as [Np] (padding rows 0)."""
    rows = torch.zeros(Np, dtype=torch.float32)
    rows[: weight.N] = per_slice.float().cpu()[weight.slice_index()]
    return rows


# -- per-format preparation: (codes [N, K] uint8, bits, block scales [N, ng] or None, scale kind,
#    fold, row multiplier [Np] or None, table, table has residuals)


def _prep_bnb4(weight: CanonicalWeight, Np: int) -> dict[str, Any]:
    s, N, K = weight.scheme, weight.N, weight.K
    G = s.group_size
    assert G is not None
    codes = unpack_bnb4(weight["qweight"].cpu(), N * K).view(N, K)
    if s.double_quant:
        nb = N * K // G
        offset = weight["offset"].float().cpu()
        if offset.numel() > 1:  # one offset per fused slice's quant state
            offset = offset[weight.slice_index()[torch.arange(nb) * G // K]]
        absmax = dequantize_absmax(
            weight["absmax"].cpu(), weight["nested_absmax"].cpu(), weight["nested_code"].cpu(), offset
        )
    else:
        absmax = weight["absmax"].float().cpu()
    tab, haslo = code_tables(weight["code"])
    return {
        "book": weight["code"],
        "codes": codes,
        "bits": 4,
        "scales": absmax.view(N, K // G),
        "skind": SK_F32,
        "fold": G,
        "rowscale": None,
        "tab": tab,
        "haslo": haslo,
    }


def _prep_fp4(weight: CanonicalWeight, Np: int) -> dict[str, Any]:
    nv = weight.scheme.family == "nvfp4"
    scales = weight["scales"].cpu()
    if nv:
        scales = scales.view(torch.uint8)
    elif bool((scales == 255).any()):
        raise ValueError(
            f"{weight.scheme.name}: e8m0 scale code 255 is NaN ({int((scales == 255).sum())} scales)"
        )
    tab, _ = code_tables(E2M1_VALUES)
    return {
        "book": E2M1_VALUES,
        "codes": unpack_fp4(weight["qweight"].cpu()),
        "bits": 4,
        "scales": scales,
        "skind": SK_E4M3 if nv else SK_E8M0,
        "pre": not nv and bool(((scales >= E8M0_EXACT[0]) & (scales <= E8M0_EXACT[1])).all()),
        "fold": 16 if nv else 32,
        "rowscale": _row_values(weight, weight["global_scale"], Np) if nv else None,
        "tab": tab,
        "haslo": False,
    }


def _prep_fp8(weight: CanonicalWeight, Np: int) -> dict[str, Any]:
    s, N = weight.scheme, weight.N
    dtype = FP8_DTYPES[s.weight]
    scales = weight["scales"].float().cpu()
    out: dict[str, Any] = {
        "codes": weight["qweight"].cpu().view(torch.uint8),
        "bits": 8,
        "tab": fp8_table(dtype),
        "haslo": False,
    }
    if s.granularity == "block":
        bn, bk = s.block  # type: ignore[misc]
        rows = scales.repeat_interleave(bn, dim=0)[:N]
        return {**out, "scales": rows, "skind": SK_F32, "fold": bk, "rowscale": None}
    if s.granularity == "tensor":
        row = _row_values(weight, scales.reshape(-1), Np)
    else:
        row = torch.zeros(Np, dtype=torch.float32)
        row[:N] = scales.reshape(N)
    return {**out, "scales": None, "skind": SK_NONE, "fold": CHANNEL_FOLD, "rowscale": row}


PREPARE = {"bnb4": _prep_bnb4, "nvfp4": _prep_fp4, "mxfp4": _prep_fp4, "fp8": _prep_fp8}


# -- call helpers (as in wint_native) ----------------------------------------------------------


@dataclass(frozen=True)
class Fp8Acts:
    """A W8A8 fp8 scheme's activation quantization: per token, per token group of ``group``
    channels, per tensor (dynamic) or with the static ``scale``."""

    granularity: str
    group: int | None
    scale: torch.Tensor | None  # static: fp32 scalar (the max over fused slices, as the reference)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x quantized to e4m3 and dequantized (fp32 [M, K]): the activations the scheme multiplies.
        Scales from torchops (amax / 448, 1 for all-zero rows), codes by its saturating cast."""
        x = x.float()
        if self.scale is not None:
            return quantize_fp8(x, torch.float8_e4m3fn, self.scale).float() * self.scale
        if self.granularity == "token_group":
            M, K = x.shape
            g = self.group or K
            ng = -(-K // g)
            xg = torch.nn.functional.pad(x, (0, ng * g - K)).view(M, ng, g)
            sg = dynamic_scale(xg.abs().amax(dim=2, keepdim=True), SCHEME_FP8_MAX)
            return (quantize_fp8(xg, torch.float8_e4m3fn, sg).float() * sg).view(M, ng * g)[:, :K]
        amax = x.abs().amax(dim=1, keepdim=True) if self.granularity == "token" else x.abs().amax()
        sx = dynamic_scale(amax, SCHEME_FP8_MAX)
        return quantize_fp8(x, torch.float8_e4m3fn, sx).float() * sx


@dataclass
class LutLayout:
    tensors: dict[str, torch.Tensor]  # the prepared layout (kept alive: the descriptor points into it)
    desc: ctypes.Array
    N: int
    K: int
    large_m: int  # batch sizes from which the panel GEMM beats the GEMV
    out_dtype: torch.dtype
    fn: Any
    acts: Fp8Acts | None = None  # W8A8 fp8: how activations are quantized

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors.values())


def can_run(spec: LayerSpec, caps: Any, features: tuple[str, ...] = FEATURES) -> Verdict:
    """cpu.native_lut's requirements (cpu.amx_lut adds its own): the format, its block shapes and
    the instructions (``features``: another build's, for the kernels that share this layout)."""
    s = spec.scheme
    fam = s.family
    G = s.group_size or 0
    bn, bk = s.block or (16, 16)
    return check(
        (
            fam in PREPARE,
            "weights nf4, fp4_bnb, fp8_e4m3, fp8_e5m2, nvfp4 or mxfp4",
            {"weight": s.weight},
        ),
        (
            s.act in (None, "fp8_e4m3"),
            "weight-only or fp8 activations (no fp4 activation quantization here)",
            {"act": s.act},
        ),
        (
            fam != "fp8" or s.granularity != "block" or (bn % 16 == 0 and bk % 16 == 0),
            "fp8 blocks whose rows and columns are multiples of 16",
            {"block": s.block},
        ),
        (fam != "nvfp4" or spec.K_part % 16 == 0, "K % 16 == 0 (nvfp4 blocks)", {"K": spec.K_part}),
        (fam != "mxfp4" or spec.K_part % 32 == 0, "K % 32 == 0 (mxfp4 blocks)", {"K": spec.K_part}),
        (
            fam != "bnb4" or (spec.k_full and spec.K % G == 0),
            "bnb4 K % blocksize == 0 with the full K (blocks re-tiled into rows)",
            {"K": spec.K_part, "blocksize": G},
        ),
        (
            not (fam == "bnb4" and s.double_quant) or G >= DQ_MIN_BLOCK,
            f"double-quant blocksize >= {DQ_MIN_BLOCK} (fp32 absmax within 1.10x of the stored bytes)",
            {"blocksize": G},
        ),
    ) and _native_verdict(caps, features)


def prepare_lut(weight: CanonicalWeight, spec: LayerSpec, fn: Any = None, gemv: bool = False) -> LutLayout:
    """The codes and scales re-tiled into lut.cpp's layout, with its decode table (the load-time work
    of every kernel on this layout, cpu.amx_lut's and the GEMV builds' included). A bnb code book is
    also kept in fp32 (``code32``, 16 values): exact row dequantization needs it. ``fn``: the entry
    point that runs the layout (by default quantrt_lut_linear); ``gemv``: the descriptor also carries
    the fp32 code book and the fp8 format (:data:`GEMV_FIELDS`, read by lut_avx2.cpp and lut_neon.cpp)."""
    N, K = weight.N, weight.K
    Np = round_up(N, TILE)
    p = PREPARE[weight.scheme.family](weight, Np)
    bits = p["bits"]
    Kp = round_up(K, 8 if bits == 4 else 2)
    tensors = {"q": tile_codes(p["codes"], bits, Np, Kp), "tab": p["tab"]}
    if p["scales"] is not None:
        tensors["scales"] = tile_columns(p["scales"], Np)
    if p["rowscale"] is not None:
        tensors["rowscale"] = p["rowscale"]
    if weight.scheme.family == "bnb4":
        tensors["code32"] = weight["code"].float().cpu().contiguous()
    if gemv and bits == 4:
        tensors["tab32"] = p["book"].float().cpu().contiguous()
    fold = p["fold"]
    values = {
        **tensors,
        "scales": tensors.get("scales"),
        "rowscale": tensors.get("rowscale"),
        "N": N,
        "K": K,
        "Kp": Kp,
        "T": Np // TILE,
        "ng": -(-Kp // fold),
        "bits": bits,
        "fold": fold,
        "skind": p["skind"],
        "kc": fold * max(1, PANEL_CODES // fold),
        "haslo": int(p["haslo"]),
        "pre": int(p.get("pre", False)),
        "tab32": tensors.get("tab32"),
        "fp8": int(weight.scheme.weight == "fp8_e5m2"),
    }
    fields = FIELDS + GEMV_FIELDS if gemv else FIELDS
    row = [v.data_ptr() if isinstance(v, torch.Tensor) else int(v or 0) for v in (values[f] for f in fields)]
    desc = (ctypes.c_int64 * len(row))(*row)
    acts = None
    sch = weight.scheme
    if sch.act is not None:
        static = None if sch.act_dynamic else weight["input_scale"].float().amax()
        acts = Fp8Acts(sch.act_granularity, sch.act_group, static)
    return LutLayout(
        tensors, desc, N, K, LARGE_M[bits], spec.output_dtype, fn or _library().quantrt_lut_linear, acts
    )


def gemv(
    layout: LutLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The fused decode-and-dot GEMV (after the scheme's fp8 activation quantization, if any)."""
    if layout.acts is not None:
        x = layout.acts.apply(x)  # fp32 [M, K]: the codes times their scales
    return run_linear(NativeLut.name, layout, x, bias, out, GEMV)


def panel_gemm(
    layout: LutLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """Panels decoded into L2 once per 64 rows and K chunk, then multiplied by every activation row."""
    if layout.acts is not None:
        x = layout.acts.apply(x)
    return run_linear(NativeLut.name, layout, x, bias, out, PANEL_GEMM)


def panel_gemm_tiles(
    layout: LutLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The panel GEMM with its products on AMX tiles (cpu.amx_lut: weight-only layouts only)."""
    return run_linear("cpu.amx_lut", layout, x, bias, out, PANEL_GEMM_TILES)


def lut_strategies(layout: LutLayout) -> list[Strategy]:
    """The GEMV below the measured crossover (``LARGE_M``), the panel GEMM from it; W8A8 fp8 layers
    name their activation quantization."""
    pre = ""
    if layout.acts is not None:
        pre = f"fp8 activations ({layout.acts.granularity}) quantized as the scheme says, fp32 math + "
    return [Strategy(layout.large_m - 1, pre + "gemv", gemv), Strategy(ALL_M, pre + "panel-gemm", panel_gemm)]


def tiles_ready(layout: LutLayout) -> bool:
    """Whether the library runs this weight's panel GEMM on AMX tiles (built with them, Linux granted
    them, whole 32-k tiles)."""
    return bool(_library().quantrt_lut_amx_ready(layout.desc))


class NativeLut(Kernel):
    """NF4/bnb FP4, fp8 e4m3/e5m2, NVFP4 and MXFP4 weight-only layers on AVX-512 BF16: table-decoded
    exact bf16 weights times bf16 parts of x, fp32 sums and block scales. The library keeps its
    scratch per thread (lut.cpp's ``Scratch``), so the prepared layer declares no workspace."""

    name = "cpu.native_lut"
    act_dtypes = CPU_DTYPES
    description = "native AVX-512 BF16 NF4/FP4/fp8/NVFP4/MXFP4 weight-only GEMV (small M) and panel GEMM"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return can_run(spec, caps)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = prepare_lut(weight, spec)
        return self.prepared(layout, lut_strategies(layout), spec)


def dequant_rows(
    layout: LutLayout, n0: int, n1: int, out: torch.Tensor, code: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows [n0, n1) of the dequantized weight (value * block scale * row multiplier in fp32, rounded
    once to ``out``'s dtype) from the prepared layout into ``out`` [n1 - n0, K] (fp32, bf16 or fp16,
    unit column stride).

    A bnb code book is exact only in fp32 (the layout keeps it as bf16 value + residual): give it as
    ``code`` (16 fp32 values) or in ``layout.tensors["code32"]`` (as :func:`prepare_lut` keeps it)."""
    check_rows(layout.N, layout.K, n0, n1, out)
    if code is None:
        code = layout.tensors.get("code32")
    if code is not None:
        code = code.to(torch.float32).contiguous()
        if code.numel() != 16:
            raise ValueError(f"code must hold the 16 code-book values, found {code.numel()}")
    elif layout.desc[FIELDS.index("haslo")]:
        raise ValueError("this code book is exact only in fp32: pass code= (the 16 fp32 values)")
    rc = _library().quantrt_lut_dequant_rows(
        layout.desc, 0 if code is None else code.data_ptr(), n0, n1, out.data_ptr(), DTYPE_CODE[out.dtype],
        out.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"lut dequant_rows: the native code refused rows [{n0}, {n1}) (code {rc})")
    return out
