"""GGUF (llama.cpp's block types) on x86 CPUs: native integer dot products, as llama.cpp runs them.

``cpu.native_gguf`` keeps each weight in llama.cpp's blocks, regrouped once at load so that 16 rows'
copies of every field sit side by side (see ``native/csrc/gguf.cpp``): one AVX-512 VNNI instruction
then serves 16 output rows. Like llama.cpp it quantizes the activations per call, to 8-bit blocks
(Q8_0-style blocks of 32 for the legacy types, Q8_K-style blocks of 256 for the K-quants), so its
numbers are llama.cpp's, not the fp32 weight-only reference's; the tests hold it to both.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.schemes import GGUF_TYPES
from quantrt.specs import LayerSpec

from .native import build
from .native_common import CPU_DTYPES, DTYPE_CODE, check_call, check_rows

#: the C library's type codes
TYPE_CODES = {
    t: i
    for i, t in enumerate(("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"))
}
#: what the library's 16-row SIMD path is compiled for (it is built with -march=native)
SIMD_FEATURES = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
#: what the AVX2 paths are compiled for (the library built for x86-64-v3)
AVX2_FEATURES = frozenset({"avx2", "fma", "f16c"})
#: the types the AVX2 build runs in 16-row groups (the layout of the AVX-512 build, read 8 rows at a
#: time); the others keep canonical rows there (csrc/gguf.cpp's ``grouped``)
AVX2_GROUPED = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q5_k", "q6_k"})
ACT_QUANT = (
    "activations quantized per call to int8 blocks as llama.cpp does "
    "(Q8_0-style blocks of 32 for legacy types, Q8_K-style blocks of 256 for K-quants)"
)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C signatures once per process, so a call converts no argument by guesswork."""
    i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
    lib.quantrt_gguf_group_rows_of.restype = i32
    lib.quantrt_gguf_group_rows_of.argtypes = [i32]
    lib.quantrt_gguf_ws_row.restype = i64
    lib.quantrt_gguf_ws_row.argtypes = [i32, i64]
    fn = lib.quantrt_gguf_linear
    fn.restype = i32
    fn.argtypes = [i32, ptr, i64, i64, i64, ptr, i64, i64, i64, i32, ptr, i32, ptr, i64, i32, ptr, i32]
    lib.quantrt_gguf_dequant_rows.restype = i32
    lib.quantrt_gguf_dequant_rows.argtypes = [i32, ptr, i64, i64, i64, i64, i64, ptr, i32, i64, i32]
    lib.quantrt_gguf_tiles_ready.restype = i32
    lib.quantrt_gguf_tiles_ready.argtypes = []
    lib.quantrt_gguf_linear_tiles.restype = i32
    lib.quantrt_gguf_linear_tiles.argtypes = [
        i32,
        ptr,
        i64,
        i64,
        i64,
        ptr,
        i64,
        i64,
        ptr,
        i32,
        ptr,
        i64,
        i32,
        i32,
    ]
    return lib


_LIBS: dict[str, ctypes.CDLL] = {}


def native_library(isa: str = "native") -> ctypes.CDLL:
    """The ``gguf`` library built for ``isa`` with its signatures declared (built on first use)."""
    if isa not in _LIBS:
        _LIBS[isa] = _bind(build.library("gguf", isa))
    return _LIBS[isa]


def library_isa(caps: Any) -> str:
    """The build a CPU runs: the host's own where it has AVX-512 VNNI (the 16-row groups) or is an Arm
    CPU (the NEON rows), else the x86-64-v3 one (AVX2), with AVX-VNNI's VPDPBUSD where the CPU has it
    (``avx2_vnni``). Without capabilities (a kernel made by hand): the host's."""
    if caps is None or SIMD_FEATURES <= caps.features or _arm(caps):
        return "native"
    return "avx2_vnni" if "avx_vnni" in caps.features else "avx2"


def _isa_name(isa: str) -> str:
    """How notes name the x86-64-v3 builds."""
    return "AVX2 + AVX-VNNI" if isa.startswith("avx2_vnni") else "AVX2"


def _arm(caps: Any) -> bool:
    return caps.arch == "aarch64" and "neon" in caps.features


# -- the load-time layout ------------------------------------------------------------------------------


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 packed bytes [..., 12] -> 8 six-bit scales and 8 mins, one byte each."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0xF) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k3_scales(s: torch.Tensor) -> torch.Tensor:
    """Q3_K: 12 packed bytes [..., 12] -> 16 signed scales (stored value minus 32) as int8 bytes."""
    low = torch.cat([s[..., :8] & 0xF, s[..., :8] >> 4], dim=-1)
    high = torch.cat([(s[..., 8:12] >> (2 * j)) & 3 for j in range(4)], dim=-1)
    return ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).view(torch.uint8)


def _fields(t: str, b: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """A row's blocks [R, nb, T] as the group layout's fields in order, each with its transpose unit:
    2 = an f16, 1 = bytes ([byte][row]), 4 = code words (64-byte planes). See csrc/gguf.cpp."""
    f16, byte, word = 2, 1, 4
    if t == "q4_0":
        return [(b[..., 0:2], f16), (b[..., 2:18], word)]
    if t == "q4_1":
        return [(b[..., 0:2], f16), (b[..., 2:4], f16), (b[..., 4:20], word)]
    if t == "q5_0":
        return [(b[..., 0:2], f16), (b[..., 2:6], word), (b[..., 6:22], word)]
    if t == "q5_1":
        return [(b[..., 0:2], f16), (b[..., 2:4], f16), (b[..., 4:8], word), (b[..., 8:24], word)]
    if t == "q8_0":
        return [(b[..., 0:2], f16), (b[..., 2:34], word)]
    if t == "q2_k":
        return [(b[..., 80:82], f16), (b[..., 82:84], f16), (b[..., 0:16], byte), (b[..., 16:80], word)]
    if t == "q3_k":
        sc = _k3_scales(b[..., 96:108])
        return [(b[..., 108:110], f16), (sc, byte), (b[..., 0:32], word), (b[..., 32:96], word)]
    if t in ("q4_k", "q5_k"):
        sc, mn = _k4_scales(b[..., 4:16])
        head = [(b[..., 0:2], f16), (b[..., 2:4], f16), (sc, byte), (mn, byte)]
        if t == "q4_k":
            return [*head, (b[..., 16:144], word)]
        return [*head, (b[..., 16:48], word), (b[..., 48:176], word)]
    if t == "q6_k":
        return [
            (b[..., 208:210], f16),
            (b[..., 192:208], byte),
            (b[..., 0:128], word),
            (b[..., 128:192], word),
        ]
    raise AssertionError(t)


#: Q6_K's 48 code planes (32 of ql, then 16 of qh) in the order the kernel reads them: per (n, h), ql
#: words 16n + 4h + c, ql words 16n + 8 + 4h + c, qh words 8n + 4h + c, c < 4 (csrc/gguf.cpp)
PLANE_ORDER = {
    "q6_k": [
        w
        for n in range(2)
        for h in range(2)
        for w in (
            *(16 * n + 4 * h + c for c in range(4)),
            *(16 * n + 8 + 4 * h + c for c in range(4)),
            *(32 + 8 * n + 4 * h + c for c in range(4)),
        )
    ]
}


def _group_parts(blocks: torch.Tensor, gguf_type: str, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [G, group, nb, T] -> (code planes [G, nb, P * group], scale fields [G, nb, F * group])."""
    G, _, nb, _ = blocks.shape
    planes, fields = [], []
    for f, unit in _fields(gguf_type, blocks):
        L = f.shape[-1]
        part = f.reshape(G, group, nb, L // unit, unit).permute(0, 2, 3, 1, 4).reshape(G, nb, L * group)
        (planes if unit == 4 else fields).append(part)
    p, q = torch.cat(planes, dim=-1), torch.cat(fields, dim=-1)
    if gguf_type in PLANE_ORDER:
        p = p.reshape(G, nb, -1, 4 * group)[:, :, PLANE_ORDER[gguf_type]].reshape(G, nb, -1)
    return p, q


#: rows regrouped per step: bounds the temporaries of a large layer (a tied output layer over a
#: 262144-row vocabulary) to a few MB beyond its output
CHUNK_ROWS = 4096


def group_layout(qweight: torch.Tensor, gguf_type: str, group: int) -> torch.Tensor:
    """Canonical blocks [N, K/B*T] -> the kernel's layout (flat uint8): the code planes of N // group
    groups of ``group`` rows, then their scale fields, each transposed across the group's rows, then
    the remaining rows canonical (see csrc/gguf.cpp). ``group`` = 0 keeps every row canonical.
    Written chunk by chunk into one buffer, so the peak is the output plus one chunk."""
    _, T, _ = GGUF_TYPES[gguf_type]
    N, row_bytes = qweight.shape
    nb = row_bytes // T
    G = N // group if group else 0
    tail = qweight[G * group :].reshape(-1)
    if not G:
        return tail.contiguous().clone()
    step = max(1, CHUNK_ROWS // group)
    out = None
    for g0 in range(0, G, step):
        g1 = min(G, g0 + step)
        p, q = _group_parts(qweight[g0 * group : g1 * group].reshape(g1 - g0, group, nb, T), gguf_type, group)
        pb, fb = p[0].numel(), q[0].numel()  # the unpacked K-quant scales make a group larger than stored
        if out is None:
            out = torch.empty(G * (pb + fb) + tail.numel(), dtype=torch.uint8)
        out[g0 * pb : g1 * pb] = p.reshape(-1)
        out[G * pb + g0 * fb : G * pb + g1 * fb] = q.reshape(-1)
    out[G * (pb + fb) :] = tail
    return out


# -- the kernel ----------------------------------------------------------------------------------------


@dataclass
class GGUFLayout:
    """A prepared weight and what each call needs, computed once."""

    weight: torch.Tensor  # the group layout (flat uint8, see group_layout)
    lib: ctypes.CDLL  # the build that prepared it (its group rows are this layout's)
    isa: str  # that build's ISA level
    type_code: int
    gguf_type: str
    N: int
    K: int
    groups: int  # 16-row groups (the rows after them stay canonical)
    ws_row: int  # workspace bytes per activation row (its 8-bit blocks)
    out_dtype: torch.dtype
    fn: Any

    @property
    def nbytes(self) -> int:
        return self.weight.untyped_storage().nbytes()


def can_run(spec: LayerSpec, caps: Any) -> Verdict:
    """cpu.native_gguf's requirements (the AMX kernel adds its own): the type, whole blocks, AVX2 and a
    toolchain; the note names the path (16-row VNNI groups or scalar code)."""
    s = spec.scheme
    gtype = s.gguf_type or ""
    block = GGUF_TYPES[gtype][0] if gtype in GGUF_TYPES else 1
    verdict = check(
        (s.weight == "gguf", "weight == 'gguf'", {"weight": s.weight}),
        (gtype in TYPE_CODES, f"gguf_type in {sorted(TYPE_CODES)}", {"gguf_type": s.gguf_type}),
        (spec.K_part % block == 0, f"K % {block} == 0 (whole {gtype} blocks)", {"K": spec.K_part}),
        (
            AVX2_FEATURES <= caps.features or _arm(caps),
            "an x86 CPU with AVX2, FMA, F16C, or an Arm CPU with NEON",
            {"arch": caps.arch, "features": _isa(caps)},
        ),
    )
    if not verdict:
        return verdict
    ok, why = build.status()
    if not ok:
        return Verdict.no("a native build toolchain", note=why)
    if _arm(caps):
        f = caps.features
        dot = "SDOT" if "dotprod" in f else "widening multiplies (no dotprod)"
        mm = ", SMMLA for pairs of rows (i8mm)" if "i8mm" in f else ""
        sve = ", 32 codes per SVE vector where vectors hold 256 bits" if "sve" in f else ""
        path = f"NEON build, canonical rows, 16 codes per vector, {dot}{mm}{sve}"
    else:
        path = (
            "AVX-512 VNNI, 16 rows per group"
            if library_isa(caps) == "native"
            else (
                "AVX2 build (x86-64-v3"
                + (" with AVX-VNNI" if library_isa(caps) == "avx2_vnni" else "")
                + "), "
                + ("16-row groups" if gtype in AVX2_GROUPED else "canonical rows, 32 codes per vector")
                + " (no AVX-512 F/BW/VL/VNNI)"
            )
        )
    return Verdict.yes(f"{path}; {ACT_QUANT}")


def prepare_layout(weight: CanonicalWeight, spec: LayerSpec, isa: str = "native") -> GGUFLayout:
    """The canonical blocks regrouped into the layout of the ``isa`` build's kernel (the load-time
    work of every kernel on this layout, cpu.amx_gguf's included)."""
    t = (weight.scheme.gguf_type or "").lower()
    B, T, _ = GGUF_TYPES[t]
    q = weight["qweight"]
    want = (weight.N, weight.K // B * T)
    if q.dtype != torch.uint8 or tuple(q.shape) != want or weight.K % B:
        raise ValueError(
            f"{t} qweight for N={weight.N}, K={weight.K} must be uint8 {list(want)}, "
            f"found {q.dtype} {list(q.shape)}"
        )
    lib = native_library(isa)
    code = TYPE_CODES[t]
    group = lib.quantrt_gguf_group_rows_of(code)
    return GGUFLayout(
        weight=group_layout(q.cpu(), t, group),
        lib=lib,
        isa=isa,
        type_code=code,
        gguf_type=t,
        N=weight.N,
        K=weight.K,
        groups=weight.N // group if group else 0,
        ws_row=lib.quantrt_gguf_ws_row(code, weight.K),
        out_dtype=spec.output_dtype,
        fn=lib.quantrt_gguf_linear,
    )


def workspace_bytes(spec: LayerSpec, max_m: int, isa: str = "native") -> int:
    """The 8-bit activation blocks of ``max_m`` rows (what :func:`linear` quantizes into)."""
    return max(max_m, 0) * native_library(isa).quantrt_gguf_ws_row(
        TYPE_CODES[spec.scheme.gguf_type or ""], spec.K_part
    )


def linear(
    layout: GGUFLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
    workspace: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """One call of ``quantrt_gguf_linear``: the GEMV for one row, the GEMM from two (the C code
    picks), the activation blocks quantized into ``workspace`` (the prepared layer's; a fresh one
    when it is missing or too small, as for a strategy called beyond its kernel's batch sizes)."""
    check_call(x, bias, layout.N)
    M = x.shape[0]
    y = torch.empty((M, layout.N), dtype=layout.out_dtype) if out is None else out
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if workspace is None or workspace.numel() < M * layout.ws_row:
        workspace = torch.empty(M * layout.ws_row, dtype=torch.uint8)
    rc = layout.fn(
        layout.type_code, layout.weight.data_ptr(), layout.N, layout.K, layout.groups,
        x.data_ptr(), M, x.stride(0), x.stride(1), DTYPE_CODE[x.dtype],
        None if bias is None else bias.data_ptr(), 0 if bias is None else DTYPE_CODE[bias.dtype],
        y.data_ptr(), y.stride(0), DTYPE_CODE[y.dtype], workspace.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"cpu.native_gguf: the native kernel refused its arguments (code {rc})")
    return y


def gguf_strategies(layout: GGUFLayout) -> list[Strategy]:
    """The native GEMV (one row) and GEMM (more), one C entry point that picks between them."""
    path = (
        f"16-row groups ({'AVX-512 VNNI' if layout.isa == 'native' else _isa_name(layout.isa)})"
        if layout.groups
        else "canonical rows"
    )
    return [
        Strategy(1, f"GEMV over {path}; {ACT_QUANT}", linear),
        Strategy(
            ALL_M,
            f"GEMM, each weight block decoded once per 4 activation rows over {path}; {ACT_QUANT}",
            linear,
        ),
    ]


def linear_tiles(
    layout: GGUFLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
    workspace: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """One call of ``quantrt_gguf_linear_tiles`` (bf16 activations on AMX tiles, cpu.amx_gguf)."""
    check_call(x, bias, layout.N)
    M = x.shape[0]
    xb = x.to(torch.bfloat16).contiguous()
    y = torch.empty((M, layout.N), dtype=layout.out_dtype) if out is None else out
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    rc = layout.lib.quantrt_gguf_linear_tiles(
        layout.type_code, layout.weight.data_ptr(), layout.N, layout.K, layout.groups, xb.data_ptr(), M,
        xb.stride(0), None if bias is None else bias.data_ptr(), 0 if bias is None else DTYPE_CODE[bias.dtype],
        y.data_ptr(), y.stride(0), DTYPE_CODE[y.dtype], torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"cpu.amx_gguf: the AMX tile kernel refused its arguments (code {rc})")
    return y


def dequant_rows(layout: GGUFLayout, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
    """Rows [n0, n1) of the exactly dequantized weight (weights only: no activation quantization)
    from the prepared layout into ``out`` [n1 - n0, K] (fp32, bf16 or fp16, unit column stride): the
    reference's fp32 values, rounded once to ``out``'s dtype."""
    check_rows(layout.N, layout.K, n0, n1, out)
    rc = layout.lib.quantrt_gguf_dequant_rows(
        layout.type_code, layout.weight.data_ptr(), layout.N, layout.K, layout.groups, n0, n1, out.data_ptr(),
        DTYPE_CODE[out.dtype], out.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"gguf dequant_rows: the native code refused rows [{n0}, {n1}) (code {rc})")
    return out


def rows(layout: GGUFLayout, n0: int, n1: int) -> torch.Tensor:
    """The prepared layer's exact row access (a tied embedding's lookup): fp32 [n1 - n0, K]."""
    return dequant_rows(layout, n0, n1, torch.empty(n1 - n0, layout.K, dtype=torch.float32))


class CpuNativeGGUF(Kernel):
    """llama.cpp's block types with llama.cpp's arithmetic: 8-bit activation blocks, integer dots."""

    name = "cpu.native_gguf"
    act_dtypes = CPU_DTYPES
    #: not part of the Kernel contract: tells tests and tools that this kernel's numbers include an
    #: activation quantization the scheme (weight-only GGUF) does not state (so 1e-2, not 1e-5, of
    #: the fp32 reference)
    quantizes_activations = True
    description = (
        "native C++ GGUF kernel (Q4_0..Q8_0, Q2_K..Q6_K blocks, 16 rows per AVX-512 VNNI lane group, "
        "or canonical rows in an AVX2 build); " + ACT_QUANT
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return can_run(spec, caps)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = prepare_layout(weight, spec, library_isa(self.caps))
        return self.prepared(layout, gguf_strategies(layout), spec, rows=rows)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return workspace_bytes(spec, max_m, library_isa(self.caps))


def _isa(caps: Any) -> str:
    feats = sorted(f for f in caps.features if f.startswith(("avx", "sse", "neon", "sve")))
    return ",".join(feats) or "none"
