"""Native integer kernels for x86 CPUs (``native/csrc/wint.cpp``): weight-only int2/3/4/8 and W8A8 int8.

Why they exist: torch's packed int4 op is twice as slow as dense bf16 at M=64 on Zen 4 and has no
int2/int3 or zero-point int8 path; here one prepared layout per weight (the canonical bytes
re-tiled, the same size) serves every batch size, through a fused decode-and-dot GEMV for small M
and a decode-a-panel-then-GEMM path for large M. The layouts are documented in ``wint.cpp``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm, int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec
from quantrt.torchops import per_channel_scales

from .native import build
from .native_common import (
    CPU_DTYPES,
    DTYPE_CODE,
    GEMV,
    PANEL_GEMM,
    PANEL_GEMM_TILES,
    check_rc,
    check_rows,
    native_verdict,
    round_up,
    run_linear,
)

TILE = 16  # output rows per tile of the prepared layouts
#: codes per row and step of the wint layout, by bits (a step holds 16 rows)
STEP_CODES = {8: 2, 4: 4, 3: 8, 2: 8}
#: fold length (codes between fp32 scale applications) for channel scales
CHANNEL_FOLD = 256
#: codes per K chunk of the large-M panel (64 rows x 2048 bf16 = 256 KiB, within Zen 4's L2)
PANEL_CODES = 2048
#: batch sizes from which the large-M strategy runs, by weight bits (measured on Zen 4: the GEMV's
#: decode is cheap for 4 bits, so it wins longer; W8A8 has no decode and blocks 4 tiles from M=2)
WINT_LARGE_M = {2: 12, 3: 12, 4: 16, 8: 10}
W8A8_LARGE_M = 2
WINT_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
W8A8_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
#: field order of the int64 descriptors read by wint.cpp (enum WintField / A8Field)
WINT_FIELDS = ("q", "scales", "zeros", "perm", "N", "K", "Kp", "T", "ng", "bits", "fold", "sstride", "kc")
W8A8_FIELDS = ("q", "scales", "N", "K", "Kp", "T")


def _library() -> ctypes.CDLL:
    lib = build.library("wint")
    if not getattr(lib, "_quantrt_typed", False):
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
        desc = ctypes.POINTER(ctypes.c_int64)
        lib.quantrt_wint_isa.restype = i32
        lib.quantrt_wint_linear.restype = i32
        lib.quantrt_wint_linear.argtypes = [desc, ptr, i32, i64, i64, i64, ptr, i32, ptr, i32, i64, i32, i32]
        lib.quantrt_w8a8_linear.restype = i32
        lib.quantrt_w8a8_linear.argtypes = [
            desc, ptr, i32, i64, i64, i64, ctypes.c_float, ptr, i32, ptr, i32, i64, i32, i32,
        ]  # fmt: skip
        lib.quantrt_w8a8_quantize.restype = i32
        lib.quantrt_w8a8_quantize.argtypes = [ptr, i32, i64, i64, i64, i64, ctypes.c_float, ptr, ptr, i32]
        lib.quantrt_wint_amx_ready.restype = i32
        lib.quantrt_wint_amx_ready.argtypes = [desc]
        lib.quantrt_wint_dequant_rows.restype = i32
        lib.quantrt_wint_dequant_rows.argtypes = [desc, i64, i64, ptr, i32, i64, i32]
        lib._quantrt_typed = True
    return lib


def _descriptor(fields: tuple[str, ...], values: dict[str, Any]) -> ctypes.Array:
    """The int64 array a C function reads its prepared weight from (tensors as data pointers)."""
    row = [
        values[f].data_ptr() if isinstance(values[f], torch.Tensor) else int(values[f] or 0) for f in fields
    ]
    return (ctypes.c_int64 * len(row))(*row)


# -- the wint layout ---------------------------------------------------------------------------


def tile_codes(codes: torch.Tensor, bits: int, Np: int, Kp: int) -> torch.Tensor:
    """Unsigned codes [N, K] (uint8) in the tiled layout of wint.cpp: uint8 [T, steps, bytes].

    Padding rows and columns hold 2^(b-1), which decodes to 0.
    """
    N, K = codes.shape
    half = 1 << (bits - 1)
    c = torch.full((Np, Kp), half, dtype=torch.uint8)
    c[:N, :K] = codes
    T = Np // TILE
    if bits == 8:
        steps = (c ^ 0x80).view(T, TILE, Kp // 2, 2)
        return steps.permute(0, 2, 1, 3).reshape(T, Kp // 2, 32).contiguous()
    if bits == 4:
        q = c.view(T, TILE, Kp // 4, 2, 2)  # [..., pair, e]
        b = q[..., 0, :] | (q[..., 1, :] << 4)
        return b.permute(0, 2, 1, 3).reshape(T, Kp // 4, 32).contiguous()
    q = c.view(T, TILE, Kp // 8, 4, 2)  # [..., pair f, e]
    low = q & 3
    b = low[..., 0, :] | (low[..., 1, :] << 2) | (low[..., 2, :] << 4) | (low[..., 3, :] << 6)
    low_bytes = b.permute(0, 2, 1, 3).reshape(T, Kp // 8, 32)
    if bits == 2:
        return low_bytes.contiguous()
    hi = ((q >> 2) & 1).permute(0, 2, 3, 1, 4).reshape(T, Kp // 8, 4, 4, 8)  # bit 2r+e of mask f
    masks = (hi << torch.arange(8, dtype=torch.uint8)).sum(dim=-1, dtype=torch.uint8).reshape(T, Kp // 8, 16)
    return torch.cat([low_bytes, masks], dim=-1).contiguous()


def tile_columns(t: torch.Tensor, Np: int) -> torch.Tensor:
    """Per-row scale/zero columns [N, ng] as [T, ng, 16] (padding rows 0)."""
    N, ng = t.shape
    padded = torch.zeros((Np, ng), dtype=t.dtype)
    padded[:N] = t
    return padded.view(Np // TILE, TILE, ng).permute(0, 2, 1).contiguous()


@dataclass
class WintLayout:
    tensors: dict[str, torch.Tensor]  # the prepared layout (kept alive: the descriptor points into it)
    desc: ctypes.Array
    N: int
    K: int
    large_m: int  # batch sizes from which the panel GEMM beats the GEMV
    out_dtype: torch.dtype
    fn: Any

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors.values())


def can_run(spec: LayerSpec, caps: Any, features: tuple[str, ...] = WINT_FEATURES) -> Verdict:
    """cpu.native_wint's requirements (cpu.amx_wint adds its own): the scheme and the instructions
    (``features``: another build's, for the kernels that share this layout)."""
    s = spec.scheme
    G = s.group_size if s.granularity == "group" else None
    return check(
        (
            s.weight == "int" and s.bits in STEP_CODES,
            "integer weights of 2, 3, 4 or 8 bits",
            {"weight": s.weight, "bits": s.bits},
        ),
        (s.weight_only, "weight-only scheme", {"act": s.act}),
        (
            s.granularity in ("group", "channel", "tensor"),
            "group, channel or tensor scales",
            {"granularity": s.granularity},
        ),
        (G is None or G % 16 == 0, "group size % 16 == 0", {"G": G}),
        (
            not s.act_order or spec.k_full,
            "act-order with the full K on this rank",
            {"K_part": spec.K_part, "K": spec.K},
        ),
    ) and native_verdict(caps, features)


def prepare_wint(weight: CanonicalWeight, spec: LayerSpec, fn: Any = None) -> WintLayout:
    """The canonical codes, scales and zeros re-tiled into wint.cpp's layout (the load-time work of
    every kernel on this layout, cpu.amx_wint's and cpu.avx2_wint's included); ``fn`` the entry point
    that runs it (by default quantrt_wint_linear)."""
    s = weight.scheme
    bits, N, K = s.bits, weight.N, weight.K
    Np, Kp = round_up(N, TILE), round_up(K, STEP_CODES[bits])
    codes = int_codes(weight).to(torch.uint8)
    perm = None
    if s.granularity == "group":
        G = s.group_size
        assert G is not None
        scales, fold, sstride = weight["scales"].float(), G, 1
        perm = act_order_perm(weight, G)
        if perm is not None:
            codes = codes[:, perm]
            perm = perm.to(torch.int32).contiguous()
    else:
        scales, fold, sstride = per_channel_scales(weight).reshape(N, 1), CHANNEL_FOLD, 0
    tensors = {"q": tile_codes(codes, bits, Np, Kp), "scales": tile_columns(scales, Np)}
    if not s.symmetric:
        z = weight["zeros"].to(torch.int16)
        if s.granularity == "tensor":
            z = z[weight.slice_index().to(z.device)]
        z = z.reshape(N, -1) if s.granularity != "group" else z
        tensors["zeros"] = tile_columns(z - (1 << (bits - 1)), Np)
    if perm is not None:
        tensors["perm"] = perm
    values = {
        **tensors,
        "zeros": tensors.get("zeros"),
        "perm": tensors.get("perm"),
        "N": N,
        "K": K,
        "Kp": Kp,
        "T": Np // TILE,
        "ng": scales.shape[1],
        "bits": bits,
        "fold": fold,
        "sstride": sstride,
        "kc": fold * max(1, PANEL_CODES // fold),
    }
    fn = fn or _library().quantrt_wint_linear
    return WintLayout(
        tensors, _descriptor(WINT_FIELDS, values), N, K, WINT_LARGE_M[bits], spec.output_dtype, fn
    )


def gemv(
    layout: WintLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The fused decode-and-dot GEMV."""
    return run_linear(NativeWint.name, layout, x, bias, out, GEMV)


def panel_gemm(
    layout: WintLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """Panels decoded into L2 once per 64 rows and K chunk, then multiplied by every activation row."""
    return run_linear(NativeWint.name, layout, x, bias, out, PANEL_GEMM)


def panel_gemm_tiles(
    layout: WintLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """The panel GEMM with its products on AMX tiles (cpu.amx_wint, where :func:`tiles_ready`)."""
    return run_linear("cpu.amx_wint", layout, x, bias, out, PANEL_GEMM_TILES)


def wint_strategies(layout: WintLayout) -> list[Strategy]:
    """The GEMV below the measured crossover (``WINT_LARGE_M``), the panel GEMM from it."""
    return [Strategy(layout.large_m - 1, "gemv", gemv), Strategy(ALL_M, "panel-gemm", panel_gemm)]


def tiles_ready(layout: WintLayout) -> bool:
    """Whether the library runs this weight's panel GEMM on AMX tiles (built with them, Linux granted
    them, whole 32-k tiles)."""
    return bool(_library().quantrt_wint_amx_ready(layout.desc))


class NativeWint(Kernel):
    """Integer weight-only layers (int2/3/4/8, symmetric or zero-point, group/channel/tensor scales,
    act-order) on AVX-512 BF16: exact integer codes times bf16 parts of x, fp32 sums and scales.

    The library keeps its scratch (bf16 activation parts, decoded panels) per thread, grown to the
    largest request (wint.cpp's ``Scratch``), so the prepared layer declares no workspace."""

    name = "cpu.native_wint"
    act_dtypes = CPU_DTYPES
    description = "native AVX-512 BF16 int2/3/4/8 weight-only GEMV (small M) and panel GEMM (large M)"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return can_run(spec, caps)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = prepare_wint(weight, spec)
        return self.prepared(layout, wint_strategies(layout), spec)


# -- W8A8 --------------------------------------------------------------------------------------


@dataclass
class W8A8Layout:
    tensors: dict[str, torch.Tensor]
    desc: ctypes.Array
    N: int
    K: int
    in_scale: float  # static activation scale, 0 for dynamic per-token scales
    large_m: int
    out_dtype: torch.dtype
    fn: Any

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors.values())


def w8a8_gemv(
    layout: W8A8Layout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """Activation codes made per call, then the int8 GEMV."""
    return run_linear(NativeW8A8Int8.name, layout, x, bias, out, GEMV, (layout.in_scale,))


def w8a8_gemm(
    layout: W8A8Layout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """Activation codes made per call, then the int8 GEMM over blocks of 4 tiles."""
    return run_linear(NativeW8A8Int8.name, layout, x, bias, out, PANEL_GEMM, (layout.in_scale,))


class NativeW8A8Int8(Kernel):
    """W8A8 int8 (per-channel/tensor weights, per-token dynamic or static per-tensor activations)
    with AVX-512 VNNI: activation codes as torchops makes them, exact int32 sums, fp32 scales.
    Its scratch is the library's own per thread, as cpu.native_wint's."""

    name = "cpu.native_w8a8_int8"
    act_dtypes = CPU_DTYPES
    description = "native AVX-512 VNNI int8 x int8 GEMV/GEMM, per-token or static activation scales"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        per_token = s.act_granularity == "token" and s.act_dynamic
        static = s.act_granularity == "tensor" and not s.act_dynamic
        return check(
            (
                s.weight == "int" and s.bits == 8 and s.symmetric,
                "symmetric int8 weights",
                {"weight": s.weight, "bits": s.bits, "symmetric": s.symmetric},
            ),
            (s.act == "int8", "scheme.act == 'int8'", {"act": s.act}),
            (
                s.granularity in ("channel", "tensor"),
                "channel or tensor weight scales",
                {"granularity": s.granularity},
            ),
            (
                per_token or static,
                "dynamic per-token or static per-tensor activations",
                {"act_granularity": s.act_granularity, "act_dynamic": s.act_dynamic},
            ),
            # |sum of K products| <= K * 255 * 128 must fit int32
            (spec.K_part <= 65536, "K <= 65536", {"K": spec.K_part}),
        ) and native_verdict(caps, W8A8_FEATURES)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        N, K = weight.N, weight.K
        Np, Kp = round_up(N, TILE), round_up(K, 4)
        c = torch.full((Np, Kp), 128, dtype=torch.uint8)
        c[:N, :K] = weight["qweight"]
        q = c.view(Np // TILE, TILE, Kp // 4, 4).permute(0, 2, 1, 3).contiguous()
        scales = torch.zeros(Np, dtype=torch.float32)
        scales[:N] = per_channel_scales(weight)
        in_scale = weight.get("input_scale")
        tensors = {"q": q, "scales": scales}
        values = {**tensors, "N": N, "K": K, "Kp": Kp, "T": Np // TILE}
        layout = W8A8Layout(
            tensors,
            _descriptor(W8A8_FIELDS, values),
            N,
            K,
            0.0 if in_scale is None else float(in_scale.float().max()),
            W8A8_LARGE_M,
            spec.output_dtype,
            _library().quantrt_w8a8_linear,
        )
        strategies = [Strategy(W8A8_LARGE_M - 1, "gemv", w8a8_gemv), Strategy(ALL_M, "gemm", w8a8_gemm)]
        return self.prepared(layout, strategies, spec)


def quantize_activations(x: torch.Tensor, in_scale: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The W8A8 kernel's activation codes [M, K] int8 and scales [M] fp32 (tests compare them with torch's)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.int8)
    a = torch.empty(M, dtype=torch.float32)
    rc = _library().quantrt_w8a8_quantize(
        x.data_ptr(), DTYPE_CODE[x.dtype], M, x.stride(0), x.stride(1), K, in_scale, q.data_ptr(), a.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    check_rc(rc, "w8a8 activation quantization")
    return q, a


def dequant_rows(layout: WintLayout, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
    """Rows [n0, n1) of the dequantized weight ``(q - z) * s`` (fp32, rounded once to ``out``'s dtype)
    from the prepared layout into ``out`` [n1 - n0, K] (fp32, bf16 or fp16, unit column stride)."""
    check_rows(layout.N, layout.K, n0, n1, out)
    rc = _library().quantrt_wint_dequant_rows(
        layout.desc, n0, n1, out.data_ptr(), DTYPE_CODE[out.dtype], out.stride(0), torch.get_num_threads()
    )
    if rc:
        raise RuntimeError(f"wint dequant_rows: the native code refused rows [{n0}, {n1}) (code {rc})")
    return out
