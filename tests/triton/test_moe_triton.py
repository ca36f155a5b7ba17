"""The fused MoE grouped GEMM (``backends/triton/moe.py`` through the ``cuda.triton_moe_*`` kernel
classes) against an oracle that never sorts: each expert's assignments through
``quantrt.reference.linear`` on that expert's canonical weight (activations quantized as the scheme
says, over that expert's rows), plus bias, times the routing weight; rows of unheld experts zero.

Every scheme the kernels take, on awkward shapes (E = 3 and 5, K and N off the tiles where the
scheme allows, M = 1, top_k 1/2/4, ids -1 and E for experts held elsewhere, non-contiguous x,
gather on and off, bias, routing weights, ``out=`` full of NaN), with the K split on and off, and
one whole MoE layer (gate_up -> SwiGLU -> down weighted -> sum over top_k) against
``experts_reference``. On the CPU it runs under TRITON_INTERPRET=1 with fp16 and fp32 activations
(the interpreter's bf16 dot is wrong); tests/gpu/test_moe_cuda.py repeats the key cases in bf16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_moe import (
    CudaTritonMoeFp4,
    CudaTritonMoeFp8,
    CudaTritonMoeInt8,
    CudaTritonMoeWNA16,
)
from quantrt.backends.triton.moe import MoeTile, grid_tiles, moe_matmul
from quantrt.backends.triton.moe_act import gated_activation
from quantrt.capability import load_preset
from quantrt.moe import CanonicalExperts, ExpertBatch, experts_reference
from quantrt.moe.activation import Activation
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: rel Frobenius error bounds: fp16 output rounding (and fp16 dequantized weights); fp32 is exact
#: up to the accumulation order (the activation codes equal the reference's)
TOL = {torch.float16: 5e-3, torch.float32: 1e-4}

KERNELS = {
    "int": CudaTritonMoeWNA16,
    "fp8": CudaTritonMoeFp8,
    "int8": CudaTritonMoeInt8,
    "fp4": CudaTritonMoeFp4,
}

# (scheme, kernel, E, K, N): K and N off the tiles where the scheme allows it
CASES = [
    ("w4a16-int-g32-sym", "int", 3, 96, 40),
    ("w4a16-int-g64-asym", "int", 5, 128, 24),
    ("w4a16-int-ch-sym", "int", 3, 101, 40),  # odd K: the last byte's high nibble is padding
    ("w4a16-int-ch-asym", "int", 5, 72, 33),
    ("w8a16-int-g32-asym", "int", 3, 96, 40),
    ("w8a16-int-ch-sym", "int", 5, 70, 24),
    ("w8a8-fp8-ch", "fp8", 3, 100, 40),  # dynamic per token
    ("w8a8-fp8-tensor", "fp8", 5, 72, 33),
    ("w8a8-fp8-tensor-static", "fp8", 3, 100, 40),  # each expert its calibrated scale
    ("w8a8-fp8-ch-static", "fp8", 5, 64, 24),
    ("w8a8-fp8-ch-dyn", "fp8", 3, 80, 40),  # dynamic per tensor: the amax of each expert's rows
    ("w8a8-fp8-block128", "fp8", 3, 300, 200),  # ragged last blocks of N and K
    ("w8a8-fp8-block64x32", "fp8", 5, 96, 72),
    ("w4a16-mxfp4", "fp4", 3, 96, 40),
    ("w4a16-nvfp4", "fp4", 5, 64, 33),
    ("w4a4-nvfp4", "fp4", 3, 96, 24),  # the weight-only substitute
    ("w8a8-int-ch-sym", "int8", 3, 100, 40),
    ("w8a8-int-ch-sym-static", "int8", 5, 64, 24),
    ("w8a8-int-tensor-sym-static", "int8", 3, 72, 33),
    ("w8a8-int-ch-sym-dyn", "int8", 5, 80, 40),
]

# (M, top_k, gather, weighted, bias, x layout): M = 1 decode, unheld ids, larger M for the 64-row
# bucket (BM 32, GROUP_M 8)
ROUTES = [
    (1, 1, True, False, True, "contig"),
    (1, 4, True, True, False, "strided"),
    (6, 2, False, True, True, "transposed"),
    (28, 3, True, True, True, "contig"),
]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def make_experts(scheme: str, E: int, K: int, N: int, g: torch.Generator) -> CanonicalExperts:
    ws = []
    for _ in range(E):
        w = torch.randn(N, K, generator=g) * 0.05
        w[:, torch.randint(0, K, (2,), generator=g)] *= 6  # outlier columns
        calib = torch.randn(16, K, generator=g) * (1 + torch.rand(1, generator=g))  # scales differ per expert
        ws.append(reference.quantize(w, scheme, calib=calib))
    return CanonicalExperts.stack(ws)


def make_x(rows: int, K: int, layout: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if layout == "strided":
        x = torch.randn(rows, 2 * K, generator=g)[:, ::2]
    elif layout == "transposed":
        x = torch.randn(K, rows, generator=g).t()
    else:
        x = torch.randn(rows, K, generator=g)
    x = x * (1 + 3 * torch.rand(rows, 1, generator=g))  # rows of different magnitude
    return x.to(DEV, dtype)


def route(M: int, top_k: int, E: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E + 1, generator=g)[:top_k] for _ in range(M)]).clamp(max=E - 1)
    if M * top_k > 1:
        ids.view(-1)[torch.randint(0, M * top_k, (1,), generator=g)] = -1  # held elsewhere
    if M * top_k > 3:
        ids.view(-1)[2] = E  # also held elsewhere
    weights = torch.rand(M, top_k, generator=g) + 0.1
    return ids, weights


def oracle(
    x: torch.Tensor,
    experts: CanonicalExperts,
    batch: ExpertBatch,
    gather: bool,
    weighted: bool,
    bias: torch.Tensor | None,
    weight_only: bool,
) -> torch.Tensor:
    """Per expert: its assignments' rows through reference.linear (activation quantization over
    exactly those rows), bias, routing weight; unheld rows zero."""
    ids = batch.ids.cpu()
    y = torch.zeros(batch.A, experts.N, dtype=torch.float64)
    x32 = x.float().cpu()
    for e in range(experts.E):
        a = torch.nonzero(ids == e).flatten()
        if a.numel() == 0:
            continue
        rows = a // batch.top_k if gather else a
        ye = reference.linear(x32[rows], experts.expert(e), out_dtype=torch.float32, weight_only=weight_only)
        ye = ye.double()
        if bias is not None:
            ye = ye + bias[e].double().cpu()
        if weighted:
            ye = ye * batch.weights.cpu()[a].double()[:, None]
        y[a] = ye
    return y


def prepare(
    kind: str, experts: CanonicalExperts, dtype: torch.dtype, split: bool, swap: bool | None = None
) -> tuple:
    scheme = experts.scheme
    spec = LayerSpec(scheme, experts.K, experts.N, act_dtype=dtype, op="grouped", num_experts=experts.E)
    k = KERNELS[kind]()
    state = k.prepare(experts.to(DEV), spec)
    if not split:
        state.layout = dataclasses.replace(state.layout, targets=(0,) * len(state.layout.targets))
    if swap is not None:  # every bucket's tile with the transposed (swap) product on or off
        tiles = tuple(dataclasses.replace(t, swap=swap) for t in state.layout.tiles)
        state.layout = dataclasses.replace(state.layout, tiles=tiles, _split={})
    return k, state


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("scheme,kind,E,K,N", CASES, ids=[c[0] for c in CASES])
def test_grouped_matches_oracle(scheme: str, kind: str, E: int, K: int, N: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(sum(map(ord, scheme)) + 7 * E + K + N + (dtype == torch.float32))
    experts = make_experts(scheme, E, K, N, g)
    weight_only = parse_scheme(scheme).act == "nvfp4"  # the substitute keeps 16-bit activations
    assert KERNELS[kind].is_substitute(LayerSpec(experts.scheme, K, N, op="grouped")) == weight_only
    for i, (M, top_k, gather, weighted, with_bias, layout) in enumerate(ROUTES):
        split = i % 2 == 1  # small batches with and without the K split
        swap = i < 2  # weight-only kinds: the transposed product, with and without the split
        _, state = prepare(kind, experts, dtype, split, swap)
        ids, tw = route(M, top_k, E, g)
        batch = ExpertBatch(ids.to(DEV), tw.to(DEV), E)
        x = make_x(M if gather else M * top_k, K, layout, dtype, g)
        bias = torch.randn(E, N, generator=g).to(DEV, dtype) if with_bias else None
        out = None
        if i == 2:  # out= full of NaN: every row is written, unheld rows with zeros
            out = torch.full((M * top_k, N), float("nan"), dtype=dtype, device=DEV)
        y = state(x, batch, gather=gather, weighted=weighted, bias=bias, out=out)
        assert y.shape == (M * top_k, N) and y.dtype == dtype
        if out is not None:
            assert y.data_ptr() == out.data_ptr()
        assert torch.isfinite(y).all()
        ref = oracle(x, experts, batch, gather, weighted, bias, weight_only)
        unheld = batch.ids.cpu() == E
        assert (y.cpu()[unheld] == 0).all()
        err = rel(y, ref)
        assert err < TOL[dtype], (scheme, M, top_k, gather, split, err)


def test_nvfp4_negative_and_subnormal_scales() -> None:
    """NVFP4 block scales the load-time re-encoding (``bf16_byte_scales``) must carry exactly: a
    quarter negative (their codes' signs flipped instead), and expert 0's all subnormal e4m3 (codes
    1..7, its global scale raised 2^15 so its rows keep their size), through the portable decode."""
    g = torch.Generator().manual_seed(29)
    c = make_experts("w4a16-nvfp4", 3, 64, 40, g)
    t = dict(c.tensors)
    s = t["scales"].view(torch.uint8).clone()
    s[torch.rand(s.shape, generator=g) < 0.25] |= 0x80
    s[0] = torch.randint(1, 8, s[0].shape, generator=g, dtype=torch.uint8) | (s[0] & 0x80)
    t["scales"] = s.view(torch.float8_e4m3fn)
    t["global_scale"] = t["global_scale"].clone()
    t["global_scale"][0] *= 2.0**15
    experts = CanonicalExperts(c.scheme, c.E, c.N, c.K, t, c.output_sizes)
    _, state = prepare("fp4", experts, torch.float32, False)
    ids = torch.tensor([[0, 1], [2, 0], [0, 0], [1, 2]])
    batch = ExpertBatch(ids.to(DEV), torch.rand(4, 2, generator=g).to(DEV) + 0.1, 3)
    x = make_x(4, 64, "contig", torch.float32, g)
    y = state(x, batch, gather=True, weighted=True)
    ref = oracle(x, experts, batch, True, True, None, True)
    zero = batch.ids.cpu() == 0
    assert rel(y[zero], ref[zero]) < TOL[torch.float32]  # expert 0's rows alone: the subnormal scales
    assert rel(y, ref) < TOL[torch.float32]


@pytest.mark.parametrize(
    "tile",
    [
        MoeTile(16, 16, 64),
        MoeTile(16, 32, 64, split_k=3),
        MoeTile(32, 64, 64, group_m=4, num_warps=2, num_stages=2),
        MoeTile(64, 16, 64, group_m=2, split_k=2),
        MoeTile(16, 32, 64, split_k=2, swap=True),
        MoeTile(32, 16, 64, group_m=2, swap=True),
    ],
    ids=str,
)
def test_launcher_tiles(tile: MoeTile) -> None:
    """moe_matmul itself on several tiles (swizzled M groups, K splits, a split with nothing to do,
    N tiles of 16), int4 with group scales and fp16 activations."""
    g = torch.Generator().manual_seed(tile.block_m * 7 + tile.block_n + tile.split_k)
    E, K, N = 5, 128, 50
    experts = make_experts("w4a16-int-g64-asym", E, K, N, g)
    _, state = prepare("int", experts, torch.float16, False)
    lay = state.layout
    M, top_k = 13, 2
    ids, tw = route(M, top_k, E, g)
    batch = ExpertBatch(ids.to(DEV), tw.to(DEV), E)
    x = make_x(M, K, "contig", torch.float16, g)
    sid, bexp, npad = batch.aligned(tile.block_m)
    order, offsets = batch.sorted()
    assert grid_tiles(batch.A, E, tile.block_m) * tile.block_m >= int(npad)
    y = moe_matmul(
        x, lay.weights, sid, bexp, npad, order, offsets, batch.A, top_k, tile, torch.float16,
        topk_weights=batch.weights,
    )  # fmt: skip
    ref = oracle(x, experts, batch, True, True, None, False)
    assert (y.cpu()[batch.ids.cpu() == E] == 0).all()
    assert rel(y, ref) < TOL[torch.float16]
    with pytest.raises(ValueError, match="divide the group"):
        moe_matmul(
            x, lay.weights, sid, bexp, npad, order, offsets, batch.A, top_k,
            dataclasses.replace(tile, block_k=128), torch.float16,
        )  # fmt: skip


def test_every_assignment_unheld() -> None:
    """Expert parallelism where this rank holds none of the batch's experts: all zeros, no tile runs."""
    g = torch.Generator().manual_seed(3)
    E, K, N = 3, 64, 24
    experts = make_experts("w8a8-fp8-ch", E, K, N, g)
    _, state = prepare("fp8", experts, torch.float16, True)
    batch = ExpertBatch(torch.full((4, 2), -1).to(DEV), torch.rand(4, 2).to(DEV), E)
    out = torch.full((8, N), float("nan"), dtype=torch.float16, device=DEV)
    y = state(torch.randn(4, K).to(DEV, torch.float16), batch, gather=True, weighted=True, out=out)
    assert (y == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "gate_up_scheme,down_scheme",
    [
        ("w4a16-int-g32-asym", "w8a16-int-ch-sym"),
        ("w8a8-fp8-ch", "w8a8-fp8-tensor-static"),
        ("w8a8-fp8-block64x32", "w8a8-fp8-block64x32"),
        ("w4a16-mxfp4", "w4a16-nvfp4"),
        ("w8a8-int-ch-sym", "w8a8-int-ch-sym-dyn"),
    ],
)
def test_whole_layer_matches_experts_reference(
    gate_up_scheme: str, down_scheme: str, dtype: torch.dtype
) -> None:
    """gate_up (gathered, bias) -> SwiGLU -> down (weighted, bias) -> sum over top_k, each projection
    prepared by its kernel class, against the fp32 MoE oracle (with an expert held elsewhere)."""
    g = torch.Generator().manual_seed(sum(map(ord, gate_up_scheme + down_scheme)) + (dtype == torch.float32))
    E, H, Inter, M, top_k = 5, 64, 96, 9, 2
    gate_up = make_experts(gate_up_scheme, E, H, 2 * Inter, g)
    down = make_experts(down_scheme, E, Inter, H, g)
    kinds = {s: next(k for k, c in KERNELS.items() if c.can_implement(_spec(s), load_preset("h100").accelerators[0]))
             for s in (gate_up_scheme, down_scheme)}  # fmt: skip
    _, gu = prepare(kinds[gate_up_scheme], gate_up, dtype, True)
    _, dn = prepare(kinds[down_scheme], down, dtype, True)
    ids, tw = route(M, top_k, E, g)
    b13 = torch.randn(E, 2 * Inter, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g) * 0.1
    x = make_x(M, H, "contig", dtype, g)
    batch = ExpertBatch(ids.to(DEV), tw.to(DEV), E)
    h = gu(x, batch, gather=True, bias=b13.to(DEV, dtype))
    a = Activation("silu")(h)
    y = dn(a, batch, gather=False, weighted=True, bias=b2.to(DEV, dtype))
    got = y.view(M, top_k, H).sum(dim=1, dtype=torch.float32)
    ref = experts_reference(
        x.cpu(), ids, tw, gate_up, down, "silu", gate_up_bias=b13.to(dtype), down_bias=b2.to(dtype),
        out_dtype=torch.float32,
    )  # fmt: skip
    # fp16: h and the activation are rounded to fp16 between the projections (the oracle keeps fp32)
    tol = 2e-2 if dtype == torch.float16 else 1e-3
    assert rel(got, ref) < tol
    # the top_k sum in the kernel's own launches (the layer's path), rounded once
    combined = dn.combined(a, batch, bias=b2.to(DEV, dtype))
    assert combined.shape == (M, H) and combined.dtype == dtype
    assert rel(combined, ref) < tol
    # block fp8: the activation fused with the down projection's group quantization (the layer's
    # path) gives what the one-launch activation then the projection's own quantization give
    assert (dn.activate_into is not None) == ("block" in down_scheme)
    if dn.activate_into is not None:
        fused = dn.combined(dn.activate_into(h, Activation("silu")), batch, bias=b2.to(DEV, dtype))
        unfused = dn.combined(gated_activation(h, "silu"), batch, bias=b2.to(DEV, dtype))
        assert torch.equal(fused, unfused)


@pytest.mark.parametrize("bound", [0, 1 << 22], ids=["rows_then_sum", "in_the_split_sum"])
def test_combined_either_way(monkeypatch: pytest.MonkeyPatch, bound: int) -> None:
    """``PreparedExperts.combined``: past COMBINE_MAX_ELEMENTS (unsplit) the bf16 rows and a sum,
    under it the fp32 planes; both equal the oracle's weighted sum over top_k."""
    from quantrt.backends.cuda import triton_moe

    monkeypatch.setattr(triton_moe, "COMBINE_MAX_ELEMENTS", bound)
    g = torch.Generator().manual_seed(5 + bound)
    E, K, N, M, top_k = 5, 64, 40, 6, 3
    experts = make_experts("w8a16-int-ch-sym", E, K, N, g)
    _, state = prepare("int", experts, torch.float16, False)
    ids, tw = route(M, top_k, E, g)
    batch = ExpertBatch(ids.to(DEV), tw.to(DEV), E)
    x = make_x(M * top_k, K, "contig", torch.float16, g)
    y = state.combined(x, batch)
    ref = oracle(x, experts, batch, False, True, None, False).view(M, top_k, N).sum(dim=1)
    assert y.shape == (M, N) and y.dtype == torch.float16
    assert rel(y, ref) < TOL[torch.float16]


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("top_k", [2, 4])
def test_top_k_rows_combined_in_the_split_sum(split_k: int, top_k: int) -> None:
    """``reduce_rows=top_k``: each token's top_k weighted rows summed in fp32 by the launch that sums
    the K splits, with an expert held elsewhere (its rows add zero) and a bias."""
    g = torch.Generator().manual_seed(31 * split_k + top_k)
    E, K, N, M = 5, 128, 50, 7
    experts = make_experts("w4a16-int-g64-asym", E, K, N, g)
    _, state = prepare("int", experts, torch.float16, False)
    ids, tw = route(M, top_k, E, g)
    batch = ExpertBatch(ids.to(DEV), tw.to(DEV), E)
    x = make_x(M * top_k, K, "contig", torch.float16, g)
    bias = (torch.randn(E, N, generator=g) * 0.1).to(DEV, torch.float16)
    tile = MoeTile(16, 32, 64, split_k=split_k)
    sid, bexp, npad = batch.aligned(tile.block_m)
    order, offsets = batch.sorted()
    y = moe_matmul(
        x, state.layout.weights, sid, bexp, npad, order, offsets, batch.A, 1, tile, torch.float16,
        topk_weights=batch.weights, bias=bias, reduce_rows=top_k,
    )  # fmt: skip
    ref = oracle(x, experts, batch, False, True, bias, False).view(M, top_k, N).sum(dim=1)
    assert y.shape == (M, N)
    assert rel(y, ref) < TOL[torch.float16]
    with pytest.raises(ValueError, match="must divide"):
        moe_matmul(
            x, state.layout.weights, sid, bexp, npad, order, offsets, batch.A, 1, tile, torch.float16,
            reduce_rows=3 if top_k == 2 else 5,
        )  # fmt: skip


def _spec(scheme: str) -> LayerSpec:
    return LayerSpec(parse_scheme(scheme), 64, 64, op="grouped", num_experts=3)


def test_refusals_name_their_reason() -> None:
    h100 = load_preset("h100").accelerators[0]
    v = CudaTritonMoeWNA16.supports(_spec("w4a16-int-g128-sym-actorder"), h100)
    assert not v and "act-order" in v.reason
    v = CudaTritonMoeWNA16.supports(LayerSpec(parse_scheme("w4a16-int-g16-sym"), 64, 64, op="grouped"), h100)
    assert not v and "multiple of 32" in v.reason
    v = CudaTritonMoeWNA16.supports(LayerSpec(parse_scheme("w4a16-int-g128-sym"), 128, 64), h100)
    assert not v and "grouped" in v.reason  # linear layers are not this kernel's
    assert not CudaTritonMoeFp8.supports(_spec("w8a16-fp8-ch"), h100)
    assert CudaTritonMoeFp8.supports(_spec("w8a8-fp8-block128"), h100)
    a100 = load_preset("a100").accelerators[0]
    v = CudaTritonMoeFp8.supports(_spec("w8a8-fp8-ch"), a100)
    assert not v and "fp8 matrix units" in v.reason
    assert CudaTritonMoeFp4.supports(_spec("w4a4-nvfp4"), h100)
    assert CudaTritonMoeFp4.is_substitute(_spec("w4a4-nvfp4"))
    assert not CudaTritonMoeFp4.is_substitute(_spec("w4a16-mxfp4"))
    assert CudaTritonMoeInt8.supports(_spec("w8a8-int-tensor-sym-static"), h100)


def test_nan_scale_codes_refused_at_load() -> None:
    g = torch.Generator().manual_seed(5)
    experts = make_experts("w4a16-mxfp4", 3, 64, 16, g)
    experts.tensors["scales"][1, 2, 0] = 255
    with pytest.raises(ValueError, match="NaN"):
        prepare("fp4", experts, torch.float16, True)


def test_lane_order_is_the_cuda_kernels_lane_layout() -> None:
    """The Triton GEMM's "lane" layout reads the CUDA tensor-core kernel's repack: position p of a
    chunk (``lane_positions``, x reordered by ``lane_order``) is the input ``wna16_layout.lane_k``
    gives the low (p < 64) or high nibble of column 0's code byte p % 64 (lanes 0..3 hold its 64)."""
    from quantrt.backends.cuda.wna16_layout import lane_k
    from quantrt.backends.triton.moe import lane_order, lane_positions

    k = lane_k(4)[:4].reshape(64, 2)  # lanes t = 0..3 of column 0: byte 16 t + i, (low, high)
    assert torch.equal(lane_positions(), torch.cat((k[:, 0], k[:, 1])))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 300, generator=g)
    xl = lane_order(x)
    assert xl.shape == (3, 384)
    for c in range(3):
        for p in range(128):
            src = c * 128 + int(lane_positions()[p])
            want = x[:, src] if src < 300 else torch.zeros(3)
            assert torch.equal(xl[:, c * 128 + p], want)


@pytest.mark.parametrize("R", [1, 2, 8])
def test_sum_rows_adds_each_tokens_rows(R: int) -> None:
    """``sum_rows``: runs of R rows summed in fp32, rounded once (fp16 rows of very different sizes,
    N off a power of two), against the fp64 sum rounded once."""
    from quantrt.backends.triton.moe import sum_rows

    g = torch.Generator().manual_seed(R)
    y = (torch.randn(6 * R, 300, generator=g) * torch.logspace(-3, 3, 6 * R)[:, None]).to(DEV, torch.float16)
    got = sum_rows(y, R)
    want = y.double().cpu().view(6, R, 300).sum(1).to(torch.float16)
    assert got.shape == (6, 300) and got.dtype == torch.float16
    assert rel(got, want) < 1e-3
    assert sum_rows(y, R, torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="must divide"):
        sum_rows(y[:-1], 2 if R == 1 else R)
