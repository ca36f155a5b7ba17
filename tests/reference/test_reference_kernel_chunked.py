"""The reference kernel dequantizes row slices of bounded size, and computes what the oracle computes.

Every expectation comes from :func:`quantrt.reference.linear` / :func:`quantrt.reference.dequantize`
on the whole weight (the oracle), from the shape arithmetic of a chunk's budget, or from the
canonical layout rules written out here; none from the chunking code under test.
"""

from __future__ import annotations

import pytest
import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import registry
from quantrt.reference import dequantize, linear, quantize
from quantrt.reference.kernel import SCRATCH_BYTES, ReferenceKernel, plan_chunks
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

SCHEMES = [
    "w4a16-int-g128-asym-actorder",
    "w8a16-int-ch-sym",
    "w3a16-int-g128-asym",
    "w8a16-fp8-block128",
    "w8a8-fp8-ch",  # fp8 activations per token (dynamic)
    "w8a8-int-ch-sym-static",  # int8 activations, static per-tensor scale
    "w8a8-int-tensor-sym-static",  # per-slice tensor scales of a fused layer
    "w4a16-nvfp4",
    "w4a4-nvfp4",
    "w4a16-mxfp4",
    "w4a16-nf4-g64-dq",
    "w4a16-bnbfp4-g64",
    "gguf-q4_0",
    "gguf-q4_k",
    "gguf-q6_k",
]
K = 512
FUSED = (72, 40, 88)  # a q/k/v-like layer whose slices differ in size (and in scale, below)
ROWS = 50  # chunk rows asked for: not a divisor of any slice size, not a multiple of 64


def _weight(name: str, sizes: tuple[int, ...], k: int, gen: torch.Generator) -> CanonicalWeight:
    N = sum(sizes)
    # each fused slice on its own scale, so per-slice tensors (global_scale, offset, ...) differ
    mult = torch.cat([torch.full((s,), 4.0 ** (i - 1)) for i, s in enumerate(sizes)])
    w = torch.randn(N, k, generator=gen) * mult[:, None] * 0.05
    calib = torch.randn(32, k, generator=gen)
    cw = quantize(w, name, calib=calib, output_sizes=sizes)
    if (
        "offset" in cw.tensors
    ):  # each slice's double-quant state has its own offset (the quantizer shares one)
        cw.tensors["offset"] = cw["offset"] * (1 + 0.5 * torch.arange(len(sizes)))
    return cw


def _prepared(cw: CanonicalWeight, rows: int, out_dtype: torch.dtype | None = None):
    kern = ReferenceKernel(scratch_bytes=4 * cw.K * rows)
    spec = LayerSpec(
        cw.scheme, cw.K, cw.N, act_dtype=torch.float32, out_dtype=out_dtype, output_sizes=cw.output_sizes
    )
    return kern, spec, kern.prepare(cw, spec)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal within fp32 rounding of a reordered sum: 1e-6 of the output's scale, element by element."""
    assert y.shape == ref.shape and y.dtype == ref.dtype
    if ref.numel():
        tol = 1e-6 * float(ref.abs().max()) + 1e-30
        err = float((y.double() - ref.double()).abs().max())
        assert err <= tol, f"max abs error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("sizes", [FUSED, (136,)], ids=["fused", "single"])
@pytest.mark.parametrize("name", SCHEMES)
def test_chunks_match_the_oracle(name: str, sizes: tuple[int, ...], gen: torch.Generator) -> None:
    cw = _weight(name, sizes, K, gen)
    kern, _, state = _prepared(cw, ROWS)
    chunks = state.layout.chunks
    N = cw.N

    # the chunks tile [0, N) in order, each within the budget's rows (or one alignment unit)
    assert len(chunks) > 1, kern.strategy(state, 1)
    assert [a for a, _, _ in chunks] == [0] + [b for _, b, _ in chunks[:-1]] and chunks[-1][1] == N
    align = chunks[0][1] - chunks[0][0]
    assert all(b - a <= max(ROWS, align) for a, b, _ in chunks)
    assert f"{align}-row slices" in kern.strategy(state, 5)
    if name == "w8a16-fp8-block128":
        assert align == 128  # a cut never splits a 128-row scale block
    elif name == "w4a16-nf4-g64-dq":
        assert align == 32  # one nested absmax block: 256 blocks of 64 = 32 rows of 512
    else:
        assert align == ROWS
    if sizes == FUSED and align == ROWS:  # a chunk crosses a slice boundary
        assert any(a < 72 < b for a, b, _ in chunks)

    # each chunk stands for exactly its rows of the whole weight, as views of its tensors
    full = dequantize(cw)
    storages = {t.untyped_storage().data_ptr() for t in cw.tensors.values()}
    for a, b, chunk in chunks:
        assert (chunk.N, chunk.K, sum(chunk.output_sizes)) == (b - a, K, b - a)
        assert torch.equal(dequantize(chunk), full[a:b]), (a, b)
        assert {t.untyped_storage().data_ptr() for t in chunk.tensors.values()} <= storages

    for M in (0, 1, 5):
        x = torch.randn(M, K, generator=gen)
        _close(kern.apply(state, x), linear(x, cw))
    # a non-contiguous x, a bias, and out=
    x = torch.randn(K, 7, generator=gen).T
    bias = torch.randn(N, generator=gen)
    ref = linear(x, cw, bias)
    _close(kern.apply(state, x, bias), ref)
    out = torch.full((7, N), float("nan"))
    assert kern.apply(state, x, bias, out=out) is out
    _close(out, ref)
    # bf16 activations (a layer flattens 3-D ones to [M, K]), out dtype from the spec
    kern16, _, state16 = _prepared(cw, ROWS, out_dtype=torch.bfloat16)
    x3 = torch.randn(2, 3, K, generator=gen).to(torch.bfloat16)
    y = kern16.apply(state16, x3.reshape(6, K), bias).reshape(2, 3, N)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, N)
    ref16 = linear(x3, cw, bias, out_dtype=torch.bfloat16).float()
    assert bool(((y.float() - ref16).abs() <= 2**-7 * ref16.abs()).all())  # one bf16 rounding apart


def test_budget_rounds_to_whole_64_row_chunks(gen: torch.Generator) -> None:
    """A budget of 100 rows gives 64-row chunks (BLAS' blocking along N; the tail is ragged)."""
    cw = _weight("w4a16-int-g128-asym", FUSED, K, gen)
    kern, _, state = _prepared(cw, 100)  # 100 rows ask -> 64-row chunks
    assert [b - a for a, b, _ in state.layout.chunks] == [64, 64, 64, 8]
    x = torch.randn(9, K, generator=gen)
    _close(kern.apply(state, x), linear(x, cw))


@pytest.mark.parametrize("name", ["w4a16-nf4-g64", "w4a16-nf4-g64-dq", "w4a16-bnbfp4-g64-dq"])
def test_bnb_with_k_not_a_multiple_of_the_block_is_one_chunk(name: str, gen: torch.Generator) -> None:
    k = 96  # 64-blocks over the flattened weight straddle rows: no row cut is possible
    # (the oracle itself refuses per-slice double-quant offsets when blocks straddle rows)
    cw = _weight(name, (70,) if "-dq" in name else (40, 30), k, gen)
    kern, spec, state = _prepared(cw, 8)
    assert len(state.layout.chunks) == 1 and state.layout.chunks[0][2] is cw
    assert not state.layout.plan.bounded
    s = kern.strategy(state, 4)
    assert "whole weight" in s and "not a multiple of the blocksize" in s
    assert kern.scratch_bytes_of(spec, 4) == 4 * (70 * k + 4 * (k + 70))  # the whole fp32 weight
    x = torch.randn(4, k, generator=gen)
    _close(kern.apply(state, x), linear(x, cw))


def test_workspace_is_bounded() -> None:
    big = LayerSpec(parse_scheme("w4a16-int-g128-asym"), K=8192, N=57344)
    kern = ReferenceKernel()
    assert kern.scratch_bytes == SCRATCH_BYTES == 64 << 20
    m = 16
    ws = kern.scratch_bytes_of(big, m)
    assert ws == 4 * (2048 * 8192 + m * (8192 + 57344))
    assert ws < 4 * 57344 * 8192 // 20
    plan = plan_chunks(big.scheme, 57344, 8192, (), SCRATCH_BYTES)
    assert plan.bounded and plan.rows == 2048 and len(plan.bounds) == 28
    # fp8 128-blocks and bnb double quant (nested blocks of 256*64 elements = 2 rows of 8192)
    for name, rows in [("w8a16-fp8-block128", 2048), ("w4a16-nf4-g64-dq", 2048), ("gguf-q6_k", 2048)]:
        p = plan_chunks(parse_scheme(name), 57344, 8192, (), SCRATCH_BYTES)
        assert p.bounded and p.rows == rows, name
    # a layer small enough is one chunk, and says so
    small = LayerSpec(parse_scheme("w8a16-int-ch-sym"), K=1024, N=1024)
    assert kern.scratch_bytes_of(small, 4) == 4 * (1024 * 1024 + 4 * 2048)
    # a tiny budget still cuts on whole alignment units
    tiny = ReferenceKernel(scratch_bytes=1)
    assert tiny.scratch_bytes_of(LayerSpec(parse_scheme("w8a16-fp8-block128"), K=512, N=1024), 1) == 4 * (
        128 * 512 + 512 + 1024
    )


def test_strategy_of_a_small_layer_is_the_whole_weight(gen: torch.Generator) -> None:
    cw = _weight("gguf-q4_0", (64,), 256, gen)
    kern, _, state = _prepared(cw, 1000)
    assert len(state.layout.chunks) == 1 and state.layout.plan.bounded
    assert kern.strategy(state, 1) == "dequantize the whole weight (64 rows, fp32) + matmul"


def test_dispatch_facts_unchanged() -> None:
    assert registry().get("reference") is ReferenceKernel
    assert (ReferenceKernel.name, ReferenceKernel.backend) == ("reference", "reference")
    # the fallback of every device kind, tried after every registered list
    for kind in ("cpu", "cuda", "rocm", "xpu"):
        assert registry().candidates(kind)[-1] is ReferenceKernel
    spec = LayerSpec(parse_scheme("gguf-q4_k"), K=4096, N=4096)
    assert ReferenceKernel.supports(spec, None)
    # MoE experts: the reference runs them one expert at a time (quantrt.moe.loop)
    grouped = LayerSpec(parse_scheme("gguf-q4_k"), K=4096, N=4096, op="grouped", num_experts=4)
    assert ReferenceKernel.supports(grouped, None)
