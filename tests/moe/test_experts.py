"""QuantExperts on this machine's grouped kernels against the fp32 oracle (quantrt.moe.reference:
every (token, expert) pair on its own, from the dequantized experts), for every catalog scheme,
with awkward shapes and routings: experts not a multiple of anything, top-k 1/2/4/8, one token,
no token, tokens routed to experts this rank does not hold, non-contiguous inputs, biases and
gpt-oss's clamped SwiGLU; then tensor and expert parallelism (the ranks' outputs sum to the whole
layer's), torch.compile through the one traced op, and bad input."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.errors import ShardError
from quantrt.moe import Activation, CanonicalExperts, QuantExperts, Router, experts_reference, route
from quantrt.schemes import catalog, parse_scheme

SCHEMES = [s.name for s in catalog()]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def sizes(scheme: str) -> tuple[int, int]:
    """(H, I) the scheme's blocks allow, neither a power of two where that is possible."""
    s = parse_scheme(scheme)
    if s.weight == "gguf":
        return (256, 256) if s.gguf_type.endswith("_k") else (96, 160)  # type: ignore[union-attr]
    if s.family == "bnb4":  # a fused gate/up cut must fall on a nested (double-quant) block of rows
        return 128, 256
    if s.granularity == "block":
        return 384, 128 * 3
    G = s.group_size or 1
    step = max(G, 32 if s.family in ("nvfp4", "mxfp4") else 16, 64 if s.family == "bnb4" else 1)
    return (2 * step, 3 * step) if step >= 64 else (3 * step, 5 * step)


def experts(scheme: str, E: int, H: int, Inter: int, seed: int) -> tuple[CanonicalExperts, CanonicalExperts]:
    g = torch.Generator().manual_seed(seed)
    calib_h, calib_i = torch.randn(16, H, generator=g), torch.randn(16, Inter, generator=g)
    s = parse_scheme(scheme)
    needs = s.act is not None and (not s.act_dynamic or s.act == "nvfp4")
    calib = (calib_h, calib_i) if needs else (None, None)
    up = [
        reference.quantize(
            torch.randn(2 * Inter, H, generator=g) * 0.05, s, output_sizes=(Inter, Inter), calib=calib[0]
        )
        for _ in range(E)
    ]
    down = [
        reference.quantize(torch.randn(H, Inter, generator=g) * 0.05, s, calib=calib[1]) for _ in range(E)
    ]
    return CanonicalExperts.stack(up), CanonicalExperts.stack(down)


def bound(scheme: str, act: torch.dtype, layer: QuantExperts) -> float:
    s = parse_scheme(scheme)
    quantizes = any(sel.kernel.quantizes_activations for sel in layer.selections.values())
    if act == torch.bfloat16:
        return 3e-2
    if s.act is not None or quantizes:  # activations quantized by the kernel: a flipped code moves a step
        return 5e-2 if s.act == "nvfp4" else 3e-2
    return 1e-4


CASES = [(1, 2, 5), (7, 1, 3), (5, 4, 6), (12, 8, 9), (1, 3, 3)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_against_the_oracle(scheme: str) -> None:
    i = SCHEMES.index(scheme)
    M, k, E = CASES[i % len(CASES)]
    H, Inter = sizes(scheme)
    w13, w2 = experts(scheme, E, H, Inter, seed=i)
    act = torch.float32 if i % 3 else torch.bfloat16
    layer = QuantExperts.from_canonical(w13, w2, act_dtype=act)
    g = torch.Generator().manual_seed(100 + i)
    x = torch.randn(M, H * 2, generator=g)[:, ::2].to(act)  # non-contiguous rows
    weights, ids = route(torch.randn(M, E, generator=g), Router(k))
    y = layer(x, ids, weights)
    want = experts_reference(x, ids, weights, w13, w2, out_dtype=torch.float32)
    assert y.shape == (M, H) and y.dtype == act
    assert rel(y, want) < bound(scheme, act, layer), (scheme, layer.kernel_names, rel(y, want))


def test_no_tokens_and_unheld_experts() -> None:
    E, H, Inter = 5, 64, 96
    w13, w2 = experts("w4a16-int-g32-sym", E, H, Inter, seed=1)
    layer = QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32)
    x = torch.randn(0, H)
    assert layer(x, torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, 2)).shape == (0, H)
    # expert parallelism: this rank holds experts 2..3 of 5; tokens routed only elsewhere give zero
    ep = QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32, ep_rank=1, ep_size=2)
    assert list(ep.local) == [3, 4] and ep.expert_map.tolist() == [-1, -1, -1, 0, 1]
    ids = torch.tensor([[0, 1], [3, 4], [2, 3]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.1, 0.9]])
    x = torch.randn(3, H)
    y = ep(x, ids, w)
    assert torch.equal(y[0], torch.zeros(H))
    want = experts_reference(x, ids, w, w13, w2, expert_map=ep.expert_map)
    assert rel(y, want) < 1e-5


@pytest.mark.parametrize("ep_size", [2, 3])
def test_expert_parallel_ranks_sum_to_the_layer(ep_size: int) -> None:
    E, H, Inter, M, k = 5, 64, 96, 9, 2
    w13, w2 = experts("gguf-q8_0", E, H, Inter, seed=ep_size)
    g = torch.Generator().manual_seed(ep_size)
    x = torch.randn(M, H, generator=g)
    weights, ids = route(torch.randn(M, E, generator=g), Router(k))
    whole = QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32)(x, ids, weights)
    parts = [
        QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32, ep_rank=r, ep_size=ep_size)
        for r in range(ep_size)
    ]
    assert sorted(e for p in parts for e in p.local) == list(range(E))
    total = sum(p(x, ids, weights) for p in parts)
    assert rel(total, whole) < 1e-5


@pytest.mark.parametrize("scheme", ["w4a16-int-g32-asym", "w8a8-int-ch-sym", "gguf-q4_0", "w4a16-mxfp4"])
def test_tensor_parallel_ranks_sum_to_the_layer(scheme: str) -> None:
    E, M, k = 3, 6, 2
    H, Inter = 128, 256 if scheme != "gguf-q4_0" else 128
    w13, w2 = experts(scheme, E, H, Inter, seed=7)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(M, H, generator=g)
    weights, ids = route(torch.randn(M, E, generator=g), Router(k))
    want = experts_reference(x, ids, weights, w13, w2)
    parts = [
        QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32, tp_rank=r, tp_size=2) for r in range(2)
    ]
    assert parts[0]._down.state.K == Inter // 2 and parts[0]._gate_up[0].state.N == Inter
    total = sum(p(x, ids, weights) for p in parts)
    # int8 activation quantization is per rank's part of K in the down projection
    assert rel(total, want) < (3e-2 if scheme in ("w8a8-int-ch-sym", "gguf-q4_0") else 1e-5)


def test_bias_and_gpt_oss_activation() -> None:
    E, H, Inter, M, k = 4, 64, 64, 5, 2
    w13, w2 = experts("w4a16-mxfp4", E, H, Inter, seed=9)
    g = torch.Generator().manual_seed(9)
    b13, b2 = torch.randn(E, 2 * Inter, generator=g), torch.randn(E, H, generator=g)
    act = Activation("swigluoai", alpha=1.702, limit=7.0)
    layer = QuantExperts.from_canonical(
        w13, w2, gate_up_bias=b13, down_bias=b2, activation=act, act_dtype=torch.float32
    )
    x = torch.randn(M, H, generator=g) * 4
    weights, ids = route(torch.randn(M, E, generator=g), Router(k, softmax_after_topk=True))
    want = experts_reference(x, ids, weights, w13, w2, act, b13, b2)
    assert rel(layer(x, ids, weights), want) < 1e-5
    # the activation itself against gpt-oss's own code (transformers' GptOssExperts._apply_gate),
    # its gate/up columns interleaved as gpt-oss stores them
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssConfig, GptOssExperts

    ex = GptOssExperts(GptOssConfig(hidden_size=H, intermediate_size=Inter, num_local_experts=E))
    h = torch.randn(7, 2 * Inter, generator=g) * 5
    inter = torch.stack([h[:, :Inter], h[:, Inter:]], dim=-1).reshape(7, 2 * Inter)
    assert torch.allclose(act(h), ex._apply_gate(inter), rtol=1e-6, atol=1e-6)
    assert transformers  # imported for its model code


def test_split_gate_and_up_schemes() -> None:
    """GGUF may store gate and up in different types: two grouped projections, outputs joined."""
    E, H, Inter, M = 3, 256, 256, 4
    g = torch.Generator().manual_seed(10)
    gate = CanonicalExperts.stack(
        [reference.quantize(torch.randn(Inter, H, generator=g) * 0.05, "gguf-q4_k") for _ in range(E)]
    )
    up = CanonicalExperts.stack(
        [reference.quantize(torch.randn(Inter, H, generator=g) * 0.05, "gguf-q6_k") for _ in range(E)]
    )
    down = CanonicalExperts.stack(
        [reference.quantize(torch.randn(H, Inter, generator=g) * 0.05, "gguf-q6_k") for _ in range(E)]
    )
    layer = QuantExperts.from_canonical([gate, up], down, act_dtype=torch.float32)
    assert set(layer.kernel_names) == {"gate", "up", "down"}
    x = torch.randn(M, H, generator=g)
    weights, ids = route(torch.randn(M, E, generator=g), Router(2))
    assert rel(layer(x, ids, weights), experts_reference(x, ids, weights, [gate, up], down)) < 3e-2


def test_compiles_whole_graph() -> None:
    E, H, Inter = 4, 64, 64
    w13, w2 = experts("w8a16-int-ch-sym", E, H, Inter, seed=11)
    layer = QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32)
    router = Router(2)

    def block(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        w, ids = route(logits, router)
        return layer(x, ids, w) * 2

    x, logits = torch.randn(5, H), torch.randn(5, E)
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, logits), block(x, logits))


def test_bad_input_says_why() -> None:
    E, H, Inter = 3, 64, 64
    w13, w2 = experts("w4a16-int-g32-sym", E, H, Inter, seed=12)
    layer = QuantExperts(E, H, Inter, "w4a16-int-g32-sym", act_dtype=torch.float32)
    with pytest.raises(ShardError, match="tensor 'qweight' was never loaded"):
        layer.process_weights_after_loading()
    with pytest.raises(ShardError, match=r"expert 3 is outside \[0, 3\)"):
        layer.load("down", 3, "qweight", w2["qweight"][0])
    with pytest.raises(ShardError, match="unknown projection 'w9'"):
        layer.load("w9", 0, "qweight", w2["qweight"][0])
    with pytest.raises(ShardError, match="expected shape"):
        layer.load("down", 0, "qweight", w13["qweight"][0])
    with pytest.raises(ShardError, match="does not divide by 3 ranks"):
        QuantExperts(E, H, Inter, "w4a16-int-g32-sym", tp_size=3, tp_rank=0)
    with pytest.raises(ShardError, match="cannot spread over 4 ranks"):
        QuantExperts(E, H, Inter, "w4a16-int-g32-sym", ep_size=4, ep_rank=0)
    ready = QuantExperts.from_canonical(w13, w2, act_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"expected activations \[2, 64\]"):
        ready.run(torch.randn(2, 65), torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 2))
