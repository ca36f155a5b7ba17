"""The native integer CPU kernels (backends/cpu/wint_native.py, native/csrc/wint.cpp) against the fp32
reference on awkward shapes, dtypes, strides and codes; the reference's dequantization against math
written here; one prepared layout no larger than the checkpoint; dispatch picks them.

The weight-only tests run the kernel this CPU gets: cpu.native_wint with AVX-512 BF16, else
cpu.avx2_wint (backends/cpu/wint_gemv.py) on the same layout; QUANTRT_CPU_ISA=avx2 runs them on the
AVX2 build here (ci/test.sh does)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu import wint_native
from quantrt.backends.cpu.native import build
from quantrt.backends.cpu.wint_gemv import Avx2Wint
from quantrt.backends.cpu.wint_native import NativeW8A8Int8, NativeWint
from quantrt.canonical import CanonicalWeight, pack_int_codes
from quantrt.dispatch import machine_capabilities
from quantrt.layers import QuantLinear
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec
from quantrt.torchops import quantize_int8_per_token, quantize_int8_static

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: fp32 output: the kernels' products are exact and their sums fp32, like the reference's
TIGHT = 1e-5
#: 16-bit output: one rounding of the result (DESIGN.md's metric bound)
LOOSE = 1e-2

CPU = machine_capabilities().cpu
_SPEC = LayerSpec(parse_scheme("w4a16-int-g128-sym"), 256, 256)
#: the weight-only kernel of this CPU (QUANTRT_CPU_ISA included)
WINT = NativeWint if NativeWint.supports(_SPEC, CPU) else Avx2Wint
WINT_HERE = WINT.supports(_SPEC, CPU)
#: dispatch prefers the AMX subclasses of the native weight-only kernels where the CPU has AMX tiles
AMX = {"amx_bf16", "amx_tile"} <= set(CPU.features)
W8A8_HERE = NativeW8A8Int8.supports(LayerSpec(parse_scheme("w8a8-int-ch-sym"), 256, 256), CPU)
needs_wint = pytest.mark.skipif(not WINT_HERE, reason=f"{WINT.name} cannot run here: {WINT_HERE.reason}")
needs_w8a8 = pytest.mark.skipif(
    not W8A8_HERE, reason=f"cpu.native_w8a8_int8 cannot run here: {W8A8_HERE.reason}"
)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm())


def random_canonical(
    scheme: str,
    N: int,
    K: int,
    *,
    gen: torch.Generator,
    codes: torch.Tensor | None = None,
    zeros: torch.Tensor | None = None,
) -> CanonicalWeight:
    """Canonical tensors made directly (any K, random act-order g_idx), not through the quantizer,
    so ragged groups, zeros of 2^b and extreme codes can be tested."""
    s = parse_scheme(scheme)
    b = s.bits
    if codes is None:
        codes = torch.randint(0, 1 << b, (N, K), generator=gen)
    if s.granularity == "group":
        G = s.group_size
        ng = -(-K // G)
    else:
        ng = 1
    scales = (torch.rand(N, ng, generator=gen) + 0.5) * 0.02
    scales = torch.where(torch.rand(N, ng, generator=gen) < 0.1, -scales, scales)  # auto-round's signs
    t = {"qweight": pack_int_codes(codes, b), "scales": scales.half().float()}
    if not s.symmetric:
        t["zeros"] = (
            zeros if zeros is not None else torch.randint(0, (1 << b) + 1, (N, ng), generator=gen)
        ).to(torch.int16)
    if s.act_order:
        g = torch.arange(K) // s.group_size
        t["g_idx"] = g[torch.randperm(K, generator=gen)].to(torch.int32)
    return CanonicalWeight(s, N, K, t)


def independent_dequant(w: CanonicalWeight) -> torch.Tensor:
    """w[n, k] = (q - z[g(k)]) * s[g(k)], with the bit stream read bit by bit here."""
    s, N, K, b = w.scheme, w.N, w.K, w.scheme.bits
    bits = ((w["qweight"].long()[:, :, None] >> torch.arange(8)) & 1).reshape(N, -1)
    idx = b * torch.arange(K)[:, None] + torch.arange(b)[None, :]
    q = (bits[:, idx] << torch.arange(b)).sum(-1).double()
    if s.granularity == "group":
        g = w["g_idx"].long() if s.act_order else torch.arange(K) // s.group_size
    else:
        g = torch.zeros(K, dtype=torch.long)
    scale = w["scales"].double()[:, g]
    z = w["zeros"].double()[:, g] if not s.symmetric else float(1 << (b - 1))
    return (q - z) * scale


def layer(kernel: type, w: CanonicalWeight, act: torch.dtype, out: torch.dtype | None = None) -> tuple:
    spec = LayerSpec(w.scheme, w.K, w.N, act_dtype=act, out_dtype=out)
    assert kernel.supports(spec, CPU), kernel.supports(spec, CPU).reason
    k = kernel()
    return k, k.prepare(w, spec)


WINT_CASES = [
    ("w4a16-int-g128-sym", 33, 256),
    ("w4a16-int-g32-asym", 48, 160),
    ("w4a16-int-g64-asym", 33, 200),  # K=200: a ragged last group of 8
    ("w4a16-int-ch-sym", 40, 100),
    ("w4a16-int-ch-asym", 17, 130),
    ("w4a16-int-g128-sym-actorder", 33, 384),
    ("w4a16-int-g64-asym-actorder", 50, 256),
    ("w8a16-int-ch-sym", 33, 150),
    ("w8a16-int-g128-asym", 20, 256),
    ("w3a16-int-g128-asym", 33, 256),
    ("w3a16-int-g32-sym", 24, 200),
    ("w2a16-int-g64-sym", 33, 200),
    ("w2a16-int-g128-asym", 16, 384),
]


@pytest.mark.parametrize("scheme,N,K", WINT_CASES)
def test_reference_dequant_matches_independent_math(scheme: str, N: int, K: int) -> None:
    w = random_canonical(scheme, N, K, gen=torch.Generator().manual_seed(1))
    assert torch.allclose(reference.dequantize(w).double(), independent_dequant(w), rtol=1e-7, atol=0)


@needs_wint
@pytest.mark.parametrize("scheme,N,K", WINT_CASES)
def test_wint_matches_reference(scheme: str, N: int, K: int) -> None:
    gen = torch.Generator().manual_seed(hash(scheme) % 1000)
    w = random_canonical(scheme, N, K, gen=gen)
    for act in DTYPES:
        k, st = layer(WINT, w, act, torch.float32)
        for M in (0, 1, 3, 12, 17, 64):
            x = torch.randn(M, K, generator=gen).to(act)
            y = k.apply(st, x)
            assert y.shape == (M, N) and y.dtype == torch.float32
            if M:
                ref = reference.linear(x, w, out_dtype=torch.float32)
                assert rel(y, ref) < TIGHT, (act, M, rel(y, ref))


@needs_wint
def test_wint_quantized_checkpoint_every_bits() -> None:
    """Weights from the quantizer (codes clustered around the zero point), every catalog layout."""
    gen = torch.Generator().manual_seed(2)
    dense = torch.randn(96, 512, generator=gen)
    for scheme in ("w4a16-int-g128-asym", "w8a16-int-ch-sym", "w3a16-int-g128-sym", "w2a16-int-g64-sym"):
        w = reference.quantize(dense, scheme)
        k, st = layer(WINT, w, torch.bfloat16, torch.float32)
        for M in (1, 64):
            x = torch.randn(M, 512, generator=gen).bfloat16()
            assert rel(k.apply(st, x), reference.linear(x, w, out_dtype=torch.float32)) < TIGHT


@needs_wint
def test_wint_fused_tensor_scales() -> None:
    """Per-slice tensor scales and zeros of a fused layer (q, k, v of different widths)."""
    gen = torch.Generator().manual_seed(12)
    dense = torch.randn(56, 256, generator=gen) * torch.tensor([1.0] * 32 + [3.0] * 16 + [0.1] * 8)[:, None]
    for scheme in ("w4a16-int-tensor-asym", "w8a16-int-tensor-sym"):
        w = reference.quantize(dense, scheme, output_sizes=(32, 16, 8))
        k, st = layer(WINT, w, torch.bfloat16, torch.float32)
        for M in (1, 40):
            x = torch.randn(M, 256, generator=gen).bfloat16()
            assert rel(k.apply(st, x), reference.linear(x, w, out_dtype=torch.float32)) < TIGHT


@needs_wint
@needs_w8a8
def test_bad_calls_are_errors_not_overruns() -> None:
    gen = torch.Generator().manual_seed(13)
    w = random_canonical("w4a16-int-g32-sym", 33, 128, gen=gen)
    q = reference.quantize(torch.randn(33, 128, generator=gen), "w8a8-int-ch-sym")
    for k, st in (layer(WINT, w, torch.bfloat16), layer(NativeW8A8Int8, q, torch.bfloat16)):
        x = torch.randn(2, 128, generator=gen).bfloat16()
        with pytest.raises(ValueError, match=r"activations \[M, 128\]"):
            k.apply(st, torch.randn(2, 64).bfloat16())
        with pytest.raises(ValueError, match=r"activations \[M, 128\]"):
            k.apply(st, x.double())
        with pytest.raises(ValueError, match=r"bias \[33\]"):
            k.apply(st, x, torch.randn(32))
        with pytest.raises(ValueError, match=r"out must have shape \[2, 33\]"):
            k.apply(st, x, out=torch.empty(2, 32))


@needs_wint
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_wint_bias_out_and_output_dtypes(out_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    w = random_canonical("w4a16-int-g64-asym", 33, 192, gen=gen)
    bias = torch.randn(33, generator=gen).bfloat16()
    k, st = layer(WINT, w, torch.bfloat16, out_dtype)
    tol = TIGHT if out_dtype == torch.float32 else LOOSE
    for M in (1, 5, 40):
        x = torch.randn(M, 192, generator=gen).bfloat16()
        ref = reference.linear(x, w, bias, out_dtype=torch.float32)
        y = k.apply(st, x, bias)
        assert y.dtype == out_dtype and rel(y, ref) < tol
        out = torch.full((M, 33), float("nan"), dtype=out_dtype)
        assert k.apply(st, x, bias, out=out) is out and rel(out, ref) < tol
        wide = torch.full((M, 50), float("nan"), dtype=out_dtype)  # a strided view as out=
        assert rel(k.apply(st, x, bias, out=wide[:, 3:36]), ref) < tol and wide[:, :3].isnan().all()
        assert rel(k.apply(st, x, bias.float()), ref) < tol  # a bias in another dtype


@needs_wint
def test_wint_non_contiguous_activations() -> None:
    gen = torch.Generator().manual_seed(4)
    w = random_canonical("w4a16-int-g32-sym", 48, 128, gen=gen)
    k, st = layer(WINT, w, torch.bfloat16, torch.float32)
    for M in (1, 3, 20):
        base = torch.randn(M, 256, generator=gen).bfloat16()
        for x in (base[:, ::2], torch.randn(128, M, generator=gen).bfloat16().t(), base[:, 100:228]):
            y = k.apply(st, x)
            assert torch.equal(y, k.apply(st, x.contiguous()))
            assert rel(y, reference.linear(x, w, out_dtype=torch.float32)) < TIGHT


@needs_wint
def test_wint_threads_give_identical_results() -> None:
    gen = torch.Generator().manual_seed(5)
    w = random_canonical("w4a16-int-g128-asym-actorder", 80, 512, gen=gen)
    k, st = layer(WINT, w, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        for M in (1, 7, 64):
            x = torch.randn(M, 512, generator=gen).bfloat16()
            torch.set_num_threads(1)
            one = k.apply(st, x)
            torch.set_num_threads(2)
            assert torch.equal(one, k.apply(st, x))
    finally:
        torch.set_num_threads(before)


@needs_wint
@pytest.mark.parametrize("bits", (2, 3, 4, 8))
def test_wint_adversarial_codes(bits: int) -> None:
    """All-zero and all-max codes, zeros of 2^b (GPTQ v1), activations of large magnitude."""
    gen = torch.Generator().manual_seed(6)
    N, K, top = 32, 256, (1 << bits) - 1
    scheme = f"w{bits}a16-int-g64-asym"
    for fill, z in ((0, 1 << bits), (top, 0), (top, 1 << bits), (0, 0)):
        codes = torch.full((N, K), fill)
        codes[::3] = torch.randint(0, top + 1, (len(range(0, N, 3)), K), generator=gen)
        w = random_canonical(scheme, N, K, gen=gen, codes=codes, zeros=torch.full((N, K // 64), z))
        k, st = layer(WINT, w, torch.float32, torch.float32)
        for M in (1, 33):
            x = torch.randn(M, K, generator=gen) * torch.logspace(-3, 4, K)
            ref = reference.linear(x, w, out_dtype=torch.float32)
            assert rel(k.apply(st, x), ref) < TIGHT, (fill, z, M)


@needs_wint
@pytest.mark.parametrize(
    "scheme,N,K",
    [
        ("w4a16-int-g128-sym", 4096, 4096),
        ("w4a16-int-g32-asym", 512, 4096),
        ("w4a16-int-g128-asym-actorder", 512, 4096),
        ("w8a16-int-ch-sym", 512, 4096),
        ("w3a16-int-g128-asym", 512, 4096),
        ("w2a16-int-g64-asym", 512, 4096),
        ("w2a16-int-g32-asym", 512, 4096),
    ],
)
def test_one_prepared_layout_within_checkpoint_size(scheme: str, N: int, K: int) -> None:
    w = random_canonical(scheme, N, K, gen=torch.Generator().manual_seed(7))
    stored = sum(
        w[n].untyped_storage().nbytes() for n in ("qweight", "scales", "zeros") if w.get(n) is not None
    )
    _, st = layer(WINT, w, torch.bfloat16)
    assert st.layout.nbytes <= 1.10 * stored, (st.layout.nbytes, stored)
    # every batch size runs from these tensors: both strategies read the same layout
    if WINT is NativeWint:
        k = NativeWint()
        assert {k.strategy(st, 1), k.strategy(st, 64)} == {"gemv", "panel-gemm"}


@needs_wint
@needs_w8a8
@pytest.mark.parametrize(
    "kernel,scheme", [(NativeWint, s) for s, _, _ in WINT_CASES[::3]] + [(NativeW8A8Int8, "w8a8-int-ch-sym")]
)
def test_both_strategies_at_every_batch_size(kernel: type, scheme: str) -> None:
    """The GEMV and the large-M path, forced at the same M, both match the reference."""
    gen = torch.Generator().manual_seed(14)
    N, K = 40, 256
    if kernel is NativeWint:
        w = random_canonical(scheme, N, K, gen=gen)
    else:
        w = reference.quantize(torch.randn(N, K, generator=gen), scheme)
    k, st = layer(kernel, w, torch.bfloat16, torch.float32)
    gemv, large = st.strategies[0], st.strategies[-1]
    assert gemv.name == "gemv" and large.name in ("panel-gemm", "gemm")
    for M in (1, 2, 5, 9, 13):
        x = torch.randn(M, K, generator=gen).bfloat16()
        ref = reference.linear(x, w, out_dtype=torch.float32)
        assert (k.strategy(st, M) == "gemv") == (M <= gemv.max_m)
        for s in (gemv, large):
            assert rel(s.fn(st.layout, x, None, None, None), ref) < TIGHT, (M, s.name)


# -- W8A8 --------------------------------------------------------------------------------------


@needs_w8a8
def test_activation_codes_match_torchops_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(8)
    for act in DTYPES:
        x = torch.randn(37, 300, generator=gen) * torch.rand(37, 1, generator=gen) * 10
        x[3] = 0.0  # an all-zero row: scale 1
        x[4, :] = torch.arange(300) * 0.5 - 75  # exact ties at .5 after scaling by 1
        x[4, 0] = 127.0
        x = x.to(act)
        q, a = wint_native.quantize_activations(x)
        q_ref, a_ref = quantize_int8_per_token(x)
        assert torch.equal(a, a_ref.reshape(-1)) and torch.equal(q, q_ref)
        q, _ = wint_native.quantize_activations(x[:, ::2], in_scale=0.0173)
        assert torch.equal(q, quantize_int8_static(x[:, ::2], torch.tensor(0.0173)))


@needs_w8a8
@pytest.mark.parametrize(
    "scheme,N,K",
    [
        ("w8a8-int-ch-sym", 33, 200),
        ("w8a8-int-ch-sym-static", 48, 256),
        ("w8a8-int-tensor-sym-static", 17, 130),
    ],
)
def test_w8a8_matches_reference(scheme: str, N: int, K: int) -> None:
    gen = torch.Generator().manual_seed(9)
    w = reference.quantize(torch.randn(N, K, generator=gen), scheme, calib=torch.randn(16, K, generator=gen))
    bias = torch.randn(N, generator=gen)
    for act in DTYPES:
        k, st = layer(NativeW8A8Int8, w, act, torch.float32)
        for M in (0, 1, 3, 17, 64):
            x = torch.randn(M, 2 * K, generator=gen).to(act)[:, ::2]
            y = k.apply(st, x, bias.to(act))
            assert y.shape == (M, N)
            if M:
                ref = reference.linear(x, w, bias.to(act), out_dtype=torch.float32)
                assert rel(y, ref) < TIGHT, (act, M, rel(y, ref))


@needs_w8a8
def test_w8a8_out_threads_and_bf16_output() -> None:
    gen = torch.Generator().manual_seed(10)
    w = reference.quantize(torch.randn(80, 512, generator=gen), "w8a8-int-ch-sym")
    k, st = layer(NativeW8A8Int8, w, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        for M in (1, 9, 64):
            x = torch.randn(M, 512, generator=gen).bfloat16()
            ref = reference.linear(x, w, out_dtype=torch.float32)
            out = torch.empty(M, 80, dtype=torch.bfloat16)
            torch.set_num_threads(1)
            assert k.apply(st, x, out=out) is out and rel(out, ref) < LOOSE
            torch.set_num_threads(2)
            assert torch.equal(out, k.apply(st, x))
    finally:
        torch.set_num_threads(before)


# -- dispatch and supports -----------------------------------------------------------------------


@needs_wint
@pytest.mark.parametrize(
    "scheme,kernel",
    [
        ("w4a16-int-g128-sym", "cpu.native_wint"),
        ("w4a16-int-g128-asym-actorder", "cpu.native_wint"),
        ("w8a16-int-ch-sym", "cpu.native_wint"),
        ("w3a16-int-g128-asym", "cpu.native_wint"),
        ("w2a16-int-g64-sym", "cpu.native_wint"),
        ("w8a8-int-ch-sym", "cpu.native_w8a8_int8"),
        ("w8a8-int-tensor-sym-static", "cpu.native_w8a8_int8"),
    ],
)
def test_dispatch_picks_the_native_kernels(scheme: str, kernel: str) -> None:
    gen = torch.Generator().manual_seed(11)
    dense = torch.randn(64, 256, generator=gen)
    w = reference.quantize(dense, scheme, calib=torch.randn(8, 256, generator=gen))
    if kernel.endswith("_wint") and WINT is Avx2Wint:
        kernel = Avx2Wint.name
    elif kernel.endswith("_int8") and not W8A8_HERE:
        pytest.skip(f"cpu.native_w8a8_int8 cannot run here: {W8A8_HERE.reason}")
    lin = QuantLinear.from_canonical(w, device="cpu", act_dtype=torch.bfloat16)
    assert lin.kernel_name == (
        kernel.replace("native_", "amx_") if AMX and kernel.endswith("native_wint") else kernel
    )
    x = torch.randn(2, 3, 256, generator=gen).bfloat16()
    assert rel(lin(x), reference.linear(x, w)) < LOOSE


def test_supports_names_the_failing_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    def reason(scheme: str, caps: object = CPU, **kw: object) -> str:
        kernel = NativeW8A8Int8 if scheme.startswith("w8a8") else NativeWint
        return kernel.supports(LayerSpec(parse_scheme(scheme), 256, 256, **kw), caps).reason

    assert "group size % 16 == 0" in reason("w4a16-int-g40-sym")
    assert "weight-only" in reason("w4a8-int-g128-sym-afp8")
    assert "act-order with the full K" in reason("w4a16-int-g128-sym-actorder", K_part=128)
    assert "activations (float32, bfloat16, float16)" in reason("w4a16-int-g128-sym", act_dtype=torch.float64)
    assert "dynamic per-token or static per-tensor" in reason("w8a8-int-ch-sym-dyn")
    no_bf16 = dataclasses.replace(CPU, features=CPU.features - {"avx512_bf16"})
    assert "avx512_bf16" in reason("w4a16-int-g128-sym", no_bf16)
    avx2 = dataclasses.replace(CPU, features=frozenset({"avx2", "fma"}))
    assert "avx512_vnni" in reason("w8a8-int-ch-sym", avx2)
    monkeypatch.setattr(build, "status", lambda: (False, "no C++ compiler (c++ not on PATH)"))
    assert "no C++ compiler" in reason("w4a16-int-g128-sym")
