"""NaN and Inf activations through the native CPU kernels that quantize activations to int8 (GGUF's
8-bit blocks in csrc/gguf.cpp, W8A8 int8 in csrc/wint.cpp) against the fp32 reference
(``quantrt.reference.linear``, dequantize-then-matmul): the same NaN and ±Inf outputs, entry by entry.

Why: a NaN activation used to become an integer code, so the output came out finite where the
reference's (and torch's) is NaN, hiding a model's overflow. The reference's pattern: GGUF is
weight-only, so a row with a NaN is NaN everywhere, and a row with ±Inf is ±Inf where its infinite
terms w[n, k] * x[k] share a sign, NaN where signs meet or w[n, k] = 0. W8A8 quantizes per token
(an Inf makes the scale Inf and the whole row NaN) or with a static scale (an Inf saturates to a
finite code, a NaN stays NaN).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from quantrt import reference
from quantrt.backends.cpu.gguf_native import CpuNativeGGUF
from quantrt.backends.cpu.wint_native import NativeW8A8Int8
from quantrt.canonical import CanonicalWeight
from quantrt.capability import probe
from quantrt.specs import LayerSpec

CPU = probe().cpu
NAN, INF = float("nan"), float("inf")
#: finite outputs: the int8 activation blocks' error (DESIGN.md's metric bound)
DESIGN = 1e-2


def spoil(x: torch.Tensor, rows: str, gen: torch.Generator) -> torch.Tensor:
    """Non-finite values at random places of the first rows: "nan" (row 0), "inf" (row 0: +Inf),
    or "mixed" (row 0 NaN; row 1 +Inf and -Inf; row 2 two +Inf; row 3 -Inf and NaN; the rest finite)."""
    x = x.clone()
    K = x.shape[1]

    def at() -> int:
        return int(torch.randint(0, K, (1,), generator=gen))

    if rows == "nan":
        x[0, at()] = NAN
    elif rows == "inf":
        x[0, at()] = INF
    else:
        x[0, at()] = NAN
        k = at()
        x[1, k], x[1, (k + 1 + at()) % K] = INF, -INF
        x[2, at()] = INF
        x[2, at()] = INF
        x[3, at()] = -INF
        x[3, at()] = NAN
    return x


def check_pattern(y: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """NaN where the reference has NaN, the same ±Inf where it has ±Inf, finite elsewhere (and close)."""
    y, ref = y.float(), ref.float()
    assert torch.equal(y.isnan(), ref.isnan()), (
        f"{what}: NaN at {int(y.isnan().sum())} outputs, the reference at {int(ref.isnan().sum())}"
    )
    inf = ref.isinf()
    assert torch.equal(y.isinf(), inf), f"{what}: Inf at {int(y.isinf().sum())}, reference {int(inf.sum())}"
    assert torch.equal(y[inf], ref[inf]), f"{what}: infinities of the wrong sign"
    fin = ref.isfinite()
    if fin.any():
        err = float((y[fin] - ref[fin]).double().norm() / ref[fin].double().norm())
        assert err < DESIGN, f"{what}: finite outputs {err:.3g} from the reference"


def generator(*case: object) -> torch.Generator:
    """A generator seeded by the test case (stable across runs, unlike ``hash``)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def gguf_weight(gtype: str, N: int, K: int, gen: torch.Generator) -> CanonicalWeight:
    """Random weights with a few all-zero rows (exact zeros for every type: Inf * 0 is NaN)."""
    w = torch.randn(N, K, generator=gen)
    w[torch.randperm(N, generator=gen)[: max(1, N // 8)]] = 0
    return reference.quantize(w, f"gguf-{gtype}")


@pytest.mark.parametrize(
    "gtype,N,K",
    [
        ("q4_0", 37, 96),
        ("q5_1", 20, 64),
        ("q8_0", 50, 160),
        ("q2_k", 33, 256),
        ("q3_k", 16, 512),
        ("q4_k", 41, 512),
        ("q6_k", 35, 256),
    ],
)
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
def test_gguf_propagates_nan_and_inf_as_the_reference(gtype: str, N: int, K: int, act: torch.dtype) -> None:
    gen = generator(gtype, N, K, act)
    cw = gguf_weight(gtype, N, K, gen)
    spec = LayerSpec(cw.scheme, K, N, act_dtype=act, out_dtype=torch.float32)
    kernel = CpuNativeGGUF()
    assert kernel.supports(spec, CPU), kernel.supports(spec, CPU).reason
    state = kernel.prepare(cw, spec)
    bias = torch.randn(N, generator=gen)
    for M, rows in ((1, "nan"), (1, "inf"), (4, "mixed"), (11, "mixed")):  # GEMV, GEMM, ragged row tiles
        x = spoil(torch.randn(M, K, generator=gen), rows, gen).to(act)
        y = kernel.apply(state, x, bias)
        check_pattern(
            y, reference.linear(x, cw, bias, out_dtype=torch.float32), f"{gtype} {act} M={M} {rows}"
        )
    # a strided, bf16-output call takes the same path
    x = spoil(torch.randn(6, 2 * K, generator=gen), "mixed", gen).to(act)[:, ::2]
    out_spec = LayerSpec(cw.scheme, K, N, act_dtype=act, out_dtype=torch.bfloat16)
    y = kernel.apply(kernel.prepare(cw, out_spec), x)
    check_pattern(y, reference.linear(x, cw, out_dtype=torch.bfloat16), f"{gtype} {act} strided bf16 out")


@pytest.mark.parametrize(
    "scheme,N,K",
    [
        ("w8a8-int-ch-sym", 33, 200),
        ("w8a8-int-ch-sym-static", 48, 256),
        ("w8a8-int-tensor-sym-static", 17, 130),
    ],
)
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
def test_w8a8_propagates_nan_and_inf_as_the_reference(scheme: str, N: int, K: int, act: torch.dtype) -> None:
    gen = generator(scheme, N, K, act)
    cw = reference.quantize(torch.randn(N, K, generator=gen), scheme, calib=torch.randn(16, K, generator=gen))
    spec = LayerSpec(cw.scheme, K, N, act_dtype=act, out_dtype=torch.float32)
    verdict = NativeW8A8Int8.supports(spec, CPU)
    if not verdict:
        pytest.skip(f"cpu.native_w8a8_int8 cannot run here: {verdict.reason}")
    kernel = NativeW8A8Int8()
    state = kernel.prepare(cw, spec)
    for M, rows in ((1, "nan"), (1, "inf"), (4, "mixed"), (9, "mixed")):  # GEMV (M=1), GEMM (M >= 2)
        x = spoil(torch.randn(M, K, generator=gen), rows, gen).to(act)
        y = kernel.apply(state, x)
        check_pattern(y, reference.linear(x, cw, out_dtype=torch.float32), f"{scheme} {act} M={M} {rows}")
