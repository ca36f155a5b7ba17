"""The fused MoE grouped GEMMs (``cuda.triton_moe_*``) on a real GPU, in bf16: dispatch picks them for
grouped layers, whole QuantExperts layers match ``experts_reference`` (expert parallelism included),
each projection matches a per-expert oracle on awkward shapes, and a whole forward captures into a
CUDA graph and compiles with ``torch.compile(fullgraph=True)`` through ``quantrt::experts``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_moe import (
    CudaTritonMoeFp4,
    CudaTritonMoeFp8,
    CudaTritonMoeInt8,
    CudaTritonMoeWNA16,
)
from quantrt.env import Overrides
from quantrt.moe import CanonicalExperts, ExpertBatch, QuantExperts, experts_reference
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

BF16 = torch.bfloat16
#: whole layers: bf16 rounding of h, of the activation and of the output (the oracle keeps fp32)
LAYER_TOL = 2e-2
#: whole layers whose activations are quantized to 8 bits (fp8/int8 W8A8) before each projection
W8A8_LAYER_TOL = 3e-2
#: one projection: bf16 dequantized weights and output
PROJ_TOL = 1e-2

# (scheme, the kernel dispatch must pick)
SCHEMES = [
    ("w4a16-int-g128-asym", "cuda.triton_moe_wna16"),
    ("w4a16-int-g128-sym", "cuda.triton_moe_wna16"),
    ("w4a16-int-ch-sym", "cuda.triton_moe_wna16"),
    ("w8a16-int-g128-asym", "cuda.triton_moe_wna16"),
    ("w8a8-fp8-ch", "cuda.triton_moe_fp8"),
    ("w8a8-fp8-tensor-static", "cuda.triton_moe_fp8"),
    ("w8a8-fp8-block128", "cuda.triton_moe_fp8"),
    ("w4a16-mxfp4", "cuda.triton_moe_fp4"),
    ("w4a16-nvfp4", "cuda.triton_moe_fp4"),
    ("w4a4-nvfp4", "cuda.triton_moe_fp4"),
    ("w8a8-int-ch-sym", "cuda.triton_moe_int8"),
]
KERNELS = {
    "cuda.triton_moe_wna16": CudaTritonMoeWNA16,
    "cuda.triton_moe_fp8": CudaTritonMoeFp8,
    "cuda.triton_moe_fp4": CudaTritonMoeFp4,
    "cuda.triton_moe_int8": CudaTritonMoeInt8,
}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def experts(scheme: str, E: int, K: int, N: int, g: torch.Generator) -> CanonicalExperts:
    ws = []
    for _ in range(E):
        w = torch.randn(N, K, generator=g) * 0.05
        w[:, torch.randint(0, K, (2,), generator=g)] *= 6
        ws.append(reference.quantize(w, scheme, calib=torch.randn(32, K, generator=g) * 2))
    return CanonicalExperts.stack(ws)


def awkward_nvfp4(scheme: str, E: int, K: int, N: int, g: torch.Generator) -> CanonicalExperts:
    """NVFP4 experts whose block scales the load-time re-encoding (``bf16_byte_scales``) must carry
    exactly: a quarter negative (sign bit set), and expert 0's all subnormal e4m3 (codes 1..7, its
    global scale raised 2^15 so its outputs keep their size)."""
    c = experts(scheme, E, K, N, g)
    t = dict(c.tensors)
    s = t["scales"].view(torch.uint8).clone()
    s[torch.rand(s.shape, generator=g) < 0.25] |= 0x80
    s[0] = torch.randint(1, 8, s[0].shape, generator=g, dtype=torch.uint8) | (s[0] & 0x80)
    t["scales"] = s.view(torch.float8_e4m3fn)
    t["global_scale"] = t["global_scale"].clone()
    t["global_scale"][0] *= 2.0**15
    return CanonicalExperts(c.scheme, c.E, c.N, c.K, t, c.output_sizes)


def weight_only(c: CanonicalExperts) -> CanonicalExperts:
    """The weight-only reference of a weight-only substitute (W4A4 NVFP4 runs with bf16 activations)."""
    if c.scheme.act != "nvfp4":
        return c
    tensors = {k: v for k, v in c.tensors.items() if k != "input_global_scale"}
    return CanonicalExperts(parse_scheme("w4a16-nvfp4"), c.E, c.N, c.K, tensors, c.output_sizes)


def routing(M: int, E: int, top_k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(M, E, generator=g)
    w, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def layer(scheme: str, E: int, H: int, Inter: int, seed: int, **kw: object) -> tuple:
    g = torch.Generator().manual_seed(seed)
    gate_up = experts(scheme, E, H, 2 * Inter, g)
    down = experts(scheme, E, Inter, H, g)
    b13 = torch.randn(E, 2 * Inter, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g) * 0.1
    m = QuantExperts.from_canonical(
        gate_up, down, gate_up_bias=b13, down_bias=b2, act_dtype=BF16, device="cuda", **kw
    )
    return m, gate_up, down, b13, b2, g


@pytest.mark.parametrize("scheme,kernel", SCHEMES, ids=[s for s, _ in SCHEMES])
def test_layer_picks_fused_kernel_and_matches_reference(scheme: str, kernel: str) -> None:
    E, H, Inter = 5, 256, 384  # the down projection's K (Inter) a multiple of the 128 groups and blocks
    m, gate_up, down, b13, b2, g = layer(scheme, E, H, Inter, seed=len(scheme))
    assert set(m.kernel_names.values()) == {kernel}, m.kernel_names
    for M, top_k in ((1, 2), (7, 4), (300, 2)):
        ids, w = routing(M, E, top_k, g)
        x = torch.randn(M, H, generator=g).to("cuda", BF16)
        y = m(x, ids.cuda(), w.cuda())
        assert y.shape == (M, H) and y.dtype == BF16
        ref = experts_reference(
            x.cpu(), ids, w, weight_only(gate_up), weight_only(down), "silu",
            gate_up_bias=b13.to(BF16), down_bias=b2.to(BF16), out_dtype=torch.float32,
        )  # fmt: skip
        # 8-bit activations: the bf16 h quantizes to other codes than the oracle's fp32 h in places
        tol = LAYER_TOL if parse_scheme(scheme).act in (None, "nvfp4") else W8A8_LAYER_TOL
        assert rel(y, ref) < tol, (scheme, M, top_k, rel(y, ref))


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-sym", "w8a8-fp8-ch", "w4a16-mxfp4"])
def test_expert_parallel_rank_zeroes_other_experts(scheme: str) -> None:
    E, H, Inter = 6, 256, 256
    m, gate_up, down, b13, b2, g = layer(scheme, E, H, Inter, seed=11, ep_rank=1, ep_size=2)
    ids, w = routing(33, E, 3, g)
    x = torch.randn(33, H, generator=g).to("cuda", BF16)
    y = m(x, ids.cuda(), w.cuda())
    emap = torch.full((E,), -1, dtype=torch.int64)
    emap[3:] = torch.arange(3)
    # the oracle takes every expert by global id and drops those the map sends to -1
    ref = experts_reference(
        x.cpu(), ids, w, gate_up, down, "silu", gate_up_bias=b13.to(BF16), down_bias=b2.to(BF16),
        expert_map=emap, out_dtype=torch.float32,
    )  # fmt: skip
    assert rel(y, ref) < LAYER_TOL


def _graph_case(scheme: str) -> tuple:
    E, H, Inter = 8, 512, 384
    m, *_, g = layer(scheme, E, H, Inter, seed=3)
    return m, g, E, H


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-sym", "w8a8-fp8-ch", "w8a8-fp8-block128", "w4a16-mxfp4"])
def test_forward_captures_in_cuda_graph(scheme: str) -> None:
    m, g, E, H = _graph_case(scheme)
    for M in (1, 64):
        ids, w = routing(M, E, 2, g)
        x = torch.randn(M, H, generator=g).to("cuda", BF16)
        sx, sids, sw = x.clone(), ids.cuda(), w.cuda()
        eager = m(sx, sids, sw)  # warms up (compiles every kernel the capture will launch)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = m(sx, sids, sw)
        graph.replay()
        torch.cuda.synchronize()
        # K splits add fp32 partial sums with atomics: equal up to the order of those sums
        assert rel(out, eager) < 1e-2
        ids2, w2 = routing(M, E, 2, g)  # new routing and inputs into the captured buffers
        x2 = torch.randn(M, H, generator=g).to("cuda", BF16)
        sx.copy_(x2)
        sids.copy_(ids2)
        sw.copy_(w2)
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, m(x2, ids2.cuda(), w2.cuda())) < 1e-2


def test_torch_compile_fullgraph() -> None:
    m, g, E, H = _graph_case("w4a16-int-g128-asym")
    ids, w = routing(16, E, 2, g)
    x = torch.randn(16, H, generator=g).to("cuda", BF16)

    def f(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return m(x * 2, ids, w) + 1

    cf = torch.compile(f, fullgraph=True)
    y = cf(x, ids.cuda(), w.cuda())
    assert rel(y, f(x, ids.cuda(), w.cuda())) < 1e-2


def test_forced_kernel_env() -> None:
    """QUANTRT_KERNEL names a fused kernel; a scheme it cannot take is a clear error."""
    m, *_ = layer("w8a8-fp8-ch", 4, 256, 128, seed=1, overrides=Overrides(kernel="cuda.triton_moe_fp8"))
    assert set(m.kernel_names.values()) == {"cuda.triton_moe_fp8"}
    with pytest.raises(Exception, match="triton_moe_fp8"):
        layer("w4a16-int-g128-sym", 4, 256, 128, seed=1, overrides=Overrides(kernel="cuda.triton_moe_fp8"))


# (scheme, E, K, N): N and K off the tiles where the scheme allows
PROJ = [
    ("w4a16-int-g64-asym", 5, 320, 200),
    ("w4a16-int-ch-sym", 3, 301, 72),
    ("w8a16-int-ch-asym", 5, 200, 136),
    ("w8a8-fp8-ch", 3, 300, 200),
    ("w8a8-fp8-tensor-static", 5, 264, 100),
    ("w8a8-fp8-ch-dyn", 3, 200, 72),
    ("w8a8-fp8-block128", 5, 300, 260),
    ("w4a16-mxfp4", 3, 320, 200),
    ("w4a16-nvfp4", 5, 256, 72),
    ("w8a8-int-ch-sym-static", 3, 200, 100),
]


def kernel_for(scheme: str) -> type:
    spec = LayerSpec(parse_scheme(scheme), 256, 256, op="grouped", num_experts=4)
    from quantrt.capability import probe

    dev = probe().accelerators[0]
    return next(k for k in KERNELS.values() if k.supports(spec, dev))


@pytest.mark.parametrize("split", [True, False], ids=["split_auto", "no_split"])
@pytest.mark.parametrize("scheme,E,K,N", PROJ, ids=[p[0] for p in PROJ])
def test_projection_matches_oracle(scheme: str, E: int, K: int, N: int, split: bool) -> None:
    check_projection(scheme, E, K, N, split)


@pytest.mark.parametrize(
    "scheme,E,K,N,dtype",
    [
        ("w4a16-int-g64-asym", 5, 320, 200, BF16),
        ("w4a16-int-g64-asym", 5, 320, 200, torch.float16),
        ("w4a16-int-ch-sym", 3, 301, 72, BF16),
        ("w4a16-int-g32-sym", 3, 256, 96, torch.float16),
        ("w4a16-mxfp4", 3, 320, 200, BF16),
        ("w4a16-nvfp4", 5, 256, 72, BF16),
    ],
    ids=["int4-g64-asym-bf16", "int4-g64-asym-fp16", "int4-ch-sym-bf16", "int4-g32-fp16", "mxfp4", "nvfp4"],
)
@pytest.mark.parametrize("split", [True, False], ids=["split_auto", "no_split"])
def test_ptx_decodes_match_oracle(
    scheme: str, E: int, K: int, N: int, dtype: torch.dtype, split: bool
) -> None:
    """The PTX 4-bit decodes (backends/cuda/triton_decode.py, the default; QUANTRT_MOE_PTX_DECODE=0 is off)
    forced on, in bf16 and fp16, through the tiles and the transposed product."""
    from quantrt.backends.cuda.triton_decode import e2m1_scaled, int4_minus

    for swap in (False, True):
        check_projection(scheme, E, K, N, split, dtype, decoders=(int4_minus, e2m1_scaled), swap=swap)


@pytest.mark.parametrize("swap", [False, True], ids=["tiles", "swap"])
def test_nvfp4_negative_and_subnormal_scales(swap: bool) -> None:
    """NVFP4 scales re-encoded at load through the PTX decode's lifted tables: negative block scales
    (their codes' signs flipped) and subnormal e4m3 ones (normal bf16 after the 2^-117 lift)."""
    from quantrt.backends.cuda.triton_decode import e2m1_scaled, int4_minus

    check_projection(
        "w4a16-nvfp4", 5, 256, 72, True, decoders=(int4_minus, e2m1_scaled), swap=swap, make=awkward_nvfp4
    )


def oracle(
    c: CanonicalExperts,
    batch: ExpertBatch,
    x: torch.Tensor,
    bias: torch.Tensor,
    tw: torch.Tensor,
    gather: bool,
) -> torch.Tensor:
    """Each expert's assignments through reference.linear on its canonical weight, plus bias, times the
    routing weight; rows of unheld assignments zero. fp64 [A, N]."""
    ids_c = batch.ids.cpu()
    ref = torch.zeros(batch.A, c.N, dtype=torch.float64)
    for e in range(c.E):
        a = torch.nonzero(ids_c == e).flatten()
        if a.numel():
            rows = a // batch.top_k if gather else a
            ye = reference.linear(x.float().cpu()[rows], c.expert(e), out_dtype=torch.float32).double()
            ref[a] = (ye + bias[e].double().cpu()) * tw.reshape(-1)[a].double()[:, None]
    return ref


def check_projection(
    scheme: str,
    E: int,
    K: int,
    N: int,
    split: bool,
    dtype: torch.dtype = BF16,
    decoders: tuple | None = None,
    swap: bool | None = None,
    make: Any = experts,
) -> None:
    g = torch.Generator().manual_seed(E + K + N)
    c = make(scheme, E, K, N, g)
    spec = LayerSpec(c.scheme, K, N, act_dtype=dtype, op="grouped", num_experts=E)
    state = kernel_for(scheme)().prepare(c.to("cuda"), spec)
    if not split:
        state.layout = dataclasses.replace(state.layout, targets=(0,) * len(state.layout.targets))
    if decoders is not None:
        state.layout.decoders = decoders
    if swap is not None:
        tiles = tuple(dataclasses.replace(t, swap=swap) for t in state.layout.tiles)
        state.layout = dataclasses.replace(state.layout, tiles=tiles, _split={})
    for M, top_k, gather in ((1, 2, True), (5, 4, False), (700, 2, True)):
        ids, tw = routing(M, E, min(top_k, E), g)
        top_k = ids.shape[1]
        ids.view(-1)[0] = -1  # held elsewhere
        batch = ExpertBatch(ids.cuda(), tw.cuda(), E)
        x = torch.randn(M if gather else M * top_k, 2 * K, generator=g)[:, ::2].to("cuda", dtype)
        bias = torch.randn(E, N, generator=g).to("cuda", dtype)
        y = state(x, batch, gather=gather, weighted=True, bias=bias)
        ids_c = batch.ids.cpu()
        ref = oracle(c, batch, x, bias, tw, gather)
        assert (y.cpu()[ids_c == E] == 0).all()
        assert rel(y, ref) < PROJ_TOL, (scheme, M, split, rel(y, ref))


@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4", "awkward-nvfp4"])
def test_fp4_mma_grouped_matches_oracle(scheme: str) -> None:
    """NVFP4/MXFP4 experts on the tensor-core kernel (``wna16_moe``, the few-token path): every
    launch shape (1, 8 and 16 rows per tile), top_k 1/2/4, ids held elsewhere, gather on and off,
    x with a row stride off 16 bytes, ``out=`` full of NaN, bias and routing weights; and the same
    batches through the Triton GEMM over the same lane-layout bytes (the CUDA path switched off)."""
    make = awkward_nvfp4 if scheme.startswith("awkward") else experts
    name = "w4a16-nvfp4" if scheme.startswith("awkward") else scheme
    E, K, N = 5, 320, 200  # K padded to whole 128-input chunks, N off the 64-column alignment
    g = torch.Generator().manual_seed(len(scheme) + 41)
    c = make(name, E, K, N, g)
    spec = LayerSpec(c.scheme, K, N, act_dtype=BF16, op="grouped", num_experts=E)
    state = CudaTritonMoeFp4().prepare(c.to("cuda"), spec)
    assert state.layout.mma is not None and "CUDA mma grouped" in state.strategies[0].name
    fused = state.layout
    triton_only = dataclasses.replace(fused, mma=None)
    cases = ((1, 1, True), (1, 4, False), (3, 2, True), (8, 4, True), (16, 2, False), (13, 4, True))
    for i, (M, top_k, gather) in enumerate(cases):
        ids, tw = routing(M, E, top_k, g)
        if ids.numel() > 1:
            ids.view(-1)[i % ids.numel()] = -1 if i % 2 else E  # held elsewhere
        batch = ExpertBatch(ids.cuda(), tw.cuda(), E)
        rows = M if gather else M * top_k
        x = torch.randn(rows, K + 3, generator=g)[:, :K].to("cuda", BF16)  # row stride off 16 bytes
        bias = torch.randn(E, N, generator=g).to("cuda", BF16)
        ids_c = batch.ids.cpu()
        ref = oracle(c, batch, x, bias, tw, gather)
        for lay in (fused, triton_only):
            state.layout = lay
            out = torch.full((batch.A, N), float("nan"), dtype=BF16, device="cuda")
            y = state(x, batch, gather=gather, weighted=True, bias=bias, out=out)
            assert y.data_ptr() == out.data_ptr() and torch.isfinite(y).all()
            assert (y.cpu()[ids_c == E] == 0).all()
            assert rel(y, ref) < PROJ_TOL, (scheme, M, top_k, gather, lay.mma is None, rel(y, ref))
            combined = state.combined(x, batch, bias=bias) if not gather else None
            if combined is not None:
                want = ref.view(M, top_k, N).sum(1)
                assert rel(combined, want) < PROJ_TOL, (scheme, M, top_k, "combined", rel(combined, want))
