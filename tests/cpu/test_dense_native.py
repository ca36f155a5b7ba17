"""The native dense 16-bit GEMV (backends/cpu/dense_native.py, native/csrc/dense.cpp) against float64
matmuls of the same weights, on awkward shapes, strides and dtypes, on both sides of the torch
crossover; thread-count independence; the strategy strings and the plain-torch fallbacks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantrt.backends.cpu import dense_native
from quantrt.backends.cpu.dense_native import DenseLinear, make_dense_linear
from quantrt.backends.cpu.native import build

ACTS = (torch.float32, torch.bfloat16, torch.float16)
WEIGHTS = (torch.bfloat16, torch.float16)
#: fp32 output: exact products, fp32 sums (both paths)
TIGHT = 1e-5
#: 16-bit output: one rounding of the result (DESIGN.md's metric bound)
LOOSE = 1e-2

HERE = {w: dense_native.native_status(torch.empty(1, 1, dtype=w)) for w in WEIGHTS}
needs_native = pytest.mark.skipif(
    not all(ok for ok, _ in HERE.values()), reason=f"native dense GEMV cannot run here: {HERE}"
)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm())


def ref_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


def tol(act: torch.dtype) -> float:
    return TIGHT if act == torch.float32 else LOOSE


@needs_native
@pytest.mark.parametrize("wdt", WEIGHTS)
@pytest.mark.parametrize("act", ACTS)
def test_matches_float64_across_the_crossover(wdt: torch.dtype, act: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    N, K = 33, 100  # K not a multiple of 32: a masked last chunk
    w = torch.randn(N, K, generator=gen).to(wdt)
    b = torch.randn(N, generator=gen).to(act)
    lin = DenseLinear(w, b, act)
    assert lin.weight.data_ptr() == w.data_ptr()  # kept as given, no copy
    for M in (0, 1, 3, 17, 64):
        x = torch.randn(M, K, generator=gen).to(act)
        y = lin(x)
        assert y.shape == (M, N) and y.dtype == act
        path = lin.strategy(M)
        assert path.startswith("native") == (M < lin.torch_from_m), path
        if M:
            assert rel(y, ref_linear(x, w, b)) < tol(act), (M, path, rel(y, ref_linear(x, w, b)))


@needs_native
@pytest.mark.parametrize("wdt", WEIGHTS)
@pytest.mark.parametrize("act", ACTS)
def test_both_paths_at_every_batch_size(wdt: torch.dtype, act: torch.dtype) -> None:
    """The native GEMV forced at large M and torch forced at M=1 both match."""
    gen = torch.Generator().manual_seed(2)
    N, K = 37, 300
    w = torch.randn(N, K, generator=gen).to(wdt)
    native, torch_only = (
        DenseLinear(w, None, act, torch_from_m=10**9),
        DenseLinear(w, None, act, torch_from_m=0),
    )
    for M in (1, 2, 5, 9, 64):
        x = torch.randn(M, K, generator=gen).to(act)
        ref = ref_linear(x, w, None)
        assert native.strategy(M).startswith("native") and torch_only.strategy(M).startswith("torch")
        assert rel(native(x), ref) < tol(act), M
        assert rel(torch_only(x), ref) < tol(act), M


@needs_native
def test_bf16_weight_bf16_activations_are_near_exact() -> None:
    """Exact products and fp32 sums: only the bf16 rounding of the output remains."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 1000, generator=gen).bfloat16()
    x = torch.randn(4, 1000, generator=gen).bfloat16()
    y = DenseLinear(w, None, torch.bfloat16)(x)
    ref = ref_linear(x, w, None)
    assert torch.equal(y, ref.bfloat16()) or rel(y, ref) < 3e-3
    # fp16 activations on a bf16 weight are split exactly in two bf16 parts
    xh = torch.randn(4, 1000, generator=gen).half()
    yf = DenseLinear(w, None, torch.float16)(xh)
    assert rel(yf, ref_linear(xh, w, None)) < 1e-3


@needs_native
@pytest.mark.parametrize("wdt", WEIGHTS)
def test_strided_weight_and_nothing_read_past_k(wdt: torch.dtype) -> None:
    """A weight view with row stride > K whose hidden columns are NaN: the masked last chunk."""
    gen = torch.Generator().manual_seed(4)
    big = torch.full((40, 128), float("nan"), dtype=wdt)
    big[:, :100] = torch.randn(40, 100, generator=gen).to(wdt)
    w = big[:, :100]
    lin = DenseLinear(w, None, torch.float32)
    assert lin.weight.data_ptr() == w.data_ptr() and lin.weight.stride(0) == 128
    for M in (1, 3, 8):
        x = torch.randn(M, 100, generator=gen)
        y = lin(x)
        assert not y.isnan().any() and rel(y, ref_linear(x, w, None)) < TIGHT


@needs_native
@pytest.mark.parametrize("act", ACTS)
def test_non_contiguous_and_3d_activations(act: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    N, K = 33, 100
    w = torch.randn(N, K, generator=gen).bfloat16()
    b = torch.randn(N, generator=gen).bfloat16()
    lin = DenseLinear(w, b, act)
    for M in (1, 3, 12):
        base = torch.randn(M, 2 * K, generator=gen).to(act)
        for x in (base[:, ::2], torch.randn(K, M, generator=gen).to(act).t(), base[:, 50 : 50 + K]):
            assert M == 1 or not x.is_contiguous()
            y = lin(x)
            assert torch.equal(y, lin(x.contiguous()))
            assert rel(y, ref_linear(x, w, b)) < tol(act)
    x3 = torch.randn(2, 3, K, generator=gen).to(act)
    y3 = lin(x3)
    assert y3.shape == (2, 3, N) and rel(y3, ref_linear(x3, w, b)) < tol(act)
    xt = torch.randn(3, K, 2, generator=gen).to(act).transpose(1, 2)  # 3-D, non-contiguous
    assert rel(lin(xt), ref_linear(xt, w, b)) < tol(act)
    assert lin(torch.empty(0, 4, K, dtype=act)).shape == (0, 4, N)


@needs_native
@pytest.mark.parametrize("wdt", WEIGHTS)
def test_bias_in_other_dtypes(wdt: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(50, 64, generator=gen).to(wdt)
    x = torch.randn(2, 64, generator=gen)
    for bdt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        b = (10 * torch.randn(50, generator=gen)).to(bdt)
        for act in ACTS:
            y = DenseLinear(w, b, act)(x.to(act))
            assert rel(y, ref_linear(x.to(act), w, b)) < tol(act), (bdt, act)


@needs_native
@pytest.mark.parametrize("wdt", WEIGHTS)
def test_threads_give_identical_results(wdt: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    # row blocks of 4 with a tail, a masked last chunk, enough work to thread; M=40 splits K in ranges
    N, K = 1003, 4100
    w = torch.randn(N, K, generator=gen).to(wdt)
    before = torch.get_num_threads()
    try:
        for act in ACTS:
            lin = DenseLinear(w, None, act, torch_from_m=10**9)
            for M in (1, 3, 7, 40):
                x = torch.randn(M, K, generator=gen).to(act)
                torch.set_num_threads(1)
                one = lin(x)
                torch.set_num_threads(2)
                two = lin(x)
                assert torch.equal(one, two), (act, M)
                assert rel(two, ref_linear(x, w, None)) < tol(act)
    finally:
        torch.set_num_threads(before)


@needs_native
def test_strategy_strings() -> None:
    w = torch.randn(16, 32).bfloat16()
    lin = DenseLinear(w, None, torch.bfloat16)
    assert lin.strategy(1) == "native bf16 GEMV (AVX-512 BF16)"
    assert lin.strategy(lin.torch_from_m) == f"torch F.linear: M >= {lin.torch_from_m}"
    assert "native bf16 GEMV" in lin.reason and "torch F.linear from it" in lin.reason
    assert DenseLinear(w, None, torch.float32).strategy(1) == "native bf16 GEMV (AVX-512 F, fp32 FMA)"
    assert DenseLinear(w.half(), None, torch.float16).strategy(1) == "native fp16 GEMV (AVX-512 F16C + FMA)"


def test_no_compiler_or_no_avx512_bf16_is_plain_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(33, 100, generator=gen).bfloat16()
    x = torch.randn(3, 100, generator=gen).bfloat16()
    monkeypatch.setattr(build, "status", lambda: (False, "no C++ compiler (c++ not on PATH)"))
    lin = DenseLinear(w, None, torch.bfloat16)
    assert lin.strategy(1) == "torch F.linear: no C++ compiler (c++ not on PATH)"
    assert lin.reason.startswith("torch F.linear: no C++ compiler")
    assert rel(lin(x), ref_linear(x, w, None)) < LOOSE
    monkeypatch.undo()
    monkeypatch.setattr(dense_native, "cpu_features", lambda: frozenset({"avx512f", "avx512bw", "avx2"}))
    lin = DenseLinear(w, None, torch.float32)
    assert lin.strategy(1) == "torch F.linear: CPU lacks avx512_bf16"
    assert rel(lin(x.float()), ref_linear(x.float(), w, None)) < TIGHT
    # fp16 weights need only AVX-512 F/BW
    assert DenseLinear(w.half(), None, torch.float16).strategy(1).startswith("native") == bool(
        HERE[torch.float16][0]
    )
    monkeypatch.setattr(dense_native, "cpu_features", lambda: frozenset({"avx2", "fma"}))
    assert (
        DenseLinear(w.half(), None, torch.float16).strategy(1) == "torch F.linear: CPU lacks avx512f avx512bw"
    )


def test_make_dense_linear() -> None:
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(20, 48, generator=gen)
    b = torch.randn(20, generator=gen)
    x = torch.randn(5, 48, generator=gen).bfloat16()
    dense = make_dense_linear(w.bfloat16(), b, torch.bfloat16)
    assert isinstance(dense, DenseLinear)
    plain = make_dense_linear(w, b, torch.bfloat16)  # an fp32 checkpoint weight: nn.Linear in act_dtype
    assert type(plain) is nn.Linear and plain.weight.dtype == torch.bfloat16
    for lin in (dense, plain):
        y = lin(x)
        assert y.dtype == torch.bfloat16 and rel(y, ref_linear(x, w.bfloat16(), b)) < LOOSE


def test_checkpoint_dense_layers_use_it() -> None:
    """Checkpoint.linear builds dense CPU layers through the backend's registered factory."""
    from quantrt.backends.cpu.dense_native import make_dense_linear
    from quantrt.kernels import registry

    assert registry().dense_linear["cpu"] is make_dense_linear
    w = torch.randn(48, 100).bfloat16()
    lin = make_dense_linear(w, None, torch.bfloat16)
    assert type(lin).__name__ == "DenseLinear" and lin.weight.data_ptr() == w.data_ptr()  # no copy
