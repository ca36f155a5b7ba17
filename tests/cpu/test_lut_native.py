"""The native code-book/float CPU kernel (backends/cpu/lut_native.py, native/csrc/lut.cpp) against the fp32
reference on awkward shapes, dtypes, strides, codes and scales; the reference's dequantization against
math written here (the published NF4 table, the e2m1 value list, e4m3/e8m0 by formula); one prepared
layout within 1.10x of the checkpoint; dispatch picks it.

The kernel tested is the one this CPU gets: cpu.native_lut with AVX-512 BF16, else cpu.avx2_lut
(backends/cpu/lut_gemv.py) on the same layout; QUANTRT_CPU_ISA=avx2 runs this file on the AVX2
build here (ci/test.sh does)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu.lut_gemv import Avx2Lut
from quantrt.backends.cpu.lut_native import NativeLut
from quantrt.backends.cpu.native import build
from quantrt.canonical import CanonicalWeight
from quantrt.dispatch import machine_capabilities
from quantrt.layers import QuantLinear
from quantrt.reference.bnb import pack_bnb4
from quantrt.reference.fp4 import pack_fp4
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: exact bf16 weights (e2m1, fp8) times exact bf16 parts of x, fp32 sums: as tight as the reference's fp32
TIGHT = 1e-5
#: a bnb code book split into bf16 value + residual (fp32 activations): 16 bits of each code
CODEBOOK_F32 = 1e-4
#: 16-bit outputs, or a bnb code book rounded once to bf16 (16-bit activations); DESIGN.md's bound
LOOSE = 1e-2

CPU = machine_capabilities().cpu
#: dispatch prefers the AMX subclasses of the native weight-only kernels where the CPU has AMX tiles
AMX = {"amx_bf16", "amx_tile"} <= set(CPU.features)
_SPEC = LayerSpec(parse_scheme("w4a16-nvfp4"), 256, 256)
#: the kernel of this CPU (QUANTRT_CPU_ISA included): the AVX-512 build, else the AVX2 one
LUT = NativeLut if NativeLut.supports(_SPEC, CPU) else Avx2Lut
HERE = LUT.supports(_SPEC, CPU)
pytestmark = pytest.mark.skipif(not HERE, reason=f"{LUT.name} cannot run here: {HERE.reason}")
needs_panel = pytest.mark.skipif(LUT is not NativeLut, reason=f"{LUT.name} has one strategy (a GEMV)")

#: the NF4 code book as published with QLoRA (Dettmers et al. 2023, appendix E)
NF4_PUBLISHED = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)  # fmt: skip
#: e2m1 magnitudes of codes 0..7 (OCP MX v1.0); bit 3 is the sign
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm())


def tol(scheme: str, act: torch.dtype, out: torch.dtype) -> float:
    if out != torch.float32:
        return LOOSE
    if parse_scheme(scheme).family == "bnb4":
        return CODEBOOK_F32 if act == torch.float32 else 5e-3
    return TIGHT


def layer(w: CanonicalWeight, act: torch.dtype, out: torch.dtype | None = None) -> tuple:
    spec = LayerSpec(w.scheme, w.K, w.N, act_dtype=act, out_dtype=out, output_sizes=w.output_sizes)
    v = LUT.supports(spec, CPU)
    assert v, v.reason
    k = LUT()
    return k, k.prepare(w, spec)


def ref_linear(x: torch.Tensor, w: CanonicalWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 reference, activation quantization included for W8A8 schemes (the kernel applies it
    with torchops, then multiplies in exact fp32 parts)."""
    return reference.linear(x, w, bias, out_dtype=torch.float32)


# -- the reference's dequantization against independent math ---------------------------------


def e4m3_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 7
    return sign * (m / 8 * 2.0**-6 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))


def e2m1_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1_MAGNITUDES[code & 7]


def test_reference_dequant_nf4_matches_published_table() -> None:
    gen = torch.Generator().manual_seed(1)
    N, K, G = 6, 128, 64
    w = reference.quantize(torch.randn(N, K, generator=gen), "w4a16-nf4-g64")
    assert torch.equal(w["code"], torch.tensor(NF4_PUBLISHED, dtype=torch.float32))
    q, absmax = w["qweight"].tolist(), w["absmax"].tolist()
    want = torch.empty(N * K, dtype=torch.float64)
    for e in range(N * K):
        nib = (q[e // 2] >> 4) & 0xF if e % 2 == 0 else q[e // 2] & 0xF  # high nibble = even element
        want[e] = NF4_PUBLISHED[nib] * absmax[e // G]
    assert torch.allclose(reference.dequantize(w).double().reshape(-1), want, rtol=1e-7, atol=0)


@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4"])
def test_reference_dequant_e2m1_matches_value_list(scheme: str) -> None:
    gen = torch.Generator().manual_seed(2)
    N, K = 5, 64
    w = reference.quantize(torch.randn(N, K, generator=gen) * 3, scheme)
    nv = scheme.endswith("nvfp4")
    q = w["qweight"].tolist()
    s = w["scales"].view(torch.uint8).tolist()
    g = float(w["global_scale"][0]) if nv else 1.0
    want = torch.empty(N, K, dtype=torch.float64)
    for n in range(N):
        for k in range(K):
            code = q[n][k // 2] & 0xF if k % 2 == 0 else q[n][k // 2] >> 4  # low nibble = even k
            scale = e4m3_value(s[n][k // 16]) * g if nv else math.ldexp(1.0, s[n][k // 32] - 127)
            want[n, k] = e2m1_value(code) * scale
    assert torch.allclose(reference.dequantize(w).double(), want, rtol=1e-7, atol=0)


# -- the kernel against the reference ----------------------------------------------------------

#: (scheme, N, K): N=33 leaves a ragged tile; K is the smallest legal one or a ragged block
CASES = [
    ("w4a16-nf4-g64", 33, 64),
    ("w4a16-nf4-g64-dq", 33, 192),
    ("w4a16-bnbfp4-g64", 33, 64),
    ("w4a16-bnbfp4-g64-dq", 40, 128),
    ("w4a16-nvfp4", 33, 16),
    ("w4a16-nvfp4", 40, 272),
    ("w4a16-mxfp4", 33, 32),
    ("w4a16-mxfp4", 17, 160),
    ("w8a16-fp8-tensor", 33, 2),
    ("w8a16-fp8-ch", 33, 150),
    ("w8a16-fp8-block128", 33, 200),
    ("w8a16-fp8e5m2-tensor", 20, 96),
    ("w8a16-fp8e5m2-ch", 33, 64),
    ("w8a16-fp8e5m2-block128", 150, 130),
    ("w8a8-fp8-ch", 33, 128),
    ("w8a8-fp8-block128", 33, 256),
    ("w8a8-fp8-tensor", 33, 64),
    ("w8a8-fp8-ch-static", 33, 96),
]


@pytest.mark.parametrize("scheme,N,K", CASES)
def test_matches_reference(scheme: str, N: int, K: int) -> None:
    gen = torch.Generator().manual_seed(hash(scheme) % 1000 + K)
    w = reference.quantize(torch.randn(N, K, generator=gen), scheme, calib=torch.randn(4, K, generator=gen))
    for act in DTYPES:
        k, st = layer(w, act, torch.float32)
        for M in (0, 1, 3, 17, 64):
            x = torch.randn(M, K, generator=gen).to(act)
            y = k.apply(st, x)
            assert y.shape == (M, N) and y.dtype == torch.float32
            if M:
                assert rel(y, ref_linear(x, w)) < tol(scheme, act, torch.float32), (
                    act,
                    M,
                    rel(y, ref_linear(x, w)),
                )


def row_error(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> float:
    """max |y - x W^T| / (|x| |W|^T) against double-precision math: the bound of an fp32 dot product,
    so rows of very different magnitude (and rows that cancel) are each held to fp32 accuracy."""
    x, dense = x.double(), dense.double()
    return float(((y.double() - x @ dense.T).abs() / (x.abs() @ dense.abs().T)).max())


def test_nvfp4_every_code_and_extreme_scales() -> None:
    """Every e2m1 code in every row; e4m3 scales 0, subnormal, 448 and negative; global scales far apart."""
    gen = torch.Generator().manual_seed(3)
    N, K = 48, 256
    codes = torch.randint(0, 16, (N, K), generator=gen)
    codes[:, :16] = torch.arange(16)
    sbytes = torch.randint(0, 0x7F, (N, K // 16), generator=gen, dtype=torch.uint8)  # no NaN (0x7f)
    sbytes[:, 0] = torch.tensor([0x00, 0x01, 0x07, 0x08, 0x7E, 0xBE])[torch.arange(N) % 6]
    g = torch.tensor([1e-6, 1.0, 3e4])
    w = CanonicalWeight(
        parse_scheme("w4a16-nvfp4"), N, K,
        {"qweight": pack_fp4(codes), "scales": sbytes.view(torch.float8_e4m3fn), "global_scale": g},
        (16, 16, 16),
    )  # fmt: skip
    k, st = layer(w, torch.float32, torch.float32)
    for M in (1, 33):
        x = torch.randn(M, K, generator=gen)
        assert row_error(k.apply(st, x), x, reference.dequantize(w)) < TIGHT


def test_mxfp4_e8m0_extremes_against_double_math() -> None:
    """E = 0 (2^-127, an fp32 subnormal) up to 254 (2^127): the kernel scales fp32 sums, so compare each
    output row with double-precision math written here (the fp32 reference underflows at E = 0)."""
    gen = torch.Generator().manual_seed(4)
    N, K = 32, 128
    codes = torch.randint(0, 16, (N, K), generator=gen)
    codes[:, :16] = torch.arange(16)
    E = torch.randint(100, 150, (N, K // 32), generator=gen, dtype=torch.uint8)
    E[:, 0] = torch.tensor([0, 1, 2, 127, 200, 252, 253, 254], dtype=torch.uint8)[torch.arange(N) % 8]
    E[:, 1:] = E[:, :1]  # one exponent per row, so every row's sum stays finite
    w = CanonicalWeight(parse_scheme("w4a16-mxfp4"), N, K, {"qweight": pack_fp4(codes), "scales": E})
    values = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)[codes]
    dense = values * torch.pow(2.0, E.double() - 127).repeat_interleave(32, dim=1)
    k, st = layer(w, torch.float32, torch.float32)
    for M in (1, 40):
        x = torch.randn(M, K, generator=gen) * 0.01
        assert row_error(k.apply(st, x), x, dense) < TIGHT
    bad = dataclasses.replace(w, tensors={**w.tensors, "scales": torch.full_like(E, 255)})
    with pytest.raises(ValueError, match="255"):
        LUT().prepare(bad, LayerSpec(w.scheme, K, N))


@needs_panel
def test_mxfp4_scales_go_into_the_panel_only_where_exact_in_bf16() -> None:
    """E in [64, 190] (lut_native.E8M0_EXACT) keeps every e2m1 value times 2^(E-127), and its products
    with activations, normal, so the panel GEMM multiplies the scales into the decoded panel (one fold
    per K chunk); one code outside turns that off. Both against double-precision math, on the GEMV
    and the panel GEMM."""
    from quantrt.backends.cpu.lut_native import E8M0_EXACT, FIELDS

    gen = torch.Generator().manual_seed(9)
    N, K = 40, 512
    codes = torch.randint(0, 16, (N, K), generator=gen)
    codes[:, :16] = torch.arange(16)
    lo, hi = E8M0_EXACT
    base = torch.tensor([lo, 100, 127, 160, hi])[torch.arange(N) % 5]
    E = (base[:, None] - torch.randint(0, 3, (N, K // 32), generator=gen)).clamp(lo, hi).to(torch.uint8)
    for edge, pre in ((None, 1), (hi + 1, 0), (lo - 1, 0)):
        if edge is not None:
            E[3, 5] = edge
        w = CanonicalWeight(
            parse_scheme("w4a16-mxfp4"), N, K, {"qweight": pack_fp4(codes), "scales": E.clone()}
        )
        values = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)[codes]
        dense = values * torch.pow(2.0, E.double() - 127).repeat_interleave(32, dim=1)
        for act in (torch.float32, torch.bfloat16):
            k, st = layer(w, act, torch.float32)
            assert st.layout.desc[FIELDS.index("pre")] == pre, edge
            for M in (1, 40):
                x = (torch.randn(M, K, generator=gen) * 0.01).to(act)
                assert row_error(k.apply(st, x), x, dense) < TIGHT, (edge, act, M)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_every_finite_code(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    N, K = 150, 256  # two block rows, the second ragged
    finite = torch.arange(256, dtype=torch.uint8)
    finite = finite[torch.isfinite(finite.view(dtype).float())]
    q = finite[torch.randint(0, finite.numel(), (N, K), generator=gen)]
    q[:2, : finite.numel()] = finite[:K]  # every finite code at least once
    scheme = "w8a16-fp8-block128" if dtype == torch.float8_e4m3fn else "w8a16-fp8e5m2-block128"
    scales = torch.tensor([[1e-30, 1.0], [3e30, 0.5]])
    w = CanonicalWeight(parse_scheme(scheme), N, K, {"qweight": q.view(dtype), "scales": scales})
    for act in DTYPES:
        k, st = layer(w, act, torch.float32)
        for M in (1, 20):
            x = torch.randn(M, K, generator=gen).to(act) * 1e-3
            assert row_error(k.apply(st, x), x, reference.dequantize(w)) < TIGHT, (act, M)


def test_bnb_every_code_and_per_slice_offsets() -> None:
    """A fused layer's double quant: each slice's offset applies to its own rows; every code value."""
    gen = torch.Generator().manual_seed(6)
    N, K = 48, 128
    for scheme in ("w4a16-nf4-g64-dq", "w4a16-bnbfp4-g64-dq"):
        w = reference.quantize(torch.randn(N, K, generator=gen), scheme, output_sizes=(16, 24, 8))
        codes = torch.randint(0, 16, (N * K,), generator=gen)
        codes[:16] = torch.arange(16)
        tensors = {**w.tensors, "qweight": pack_bnb4(codes), "offset": torch.tensor([0.5, -0.25, 2.0])}
        w = dataclasses.replace(w, tensors=tensors)
        for act in (torch.float32, torch.bfloat16):
            k, st = layer(w, act, torch.float32)
            for M in (1, 5, 20):
                x = torch.randn(M, K, generator=gen).to(act)
                assert rel(k.apply(st, x), ref_linear(x, w)) < tol(scheme, act, torch.float32)


@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w8a16-fp8-tensor", "w8a16-fp8e5m2-tensor"])
def test_fused_per_slice_global_scales(scheme: str) -> None:
    gen = torch.Generator().manual_seed(7)
    mags = torch.tensor([1.0] * 32 + [300.0] * 16 + [1e-3] * 8)[:, None]
    w = reference.quantize(torch.randn(56, 256, generator=gen) * mags, scheme, output_sizes=(32, 16, 8))
    k, st = layer(w, torch.bfloat16, torch.float32)
    for M in (1, 30):
        x = torch.randn(M, 256, generator=gen).bfloat16()
        assert row_error(k.apply(st, x), x, reference.dequantize(w)) < TIGHT


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_bias_out_and_output_dtypes(out_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(8)
    w = reference.quantize(torch.randn(33, 192, generator=gen), "w4a16-mxfp4")
    bias = torch.randn(33, generator=gen).bfloat16()
    k, st = layer(w, torch.bfloat16, out_dtype)
    t = tol("w4a16-mxfp4", torch.bfloat16, out_dtype)
    for M in (1, 5, 40):
        x = torch.randn(M, 192, generator=gen).bfloat16()
        ref = ref_linear(x, w, bias)
        y = k.apply(st, x, bias)
        assert y.dtype == out_dtype and rel(y, ref) < t
        out = torch.full((M, 33), float("nan"), dtype=out_dtype)
        assert k.apply(st, x, bias, out=out) is out and rel(out, ref) < t
        wide = torch.full((M, 50), float("nan"), dtype=out_dtype)  # a strided view as out=
        assert rel(k.apply(st, x, bias, out=wide[:, 3:36]), ref) < t and wide[:, :3].isnan().all()
        assert rel(k.apply(st, x, bias.float()), ref) < t  # a bias in another dtype


def test_non_contiguous_activations() -> None:
    gen = torch.Generator().manual_seed(9)
    w = reference.quantize(torch.randn(48, 128, generator=gen), "w8a16-fp8-ch")
    k, st = layer(w, torch.bfloat16, torch.float32)
    for M in (1, 3, 20):
        base = torch.randn(M, 256, generator=gen).bfloat16()
        for x in (base[:, ::2], torch.randn(128, M, generator=gen).bfloat16().t(), base[:, 100:228]):
            y = k.apply(st, x)
            assert torch.equal(y, k.apply(st, x.contiguous()))
            assert rel(y, ref_linear(x, w)) < TIGHT


def test_threads_give_identical_results() -> None:
    gen = torch.Generator().manual_seed(10)
    before = torch.get_num_threads()
    try:
        for scheme in ("w4a16-nf4-g64-dq", "w4a16-nvfp4", "w8a16-fp8-block128"):
            w = reference.quantize(torch.randn(80, 512, generator=gen), scheme)
            k, st = layer(w, torch.bfloat16)
            for M in (1, 7, 64):
                x = torch.randn(M, 512, generator=gen).bfloat16()
                torch.set_num_threads(1)
                one = k.apply(st, x)
                torch.set_num_threads(2)
                assert torch.equal(one, k.apply(st, x))
    finally:
        torch.set_num_threads(before)


@needs_panel
@pytest.mark.parametrize("scheme", ["w4a16-nf4-g64", "w4a16-nvfp4", "w4a16-mxfp4", "w8a16-fp8-block128"])
def test_both_strategies_at_every_batch_size(scheme: str) -> None:
    """The GEMV and the large-M path, forced at the same M, both match the reference."""
    gen = torch.Generator().manual_seed(11)
    w = reference.quantize(torch.randn(40, 256, generator=gen), scheme)
    k, st = layer(w, torch.float32, torch.float32)
    gemv, panel = st.strategies[0], st.strategies[-1]
    assert (gemv.name, panel.name) == ("gemv", "panel-gemm")
    for M in (1, 2, 5, 9, 13):
        x = torch.randn(M, 256, generator=gen)
        assert (k.strategy(st, M) == "gemv") == (M <= gemv.max_m)
        for s in (gemv, panel):
            y = s.fn(st.layout, x, None, None, None)
            assert rel(y, ref_linear(x, w)) < tol(scheme, x.dtype, torch.float32), (M, s.name)


@pytest.mark.parametrize(
    "scheme",
    "w4a16-nf4-g64 w4a16-nf4-g64-dq w4a16-bnbfp4-g64-dq w4a16-nvfp4 w4a16-mxfp4 "
    "w8a16-fp8-tensor w8a16-fp8-ch w8a16-fp8-block128".split(),
)
def test_one_prepared_layout_within_checkpoint_size(scheme: str) -> None:
    N, K = 512, 4096
    w = reference.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(12)), scheme)
    _, st = layer(w, torch.bfloat16)
    assert st.layout.nbytes <= 1.10 * w.nbytes, (st.layout.nbytes, w.nbytes)
    if LUT is NativeLut:
        k = NativeLut()
        assert {k.strategy(st, 1), k.strategy(st, 64)} == {"gemv", "panel-gemm"}


def test_bad_calls_are_errors_not_overruns() -> None:
    gen = torch.Generator().manual_seed(13)
    k, st = layer(reference.quantize(torch.randn(33, 128, generator=gen), "w4a16-nvfp4"), torch.bfloat16)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    with pytest.raises(ValueError, match=r"activations \[M, 128\]"):
        k.apply(st, torch.randn(2, 64).bfloat16())
    with pytest.raises(ValueError, match=r"activations \[M, 128\]"):
        k.apply(st, x.double())
    with pytest.raises(ValueError, match=r"bias \[33\]"):
        k.apply(st, x, torch.randn(32))
    with pytest.raises(ValueError, match=r"out must have shape \[2, 33\]"):
        k.apply(st, x, out=torch.empty(2, 32))


# -- dispatch and supports -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme",
    "w4a16-nf4-g64 w4a16-nf4-g64-dq w4a16-bnbfp4-g64 w4a16-bnbfp4-g64-dq w4a16-nvfp4 w4a16-mxfp4 "
    "w8a16-fp8-tensor w8a16-fp8-ch w8a16-fp8-block128 w8a16-fp8e5m2-ch w8a8-fp8-tensor w8a8-fp8-ch-static".split(),
)
def test_dispatch_picks_the_native_kernel(scheme: str) -> None:
    gen = torch.Generator().manual_seed(14)
    w = reference.quantize(
        torch.randn(64, 256, generator=gen), scheme, calib=torch.randn(8, 256, generator=gen)
    )
    lin = QuantLinear.from_canonical(w, device="cpu", act_dtype=torch.bfloat16)
    weight_only = parse_scheme(scheme).weight_only  # W8A8 fp8 has no AMX path
    assert lin.kernel_name == ("cpu.amx_lut" if AMX and weight_only else LUT.name)
    assert LUT.label(LayerSpec(w.scheme, 256, 64)) == "native"  # activations quantized as the scheme says
    x = torch.randn(2, 3, 256, generator=gen).bfloat16()
    assert rel(lin(x), reference.linear(x.reshape(6, 256), w).reshape(2, 3, 64)) < LOOSE


def test_supports_names_the_failing_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    def reason(scheme: str, caps: object = CPU, K: int = 256, **kw: object) -> str:
        return NativeLut.supports(LayerSpec(parse_scheme(scheme), K, 256, **kw), caps).reason

    assert "weights nf4, fp4_bnb" in reason("w4a16-int-g128-sym")
    assert "K % 16 == 0" in reason("w4a16-nvfp4", K=264, K_part=264)
    assert "K % 32 == 0" in reason("w4a16-mxfp4", K=256, K_part=240)
    assert "bnb4 K % blocksize == 0" in reason("w4a16-nf4-g64", K=200)
    assert "double-quant blocksize >= 64" in reason("w4a16-nf4-g32-dq")
    odd_block = parse_scheme("w8a16-fp8-block128").with_(block=(128, 40))
    assert "fp8 blocks whose rows and columns are multiples of 16" in reason(odd_block)
    assert "activations (float32, bfloat16, float16)" in reason("w4a16-nvfp4", act_dtype=torch.float64)
    no_bf16 = dataclasses.replace(CPU, features=CPU.features - {"avx512_bf16"})
    assert "avx512_bf16" in reason("w4a16-nvfp4", no_bf16)
    monkeypatch.setattr(build, "status", lambda: (False, "no C++ compiler (c++ not on PATH)"))
    assert "no C++ compiler" in reason("w4a16-nvfp4")
