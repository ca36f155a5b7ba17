"""cpu.native_gguf (backends/cpu/gguf_native.py, native/csrc/gguf.cpp) against two references.

1. The kernel's own arithmetic, written here independently from llama.cpp's definitions: activation
   rows quantized like quantize_row_q8_0 (blocks of 32, d = max|x| / 127) or quantize_row_q8_K (blocks
   of 256, iscale = -127 / the first element of largest |x|, d = 1 / iscale), both with fp32 scales
   and round-half-to-even; weights decoded exactly in float64 by gguf-py (llama.cpp's numpy
   dequantizers) with their f16 scales replaced by 1 and 0, which yields the integer codes times the
   integer sub-block scales; then every block's exact integer dot times its scales, in float64. The
   kernel must match it to 1e-5 (fp32 accumulation is the only difference).
2. The scheme's fp32 dequantize-then-matmul reference (quantrt.reference): DESIGN.md's error metric
   below 1e-2 on Gaussian activations (the int8 activation blocks cost about 0.5-0.9 %).

Weights come from quantrt's quantizer, from gguf-py's quantizer (legacy types; it writes no K-quants),
from llama.cpp's own files (../shared/fixtures/gguf) and from random and adversarial bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_reference import integer_reference

from quantrt import reference
from quantrt.backends.cpu import gguf_native
from quantrt.backends.cpu.gguf_native import CpuNativeGGUF, group_layout
from quantrt.backends.cpu.native import build
from quantrt.canonical import CanonicalWeight
from quantrt.capability import probe
from quantrt.dispatch import machine_capabilities
from quantrt.layers import QuantLinear
from quantrt.prepared import Prepared
from quantrt.reference.gguf import F16_FIELDS
from quantrt.schemes import GGUF_TYPES, parse_scheme
from quantrt.specs import LayerSpec

# llama.cpp's files (the same bytes as ../shared/fixtures/gguf; see the README there)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
TYPES = tuple(GGUF_TYPES)
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
EXACT = 1e-5
DESIGN = 1e-2
#: this machine's CPU as layers see it: QUANTRT_CPU_ISA=avx2 runs this file on the AVX2 build
#: (ci/test.sh runs it so on this AVX-512 machine)
CPU = machine_capabilities().cpu
KERNEL = CpuNativeGGUF(CPU)
ISA = gguf_native.library_isa(CPU)
#: this machine runs the 16-row AVX-512 VNNI groups (else every row is canonical: the AVX2 path)
SIMD = ISA == "native" and gguf_native.SIMD_FEATURES <= CPU.features
#: dispatch prefers the AMX subclass of the native kernel where the CPU has AMX tiles
AMX = {"amx_bf16", "amx_tile"} <= set(CPU.features)


def group_rows(gtype: str) -> int:
    """Rows per interleaved group this build lays ``gtype`` out in (0: canonical rows)."""
    return 16 if SIMD or (ISA.startswith("avx2") and gtype in gguf_native.AVX2_GROUPED) else 0


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    """DESIGN.md's ||y - ref||_F / ||ref||_F in float64."""
    ref = ref.double()
    return float((y.double() - ref).norm() / ref.norm())


def worst_row(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest per-output-column relative error, so rows with tiny scales are checked too."""
    ref = ref.double()
    err = (y.double() - ref).norm(dim=0)
    norm = ref.norm(dim=0)
    assert not err[norm == 0].any(), "a column whose reference is zero must come out zero"
    return float((err[norm > 0] / norm[norm > 0]).max())


# -- helpers -------------------------------------------------------------------------------------------


def weight(q: torch.Tensor, gtype: str, K: int) -> CanonicalWeight:
    return CanonicalWeight(parse_scheme(f"gguf-{gtype}"), q.shape[0], K, {"qweight": q})


def prepare(cw: CanonicalWeight, act=torch.float32, out=torch.float32):
    spec = LayerSpec(cw.scheme, cw.K, cw.N, act_dtype=act, out_dtype=out)
    return KERNEL.prepare(cw, spec)


def restate(state: Prepared, layout: gguf_native.GGUFLayout) -> Prepared:
    """A prepared layer over another layout, with the native strategies and the same call shape."""
    return Prepared(
        layout,
        gguf_native.gguf_strategies(layout),
        K=state.K,
        N=state.N,
        out_dtype=state.out_dtype,
        act_dtypes=state.act_dtypes,
        kernel=state.kernel,
    )


def scalar_state(state: Prepared, qweight: torch.Tensor) -> Prepared:
    """The same weight with every row canonical (the scalar code, or the AVX2 build's rows)."""
    lay = state.layout
    return restate(state, dataclasses.replace(lay, weight=group_layout(qweight, lay.gguf_type, 0), groups=0))


def gaussian(M: int, K: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rtn_weight(gtype: str, N: int, K: int, seed: int) -> CanonicalWeight:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[:, :: max(1, K // 3)] *= 8  # a few outlier input columns, as real weights have
    return reference.quantize(w, f"gguf-{gtype}")


def finite_f16_bits(rng: np.random.Generator, shape) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= np.uint16(0xFBFF)  # Inf/NaN -> finite, same sign
    return bits


def random_blocks(
    gtype: str, N: int, K: int, seed: int, scales: np.ndarray | None = None, fill: int | None = None
) -> torch.Tensor:
    """Random code bytes (or all ``fill``); f16 fields random finite bit patterns (or ``scales``)."""
    B, T, _ = GGUF_TYPES[gtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N, K // B, T), dtype=np.uint8)
    if fill is not None:
        blocks[:] = fill
    for j, off in enumerate(F16_FIELDS[gtype]):
        bits = finite_f16_bits(rng, (N, K // B)) if scales is None else scales[..., j]
        blocks[..., off : off + 2] = bits.astype("<u2").view(np.uint8).reshape(N, K // B, 2)
    return torch.from_numpy(blocks.reshape(N, -1))


def check_exact(
    cw: CanonicalWeight, x: torch.Tensor, bias=None, *, rows: bool = False, state=None
) -> torch.Tensor:
    state = state or prepare(cw, act=x.dtype)
    y = KERNEL.apply(state, x, bias)
    assert y.shape == (x.shape[0], cw.N) and y.dtype == torch.float32
    want = integer_reference(x, cw["qweight"], cw.scheme.gguf_type, bias)
    if not want.any():  # all-zero codes and scales: nothing to divide by
        assert not y.any()
        return y
    err = worst_row(y, want) if rows else rel(y, want)
    assert err < EXACT, (
        f"{cw.scheme.gguf_type} N={cw.N} K={cw.K} M={x.shape[0]}: {err:.3g} vs the integer reference"
    )
    return y


# -- dispatch and the contract -------------------------------------------------------------------------


def test_dispatch_picks_it_and_says_why_not():
    cw = rtn_weight("q4_k", 32, 256, seed=0)
    layer = QuantLinear.from_canonical(cw, device="cpu", act_dtype=torch.bfloat16)
    assert layer.kernel_name == ("cpu.amx_gguf" if AMX else "cpu.native_gguf")
    caps = CPU
    spec = LayerSpec(cw.scheme, 256, 32)
    ok = CpuNativeGGUF.supports(spec, caps)
    assert ok and "Q8_K" in ok.note and ("AVX-512 VNNI" if SIMD else "AVX2 build") in ok.note
    no_avx2 = dataclasses.replace(caps, features=frozenset({"sse4_2"}))
    assert (
        CpuNativeGGUF.supports(spec, no_avx2).predicate
        == "an x86 CPU with AVX2, FMA, F16C, or an Arm CPU with NEON"
    )
    bad_k = LayerSpec(parse_scheme("gguf-q4_0"), 100, 32)
    assert "K % 32 == 0" in CpuNativeGGUF.supports(bad_k, caps).reason
    fp64 = LayerSpec(cw.scheme, 256, 32, act_dtype=torch.float64)
    assert CpuNativeGGUF.supports(fp64, caps).predicate == "activations (float32, bfloat16, float16)"
    int_scheme = LayerSpec(parse_scheme("w4a16-int-g128-asym"), 256, 32)
    assert CpuNativeGGUF.supports(int_scheme, caps).predicate == "weight == 'gguf'"
    assert "int8 blocks" in KERNEL.strategy(prepare(cw), 1) and "4 activation rows" in KERNEL.strategy(
        prepare(cw), 5
    )


def test_no_compiler_is_a_reason(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-quantrt")
    v = CpuNativeGGUF.supports(LayerSpec(parse_scheme("gguf-q8_0"), 64, 16), CPU)
    assert not v.ok and v.predicate == "a native build toolchain" and "no-such-compiler-quantrt" in v.reason


def test_build_is_available_here():
    ok, why = build.status()
    assert ok, why  # the native kernel must be tested, not skipped
    lib = gguf_native.native_library(ISA)
    for gtype, code in gguf_native.TYPE_CODES.items():  # the build matches the probe
        assert lib.quantrt_gguf_group_rows_of(code) == group_rows(gtype), gtype
    assert lib.quantrt_gguf_group_rows_of(len(gguf_native.TYPE_CODES)) == -1


@pytest.mark.parametrize("gtype", TYPES)
def test_one_layout_within_110_percent(gtype: str):
    B = GGUF_TYPES[gtype][0]
    for N in (16, 33, 64):
        q = random_blocks(gtype, N, 2 * B, seed=N)
        lay = prepare(weight(q, gtype, 2 * B)).layout
        assert lay.weight.dtype == torch.uint8 and lay.weight.dim() == 1
        assert q.numel() <= lay.weight.numel() <= 1.10 * q.numel()
        assert lay.groups == (N // group_rows(gtype) if group_rows(gtype) else 0)
    assert KERNEL.workspace_bytes(LayerSpec(parse_scheme(f"gguf-{gtype}"), 4 * B, 16), 3) >= 3 * 4 * B


# -- numbers: the ten types ----------------------------------------------------------------------------

SHAPES = [  # (M, N, blocks along K, activation dtype)
    (1, 33, 1, torch.float32),
    (3, 48, 3, torch.bfloat16),
    (17, 33, 2, torch.float16),
    (1, 5, 2, torch.bfloat16),
    (6, 64, 8, torch.float32),
]


@pytest.mark.parametrize("gtype", TYPES)
def test_quantrt_weights_match_both_references(gtype: str):
    B = GGUF_TYPES[gtype][0]
    for i, (M, N, nb, act) in enumerate(SHAPES):
        cw = rtn_weight(gtype, N, nb * B, seed=i)
        x = gaussian(M, nb * B, seed=10 + i, dtype=act)
        bias = gaussian(1, N, seed=20 + i)[0] if i % 2 else None
        y = check_exact(cw, x, bias)
        if N * M >= 48:  # enough outputs for the Frobenius ratio to be a stable average
            assert rel(y, reference.linear(x.float(), cw, bias)) < DESIGN


@pytest.mark.parametrize("gtype", LEGACY)
def test_gguf_py_quantizer_weights(gtype: str):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((40, 512)) * 0.02).astype(np.float32)
    w[:, 7] *= 10
    q = torch.from_numpy(gguf_quantize(w, GT[gtype.upper()]))
    cw = weight(q, gtype, 512)
    x = gaussian(3, 512, seed=6)
    y = check_exact(cw, x)
    assert rel(y, reference.linear(x, cw)) < DESIGN
    assert (
        rel(y, x.double() @ torch.from_numpy(gguf_dequantize(q.numpy(), GT[gtype.upper()])).double().T)
        < DESIGN
    )


def fixture_tensors() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(FIXTURES.glob("*.gguf")):
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type.name.lower() in GGUF_TYPES:
                out.append((path.name, t.name, t.tensor_type.name.lower()))
    return out


FIXTURE_TENSORS = fixture_tensors()


def test_fixtures_are_there():
    assert {t for _, _, t in FIXTURE_TENSORS} == {"q4_0", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}


@pytest.mark.parametrize("file", sorted({f for f, _, _ in FIXTURE_TENSORS}))
def test_llama_cpp_files(file: str):
    """Every quantized tensor llama.cpp wrote, as a linear layer."""
    reader = gguf.GGUFReader(FIXTURES / file)
    for i, t in enumerate(reader.tensors):
        gtype = t.tensor_type.name.lower()
        if gtype not in GGUF_TYPES:
            continue
        K, N = int(t.shape[0]), int(np.prod([int(d) for d in t.shape[1:]]))
        q = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(N, -1))
        cw = weight(q, gtype, K)
        x = gaussian(2, K, seed=i, dtype=torch.bfloat16)
        y = check_exact(cw, x)
        dense = torch.from_numpy(gguf_dequantize(t.data, t.tensor_type).reshape(N, K)).double()
        assert rel(y, x.double() @ dense.T) < DESIGN, f"{file}:{t.name}"


# -- adversarial weights and activations ---------------------------------------------------------------

SPECIAL_F16 = np.array([0x0000, 0x8000, 0x3C00, 0xC100, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF], np.uint16)


@pytest.mark.parametrize("gtype", TYPES)
def test_random_and_extreme_blocks(gtype: str):
    """Random bytes with random finite f16 scales (subnormal to 65504, both signs); then every code
    byte 0xFF or 0x00 or alternating, with extreme scales, against activations at +-127 codes."""
    B, _, _ = GGUF_TYPES[gtype]
    K = 3 * B
    q = random_blocks(gtype, 37, K, seed=1)
    check_exact(weight(q, gtype, K), gaussian(3, K, seed=2), rows=True)
    nf = len(F16_FIELDS[gtype])
    rng = np.random.default_rng(3)
    scales = rng.choice(SPECIAL_F16, size=(32, 3, nf))
    scales[..., 0] = np.where(scales[..., 0] & 0x7FFF, scales[..., 0], 0x3C00)  # no all-zero rows
    for fill in (0xFF, 0x00, 0xAA, 0x55):
        q = random_blocks(gtype, 32, K, seed=4, scales=scales, fill=fill)
        x = torch.full((2, K), 3.0)
        x[1, ::2] = -3.0  # every activation code is +-127
        check_exact(weight(q, gtype, K), x)


@pytest.mark.parametrize("block", [32, 256])
def test_activation_blocks_edge_cases(block: int):
    """Zero blocks (scale 0), ties of +-max (the first one sets Q8_K's sign), exact .5 codes,
    a huge dynamic range, and one huge outlier per block."""
    gtype = "q8_0" if block == 32 else "q6_k"
    K = 4 * block
    cw = rtn_weight(gtype, 33, K, seed=7)
    x = gaussian(5, K, seed=8)
    x[0, :block] = 0
    x[1, :block] = 0
    x[1, 3], x[1, 9] = -2.0, 2.0  # tie: the first (-2) sets the sign
    x[2] = torch.arange(K, dtype=torch.float32) % 255 - 127  # integers: codes hit x * id exactly
    x[3] *= torch.logspace(-20, 20, K)
    x[4, ::block] = 1e4
    check_exact(cw, x, rows=True)


# -- shapes, strides, dtypes, threads ------------------------------------------------------------------


@pytest.mark.parametrize("gtype", ["q4_0", "q4_k"])
def test_strides_bias_out_and_empty(gtype: str):
    B = GGUF_TYPES[gtype][0]
    K = 2 * B
    cw = rtn_weight(gtype, 33, K, seed=9)
    state = prepare(cw)
    base = gaussian(6, 2 * K, seed=10)
    contiguous = base[:3, :K].contiguous()
    want = KERNEL.apply(state, contiguous)
    for view in (base[:3, :K], base[::2, K:], base[:3, ::2], base.T.contiguous().T[:3, :K]):
        assert not view.is_contiguous()
        check_exact(cw, view, state=state)
    assert torch.equal(KERNEL.apply(state, base[:3, :K]), want)
    bias = gaussian(1, 33, seed=11, dtype=torch.bfloat16)[0]
    out = torch.full((3, 33), float("nan"))
    got = KERNEL.apply(state, contiguous, bias, out=out)
    assert got is out and torch.equal(out, want + bias.float())
    wide = torch.full((3, 40), float("nan"))
    KERNEL.apply(state, contiguous, None, out=wide[:, :33])
    assert torch.equal(wide[:, :33], want) and wide[:, 33:].isnan().all()
    empty = KERNEL.apply(state, contiguous[:0])
    assert empty.shape == (0, 33)
    for bad in (contiguous.double(), contiguous[:, :-1]):
        with pytest.raises(
            ValueError, match=r"expected activations \[M, \d+\] in float32, bfloat16, float16, found"
        ):
            KERNEL.apply(state, bad)
    with pytest.raises(ValueError, match=r"expected a CPU bias \[33\]"):
        KERNEL.apply(state, contiguous, torch.zeros(32))
    with pytest.raises(ValueError, match=r"out must have shape \[\d+, 33\], found \[\d+, 32\]"):
        KERNEL.apply(state, contiguous, out=torch.empty(contiguous.shape[0], 32))


@pytest.mark.parametrize("gtype", ["q8_0", "q5_1", "q3_k", "q6_k"])
def test_output_dtypes_round_the_fp32_result(gtype: str):
    B = GGUF_TYPES[gtype][0]
    cw = rtn_weight(gtype, 48, 2 * B, seed=12)
    x = gaussian(3, 2 * B, seed=13, dtype=torch.bfloat16)
    bias = gaussian(1, 48, seed=14)[0]
    y32 = KERNEL.apply(prepare(cw, act=torch.bfloat16), x, bias)
    for dt in (torch.bfloat16, torch.float16):
        y = KERNEL.apply(prepare(cw, act=torch.bfloat16, out=dt), x, bias)
        assert y.dtype == dt and torch.equal(y, y32.to(dt))


@pytest.mark.parametrize("gtype", TYPES)
def test_threads_and_paths_agree(gtype: str):
    """1 and 2 threads give identical bits; the scalar code (canonical rows) gives the same numbers."""
    B = GGUF_TYPES[gtype][0]
    cw = rtn_weight(gtype, 50, 2 * B, seed=15)
    state = prepare(cw)
    x = gaussian(17, 2 * B, seed=16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = KERNEL.apply(state, x)
        torch.set_num_threads(2)
        two = KERNEL.apply(state, x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    scalar = KERNEL.apply(scalar_state(state, cw["qweight"]), x)
    assert rel(scalar, two) < 1e-6
    check_exact(cw, x, state=scalar_state(state, cw["qweight"]))


@pytest.mark.parametrize("gtype", ["q8_0", "q4_k"])
def test_long_rows_tile_the_batch(gtype: str):
    """K = 65536 makes the kernel take the batch 4 rows at a time through the whole weight (L2 tiles)."""
    K = 65536
    cw = rtn_weight(gtype, 20, K, seed=19)
    check_exact(cw, gaussian(9, K, seed=20, dtype=torch.bfloat16))


def test_a_wrong_code_is_caught():
    """The exact comparison notices one flipped code bit among 16 * 512 weights."""
    cw = rtn_weight("q4_0", 16, 512, seed=17)
    x = gaussian(1, 512, seed=18)
    state = prepare(cw)
    check_exact(cw, x, state=state)
    broken = state.layout.weight.clone()
    broken[4] ^= 0x01  # a code byte: row 1 qs[0] in 16-row groups, row 0 qs[2] in canonical rows
    y = KERNEL.apply(restate(state, dataclasses.replace(state.layout, weight=broken)), x)
    assert rel(y, integer_reference(x, cw["qweight"], "q4_0")) > 10 * EXACT


# -- the AVX-VNNI path of the AVX2 build, through its EVEX twin ----------------------------------------

#: what the avx2_vnni_twin build's EVEX VPDPBUSD on ymm registers needs (the CPU as probed: the test
#: runs under QUANTRT_CPU_ISA=avx2 too)
TWIN_FEATURES = frozenset({"avx512_vnni", "avx512vl"})


def build_state(cw: CanonicalWeight, isa: str) -> Prepared:
    """``cw`` prepared by the ``isa`` build of the library (its layout and entry point)."""
    state = prepare(cw)
    spec = LayerSpec(cw.scheme, cw.K, cw.N, act_dtype=torch.float32, out_dtype=torch.float32)
    return restate(state, gguf_native.prepare_layout(cw, spec, isa))


def bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int32)


@pytest.mark.skipif(
    not TWIN_FEATURES <= probe().cpu.features,
    reason="the avx2_vnni_twin build runs VPDPBUSD in its EVEX encoding: needs AVX-512 VNNI and VL",
)
@pytest.mark.parametrize("gtype", TYPES)
def test_avx_vnni_twin_matches_the_avx2_build_bit_for_bit(gtype: str):
    """The x86-64-v3 build with VPDPBUSD (an AVX-VNNI laptop's code, here in the EVEX encoding) against
    the integer reference, and bit for bit against the maddubs build: 37 rows (two 16-row groups and
    canonical rows where the type groups), 4 blocks along K, M = 1, 3, 5, 17; RTN weights, random
    blocks, and all-0xFF codes against +-127 activation codes (the int16 bounds of the maddubs path)."""
    B = GGUF_TYPES[gtype][0]
    K, N = 4 * B, 37
    grouped = gtype in gguf_native.AVX2_GROUPED
    weights = [rtn_weight(gtype, N, K, seed=21), weight(random_blocks(gtype, N, K, seed=22), gtype, K)]
    scales = np.full((N, K // B, len(F16_FIELDS[gtype])), 0x3C00, np.uint16)
    weights.append(weight(random_blocks(gtype, N, K, seed=23, scales=scales, fill=0xFF), gtype, K))
    for cw in weights:
        states = {isa: build_state(cw, isa) for isa in ("avx2", "avx2_vnni_twin")}
        for isa, st in states.items():
            assert st.layout.isa == isa and st.layout.groups == (2 if grouped else 0)
        for M in (1, 3, 5, 17):
            x = gaussian(M, K, seed=24 + M)
            big = 4.0 * float(x[0].abs().max())  # every other activation code of row 0 at +-127
            x[0, ::4], x[0, 2::4] = big, -big
            twin = check_exact(cw, x, rows=True, state=states["avx2_vnni_twin"])
            plain = KERNEL.apply(states["avx2"], x)
            assert torch.equal(bits(twin), bits(plain)), f"{gtype} M={M}: the dpbusd build's bits differ"
