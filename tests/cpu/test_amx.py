"""The AMX kernels (backends/cpu/amx.py), their composed strategies and the native dequant_rows
their dequant path runs on.

- dequant_rows of every native layout equals the reference's fp32 dequantization rounded to bf16,
  bit for bit, for row ranges that start and end inside a row tile;
- the AMX kernels' calls, below and at/above their ``amx_from_m``, against the fp32 reference (DESIGN.md's
  relative Frobenius error < 1e-2; bf16 activations). This CPU need not have AMX: the kernel classes
  are instantiated directly, the dequant path forced through ``strategies(...)``, and oneDNN's bf16
  matmul runs the same arithmetic on AVX-512 BF16;
- dispatch picks them with the spr-amx capabilities and not with zen4's, and says why.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu import amx, gguf_native, lut_native, wint_native
from quantrt.capability import load_preset, probe
from quantrt.dispatch import select
from quantrt.kernels import registry
from quantrt.prepared import Prepared, Strategy
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

LOOSE = 1e-2
#: kernels that quantize activations to 8-bit blocks (llama.cpp's scheme, the GGUF GEMM)
ACT8_LOOSE = 2e-2
CPU = probe().cpu
#: the native kernels' own verdicts on this machine (the AMX subclasses add only the AMX features)
HERE = lut_native.NativeLut.supports(LayerSpec(parse_scheme("w4a16-nvfp4"), 256, 256), CPU)
pytestmark = pytest.mark.skipif(not HERE, reason=f"native CPU kernels cannot run here: {HERE.reason}")

N, K = 70, 512  # N not a multiple of the 16-row tile


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm())


def kernel_for(scheme: str) -> type:
    s = parse_scheme(scheme)
    if s.weight == "gguf":
        return amx.AmxGGUF
    return amx.AmxWint if s.weight == "int" else amx.AmxLut


#: each AMX kernel's native kernel (same layout, same verdict below the AMX features), the native
#: module's dequant and its strategies
NATIVE = {
    amx.AmxGGUF: (gguf_native.CpuNativeGGUF, gguf_native.dequant_rows, gguf_native.gguf_strategies),
    amx.AmxWint: (wint_native.NativeWint, wint_native.dequant_rows, wint_native.wint_strategies),
    amx.AmxLut: (lut_native.NativeLut, lut_native.dequant_rows, lut_native.lut_strategies),
}


def fresh_weight(scheme: str, n: int = N, k: int = K):
    dense = torch.randn(n, k, generator=torch.Generator().manual_seed(torch.seed() % 2**31))
    return reference.quantize(dense, scheme)


def prepared(scheme: str, act: torch.dtype = torch.bfloat16, out: torch.dtype | None = None, n: int = N):
    w = fresh_weight(scheme, n)
    spec = LayerSpec(w.scheme, w.K, w.N, act_dtype=act, out_dtype=out, output_sizes=w.output_sizes)
    cls = kernel_for(scheme)
    native = NATIVE[cls][0].supports(spec, CPU)
    assert native, native.reason
    k = cls()
    return w, k, k.prepare(w, spec)


def with_strategies(st: Prepared, strategies: Sequence[Strategy]) -> Prepared:
    """The same prepared layout run by other strategies (a path forced), its shape and dtypes kept."""
    return Prepared(
        st.layout,
        strategies,
        K=st.K,
        N=st.N,
        out_dtype=st.out_dtype,
        act_dtypes=st.act_dtypes,
        kernel=st.kernel,
    )


def dequant_of(k: object):
    return NATIVE[type(k)][1]


DEQUANT_SCHEMES = (
    "w4a16-int-g128-sym",
    "w4a16-int-g128-asym",
    "w8a16-int-ch-sym",
    "w3a16-int-g128-asym",
    "w2a16-int-g64-sym",
    "w4a16-nf4-g64-dq",
    "w4a16-bnbfp4-g64",
    "w4a16-mxfp4",
    "w4a16-nvfp4",
    "w8a16-fp8-block128",
    "w8a16-fp8e5m2-ch",
    "gguf-q4_0",
    "gguf-q5_1",
    "gguf-q8_0",
    "gguf-q2_k",
    "gguf-q3_k",
    "gguf-q4_k",
    "gguf-q5_k",
    "gguf-q6_k",
)


@pytest.mark.parametrize("scheme", DEQUANT_SCHEMES)
def test_dequant_rows_is_the_reference_rounded_once(scheme: str) -> None:
    w, k, st = prepared(scheme)
    dequant = dequant_of(k)
    ref = reference.dequantize(w)
    assert bool(torch.isfinite(ref).all())
    for n0, n1 in ((0, N), (5, 37), (17, 70), (33, 34), (9, 9)):
        for dt in (torch.bfloat16, torch.float32):
            out = torch.full((n1 - n0, K), float("nan"), dtype=dt)
            dequant(st.layout, n0, n1, out)
            want = ref[n0:n1].to(dt)
            bad = (out != want).sum().item()
            assert torch.equal(out, want), f"{scheme} rows [{n0}, {n1}) {dt}: {bad} values differ"
    # a strided destination (row stride > K), as a slice of a wider buffer
    wide = torch.zeros(N, K + 48, dtype=torch.bfloat16)
    dequant(st.layout, 0, N, wide[:, :K])
    assert torch.equal(wide[:, :K], ref.bfloat16()) and not wide[:, K:].any()


def test_dequant_rows_refuses_bad_ranges() -> None:
    _, _, st = prepared("w4a16-int-g128-sym")
    with pytest.raises(ValueError, match="not within"):
        wint_native.dequant_rows(st.layout, 10, N + 1, torch.empty(N - 9, K, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        wint_native.dequant_rows(st.layout, 0, 16, torch.empty(16, K, dtype=torch.float64))
    _, _, gst = prepared("gguf-q4_k")
    with pytest.raises(ValueError, match="out must be"):
        gguf_native.dequant_rows(gst.layout, 0, 16, torch.empty(15, K, dtype=torch.bfloat16))


APPLY_SCHEMES = (
    "w4a16-int-g128-sym",
    "w4a16-int-g128-asym",
    "w8a16-int-ch-sym",
    "w3a16-int-g128-asym",
    "w4a16-nf4-g64-dq",
    "w4a16-mxfp4",
    "w4a16-nvfp4",
    "w8a16-fp8-block128",
    "gguf-q4_k",
    "gguf-q6_k",
    "gguf-q8_0",
    "gguf-q2_k",
)


@pytest.mark.parametrize("scheme", APPLY_SCHEMES)
def test_apply_below_and_above_the_threshold(scheme: str) -> None:
    w, k, st = prepared(scheme)
    # the dequant + oneDNN path (what a K with no whole 32-k tiles takes on AMX CPUs), by default
    # from amx_from_m rows in slices of a whole number of row tiles
    default = with_strategies(st, k.strategies(st.layout, tiles=False))
    first = default.strategy(k.amx_from_m).name
    assert first.startswith(f"amx: dequant bf16 slices of {amx.slice_rows(N, K)} rows"), first
    assert amx.slice_rows(N, K) % amx.ROW_TILE == 0
    assert not default.strategy(k.amx_from_m - 1).name.startswith("amx")
    rows = amx.slice_rows(N, K, budget=2 * K * 32)  # 32-row slices: several slices, a partial last one
    assert rows == 32
    st = with_strategies(st, k.strategies(st.layout, tiles=False, rows=rows))
    for m in (1, 3, k.amx_from_m - 1, k.amx_from_m, k.amx_from_m + 5):
        x = torch.randn(m, K).bfloat16()
        y = k.apply(st, x)
        assert y.shape == (m, N) and y.dtype == torch.bfloat16
        err = rel(y, reference.linear(x, w, out_dtype=torch.float32))
        # below the threshold GGUF runs the parent's GEMM over 8-bit activation blocks: on one
        # row that error alone reaches 1e-2 on some draws (one in a few hundred)
        bound = ACT8_LOOSE if scheme.startswith("gguf") and m < k.amx_from_m else LOOSE
        assert err < bound, f"{scheme} M={m}: {err:.3g}"
        path = k.strategy(st, m)
        assert path.startswith("amx: dequant bf16 slices of 32 rows") == (m >= k.amx_from_m), path


@pytest.mark.parametrize("scheme", ("w4a16-int-g128-asym", "w4a16-nf4-g64-dq", "gguf-q4_k"))
def test_apply_strided_x_bias_out_and_empty(scheme: str) -> None:
    w, k, st = prepared(scheme, act=torch.float32, out=torch.float32)
    # the dequant + oneDNN path, from 16 rows, so the 40-row batches below take it
    st = with_strategies(st, k.strategies(st.layout, tiles=False, from_m=16))
    assert st.strategy(40).name.startswith("amx: dequant") and not st.strategy(2).name.startswith("amx")
    big = torch.randn(40, 2 * K)
    x = big[:, ::2]  # non-contiguous, fp32 (rounded to bf16 on the AMX path)
    assert not x.is_contiguous()
    bias = torch.randn(N)
    want = reference.linear(x, w, bias, out_dtype=torch.float32)
    y = k.apply(st, x, bias)
    assert y.dtype == torch.float32 and rel(y, want) < LOOSE
    out = torch.full((40, N), float("nan"))
    assert k.apply(st, x, bias, out=out) is out and rel(out, want) < LOOSE
    # out of another dtype, and a strided out
    out16 = torch.empty(40, N, dtype=torch.bfloat16)
    assert k.apply(st, x, bias, out=out16) is out16 and rel(out16, want) < LOOSE
    wide = torch.zeros(40, N + 6)
    k.apply(st, x, bias, out=wide[:, :N])
    assert rel(wide[:, :N], want) < LOOSE and not wide[:, N:].any()
    # bias below the threshold too, and M = 0
    assert rel(k.apply(st, x[:2], bias), want[:2]) < LOOSE
    assert k.apply(st, torch.empty(0, K)).shape == (0, N)


def test_scratch_is_bounded_and_shared_and_the_workspace_bounded() -> None:
    """The dequant path's bf16 scratch is one bounded buffer per thread, shared by every layer (not a
    per-layer workspace); cpu.amx_gguf's workspace holds the native path's activation blocks only for
    the batches below its AMX path, whatever the largest batch."""
    rows = amx.slice_rows(4096, 4096)
    assert rows % 16 == 0 and 2 * rows * 4096 <= amx.SCRATCH_BYTES
    assert amx.reused_scratch(rows, 4096).data_ptr() == amx.reused_scratch(16, 512).data_ptr()
    for scheme in ("w4a16-int-g128-sym", "w4a16-nf4-g64"):
        _, _, st = prepared(scheme)
        assert st.workspace(10_000) is None, scheme
    spec = LayerSpec(parse_scheme("gguf-q4_k"), 4096, 4096)
    k = amx.AmxGGUF()
    first = k.tiles_from("q4_k", 4096) or k.amx_from_m
    bounded = gguf_native.workspace_bytes(spec, first - 1)
    assert k.workspace_bytes(spec, 10_000) == bounded == k.workspace_bytes(spec, first - 1)
    assert k.workspace_bytes(spec, 3) == gguf_native.CpuNativeGGUF().workspace_bytes(spec, 3) >= 3 * 4096
    assert bounded < gguf_native.CpuNativeGGUF().workspace_bytes(spec, 10_000)


@pytest.mark.parametrize(
    ("scheme", "native", "amx_name"),
    (
        ("w4a16-int-g128-sym", "cpu.native_wint", "cpu.amx_wint"),
        ("w4a16-nf4-g64", "cpu.native_lut", "cpu.amx_lut"),
        ("w4a16-mxfp4", "cpu.native_lut", "cpu.amx_lut"),
        ("gguf-q4_k", "cpu.native_gguf", "cpu.amx_gguf"),
    ),
)
def test_dispatch_by_amx_features(scheme: str, native: str, amx_name: str) -> None:
    registry()
    spec = LayerSpec(parse_scheme(scheme), 512, 256, act_dtype=torch.bfloat16)
    spr = select(spec, "cpu", caps=load_preset("spr-amx"))
    assert spr.kernel.name == amx_name, spr.explain()
    zen = select(spec, "cpu", caps=load_preset("zen4"))
    assert zen.kernel.name == native, zen.explain()
    rejected = next(c for c in zen.candidates if c.name == amx_name)
    assert not rejected.verdict.ok and "AMX" in rejected.verdict.reason
    assert "amx_bf16" in rejected.verdict.reason


def test_w8a8_fp8_stays_on_the_native_kernel() -> None:
    spec = LayerSpec(parse_scheme("w8a8-fp8-tensor"), 512, 256)
    caps = load_preset("spr-amx").cpu
    assert lut_native.NativeLut.supports(spec, caps)
    v = amx.AmxLut.supports(spec, caps)
    assert not v and "weight-only" in v.reason


# -- the native panel GEMM on AMX tiles (qrt::amx_block in native/csrc/common.h) -------------------

#: the native libraries were built with AMX tiles and Linux granted them to this process
TILES = bool(wint_native._library().quantrt_wint_isa() & 4)
TILE_SCHEMES = (
    "w4a16-int-g128-sym",
    "w4a16-int-g128-asym",
    "w4a16-int-g128-asym-actorder",
    "w8a16-int-ch-sym",
    "w3a16-int-g128-asym",
    "w2a16-int-g64-sym",
    "w4a16-nf4-g64-dq",
    "w4a16-bnbfp4-g64",
    "w4a16-nvfp4",
    "w4a16-mxfp4",
    "w8a16-fp8-ch",
    "w8a16-fp8-block128",
    "w8a16-fp8e5m2-ch",
)


@pytest.mark.skipif(
    not TILES, reason="no AMX tiles on this CPU (or Linux refused them): the AVX-512 path runs"
)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("scheme", TILE_SCHEMES)
def test_panel_gemm_on_amx_tiles_matches_the_reference_and_the_avx512_path(
    scheme: str, dtype: torch.dtype
) -> None:
    """Every M from the threshold through several 16-row tiles and a partial one, strided x, a bias,
    fp32 output: against the fp32 reference (DESIGN.md's metric) and against the same panels on
    AVX-512 BF16 (the same exact bf16 products, fp32 sums in another order)."""
    w, k, st = prepared(scheme, act=dtype, out=torch.float32, n=N)
    assert st.strategy(k.TILES_FROM_M).name == "panel-gemm on AMX tiles"
    avx = with_strategies(st, NATIVE[type(k)][2](st.layout))  # the same layout on AVX-512 BF16
    bias = torch.randn(N)
    for m in (1, k.TILES_FROM_M - 1, k.TILES_FROM_M, 15, 16, 17, 33, 70):
        x = torch.randn(m, 2 * K)[:, ::2].to(dtype)
        y = k.apply(st, x, bias)
        path = k.strategy(st, m)
        assert (path == "panel-gemm on AMX tiles") == (m >= k.TILES_FROM_M), (m, path)
        assert rel(y, reference.linear(x, w, bias, out_dtype=torch.float32)) < LOOSE, (scheme, m)
        if m >= k.TILES_FROM_M:
            y_avx = avx(x, bias)
            assert avx.strategy(m).name in ("panel-gemm", "gemv")
            assert rel(y, y_avx) < 1e-5, (scheme, m, rel(y, y_avx))


@pytest.mark.skipif(not TILES, reason="no AMX tiles on this CPU (or Linux refused them)")
def test_without_whole_32_k_tiles_the_dequant_path_serves_large_batches() -> None:
    w = reference.quantize(torch.randn(N, 100), "w8a16-int-ch-sym")  # K = 100: no whole 32-k tiles
    k = amx.AmxWint()
    st = k.prepare(w, LayerSpec(w.scheme, 100, N, act_dtype=torch.bfloat16))
    assert not wint_native.tiles_ready(st.layout)
    assert k.strategy(st, k.amx_from_m).startswith("amx: dequant bf16 slices")
    x = torch.randn(k.amx_from_m + 3, 100).bfloat16()
    assert rel(k.apply(st, x), reference.linear(x, w, out_dtype=torch.float32)) < LOOSE


GGUF_TILES = bool(gguf_native.native_library().quantrt_gguf_tiles_ready())


@pytest.mark.skipif(not GGUF_TILES, reason="no AMX tiles on this CPU (or Linux refused them)")
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("t", ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0"))
def test_gguf_on_amx_tiles_matches_the_reference_and_the_dequant_path(t: str, dtype: torch.dtype) -> None:
    """Every row in a 16-row group (N = 80: a block of 4 groups and one of 1), K of two whole panel
    chunks and a partial one: from its TILES_FROM rows the tile kernel, against the fp32 reference
    (activations rounded to bf16 on this path) and the dequant + oneDNN path (the same bf16 weights)."""
    n, kk = 80, 2048 * 2 + 256 * 5  # two whole panel chunks and a partial one
    w = reference.quantize(torch.randn(n, kk) * 0.05, f"gguf-{t}")
    k = amx.AmxGGUF()
    st = k.prepare(w, LayerSpec(w.scheme, kk, n, act_dtype=dtype, out_dtype=torch.float32))
    tiles_from = k.tiles_from(t, n)
    assert tiles_from == k.TILES_FROM[t]
    bias = torch.randn(n)
    via_dequant = with_strategies(st, k.strategies(st.layout, tiles=False, from_m=1))
    assert via_dequant.strategy(1).name.startswith("amx: dequant")
    for m in (tiles_from - 1, tiles_from, 33, 70):
        x = torch.randn(m, 2 * kk)[:, ::2].to(dtype)
        y = k.apply(st, x, bias)
        tiles = k.strategy(st, m).startswith("amx tiles")
        assert tiles == (m >= tiles_from)
        assert rel(y, reference.linear(x, w, bias, out_dtype=torch.float32)) < LOOSE, m
        if tiles:
            assert rel(y, k.apply(via_dequant, x, bias)) < 5e-3, m
    out = torch.full((40, n), float("nan"), dtype=torch.bfloat16)
    x = torch.randn(40, kk).to(dtype)
    assert (
        k.apply(st, x, out=out) is out and rel(out, reference.linear(x, w, out_dtype=torch.float32)) < LOOSE
    )


@pytest.mark.skipif(not GGUF_TILES, reason="no AMX tiles on this CPU (or Linux refused them)")
def test_gguf_tiles_only_for_their_types_with_whole_groups() -> None:
    _, k, st = prepared("gguf-q4_k", n=70)  # 70 rows: 6 ungrouped rows stay canonical
    assert k.tiles_from("q4_k", 70) is None and not k.strategy(st, 100).startswith("amx tiles")
    assert k.strategy(st, k.amx_from_m).startswith("amx: dequant")
    for t in ("gguf-q2_k", "gguf-q3_k", "gguf-q5_0", "gguf-q5_1"):
        _, k, st = prepared(t, n=80)
        assert k.tiles_from(t[5:], 80) is None, t
        assert not any(s.name.startswith("amx tiles") for s in st.strategies), t
