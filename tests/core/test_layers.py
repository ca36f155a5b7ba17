"""QuantLinear: tensor-parallel ranks and fused slices give the one-layer result, for every
catalog scheme; loading errors name the tensor and the expected vs found value."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.errors import ShardError
from quantrt.layers import QuantLinear, load_slices
from quantrt.schemes import Scheme, catalog, parse_scheme

CATALOG = catalog()


def unit(s: Scheme) -> int:
    """The K extent a tensor-parallel cut must respect for this scheme."""
    if s.granularity == "group":
        return s.group_size  # type: ignore[return-value]
    if s.granularity == "block":
        return s.block[1]  # type: ignore[index]
    return 32


def shapes(s: Scheme) -> tuple[int, int]:
    K = max(2 * unit(s), 128) * 2
    N = 256 if s.granularity == "block" else 64
    if s.double_quant:  # each rank's absmax must fill whole nested blocks of 256
        N = 2 * 256 * s.group_size // K  # type: ignore[operator]
    return K, N


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def dense(g: torch.Generator, N: int, K: int) -> torch.Tensor:
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (2,), generator=g)] *= 6.0
    return w


def load_full(layer: QuantLinear, w: reference.CanonicalWeight, bias: torch.Tensor | None) -> QuantLinear:
    for name, t in w.tensors.items():
        layer.load(name, t)
    if bias is not None:
        layer.load("bias", bias)
    return layer.process_weights_after_loading()


def splittable_rows(s: Scheme) -> bool:
    return s.family != "bnb4"


@pytest.mark.parametrize("parallel", ["column", "row"])
@pytest.mark.parametrize("scheme", CATALOG, ids=str)
def test_two_ranks_equal_one(scheme: Scheme, parallel: str) -> None:
    g = torch.Generator().manual_seed(hash((scheme.name, parallel)) % 2**31)
    K, N = shapes(scheme)
    w = dense(g, N, K)
    calib = torch.randn(32, K, generator=g)
    canon = reference.quantize(w, scheme, calib=calib)
    bias = torch.randn(N, generator=g)
    x = torch.randn(5, K, generator=g)
    one = QuantLinear.from_canonical(canon, bias=bias, act_dtype=torch.float32)
    y_one = one(x)
    # kernels that quantize activations to 8-bit blocks (GGUF, llama.cpp's way) declare it
    assert rel(y_one, reference.linear(x, canon, bias)) < (
        1e-2 if one._kernel.quantizes_activations else 1e-5
    )

    if parallel == "row" and not splittable_rows(scheme):
        with pytest.raises(ShardError, match="flattened weight"):
            QuantLinear(K, N, scheme, parallel="row", tp_rank=0, tp_size=2, act_dtype=torch.float32)
        return
    ranks = [
        load_full(
            QuantLinear(
                K, N, scheme, bias=True, parallel=parallel, tp_rank=r, tp_size=2, act_dtype=torch.float32
            ),
            canon,
            bias,
        )
        for r in range(2)
    ]
    if parallel == "column":
        assert [r.N_part for r in ranks] == [N // 2, N // 2]
        y = torch.cat([r(x) for r in ranks], dim=-1)
        assert rel(y, y_one) < 1e-5
        return
    half = K // 2
    parts = [r(x[:, i * half : (i + 1) * half]) for i, r in enumerate(ranks)]
    y = parts[0] + parts[1]
    if scheme.act is not None and scheme.act_dynamic and scheme.act_granularity != "token_group":
        # each rank quantizes its own activations (as engines do): check against that reference,
        # and against the one-rank output within the activation quantization's error
        per_rank = [
            reference.linear(
                x[:, i * half : (i + 1) * half], _rank_weight(r, canon, i, half), bias if i == 0 else None
            )
            for i, r in enumerate(ranks)
        ]
        assert rel(y, per_rank[0] + per_rank[1]) < 1e-5
        assert rel(y, y_one) < 0.05
    else:
        assert rel(y, y_one) < 1e-5


def _rank_weight(layer: QuantLinear, canon: reference.CanonicalWeight, i: int, half: int):
    """This rank's canonical weight, cut from the full one by the TensorSpecs (as the layer did)."""
    tensors = {
        name: spec.shard(canon[name], "row", i, 2, canon.K, canon.N)
        for name, spec in layer.tensor_specs.items()
    }
    return reference.CanonicalWeight(canon.scheme, canon.N, half, tensors)


def test_act_order_row_parallel_replicates_scales_and_shards_g_idx() -> None:
    g = torch.Generator().manual_seed(7)
    s = parse_scheme("w4a16-int-g128-asym-actorder")
    K, N = 512, 64
    canon = reference.quantize(dense(g, N, K), s)
    assert not torch.equal(canon["g_idx"].long(), torch.arange(K) // 128)  # really permuted
    rank = QuantLinear(K, N, s, parallel="row", tp_rank=1, tp_size=2, act_dtype=torch.float32)
    assert tuple(rank.scales.shape) == (N, K // 128)  # replicated: group ids are global
    assert tuple(rank.g_idx.shape) == (K // 2,)
    assert tuple(rank.qweight.shape) == (N, K // 4)


@pytest.mark.parametrize("scheme", CATALOG, ids=str)
def test_fused_qkv_equals_three_layers(scheme: Scheme) -> None:
    g = torch.Generator().manual_seed(hash(scheme.name) % 2**31)
    K = 1024 if scheme.family == "gguf" else 256
    u = 128 if scheme.granularity == "block" else 64
    sizes = (2 * u, u, u)
    calib = torch.randn(32, K, generator=g)
    # slices of one fused layer see the same activations, so GPTQ gives them the same act order
    g_idx = (torch.randperm(K, generator=g) // scheme.group_size).int() if scheme.act_order else None
    parts = [reference.quantize(dense(g, n, K), scheme, calib=calib, g_idx=g_idx) for n in sizes]
    biases = [torch.randn(n, generator=g) for n in sizes]
    x = torch.randn(3, K, generator=g)
    separate = torch.cat(
        [QuantLinear.from_canonical(p, bias=b, act_dtype=torch.float32)(x) for p, b in zip(parts, biases)],
        dim=-1,
    )
    fused = QuantLinear(
        K,
        sum(sizes),
        scheme,
        bias=True,
        output_sizes=sizes,
        shard_names=("q", "k", "v"),
        act_dtype=torch.float32,
    )
    for name, p, b in zip("qkv", parts, biases):
        fused.load_canonical(p, name, bias=b)
    fused.process_weights_after_loading()
    assert rel(fused(x), separate) < 1e-5


def test_fused_column_parallel_int4() -> None:
    g = torch.Generator().manual_seed(3)
    s = parse_scheme("w4a16-int-g64-asym")
    K, sizes = 256, (128, 64, 64)
    parts = [reference.quantize(dense(g, n, K), s) for n in sizes]
    x = torch.randn(4, K, generator=g)
    full = torch.cat([reference.linear(x, p) for p in parts], dim=-1)
    outs = []
    for r in range(2):
        layer = QuantLinear(
            K,
            sum(sizes),
            s,
            output_sizes=sizes,
            parallel="column",
            tp_rank=r,
            tp_size=2,
            act_dtype=torch.float32,
        )
        outs.append(load_slices(layer, dict(enumerate(parts)))(x))
    # rank r holds q[r], k[r], v[r]: reassemble slice by slice
    halves = [torch.split(o, [n // 2 for n in sizes], dim=-1) for o in outs]
    y = torch.cat([torch.cat([halves[0][i], halves[1][i]], dim=-1) for i in range(3)], dim=-1)
    assert rel(y, full) < 1e-5


def test_forward_shapes_and_layouts() -> None:
    g = torch.Generator().manual_seed(11)
    s = parse_scheme("w8a16-int-ch-sym")
    canon = reference.quantize(dense(g, 48, 96), s)
    layer = QuantLinear.from_canonical(canon, act_dtype=torch.float32)
    x3 = torch.randn(2, 3, 96, generator=g)
    assert layer(x3).shape == (2, 3, 48)
    assert layer(torch.randn(0, 96)).shape == (0, 48)
    wide = torch.randn(5, 192, generator=g)
    xs = wide[:, ::2]  # non-contiguous
    assert not xs.is_contiguous()
    assert rel(layer(xs), reference.linear(xs, canon)) < 1e-5
    out = torch.full((5, 48), float("nan"))
    layer(xs, out=out)
    assert rel(out, reference.linear(xs, canon)) < 1e-5


def test_row_parallel_bias_only_on_rank_zero() -> None:
    g = torch.Generator().manual_seed(5)
    s = parse_scheme("w8a16-int-ch-sym")
    canon = reference.quantize(dense(g, 32, 64), s)
    bias = torch.randn(32, generator=g) + 5
    zeros = torch.zeros(3, 32)
    outs = []
    for r in range(2):
        layer = load_full(
            QuantLinear(64, 32, s, bias=True, parallel="row", tp_rank=r, tp_size=2, act_dtype=torch.float32),
            canon,
            bias,
        )
        outs.append(layer(torch.zeros(3, 32)))
    assert torch.allclose(outs[0], zeros + bias) and torch.equal(outs[1], zeros)


def test_loading_errors_name_tensor_and_values() -> None:
    g = torch.Generator().manual_seed(2)
    s = parse_scheme("w4a16-int-g128-asym")
    canon = reference.quantize(dense(g, 64, 256), s)
    layer = QuantLinear(256, 64, s, act_dtype=torch.float32, prefix="model.layers.0.mlp.up_proj")
    with pytest.raises(ShardError, match=r"scales: expected shape \[64, 2\], found \[64, 3\]"):
        layer.load("scales", torch.ones(64, 3))
    with pytest.raises(ShardError, match="unexpected tensor 'weight_scale'"):
        layer.load("weight_scale", torch.ones(1))
    with pytest.raises(ShardError, match="qweight: expected dtype uint8, found int32"):
        layer.load("qweight", canon["qweight"].to(torch.int32))
    layer.load("qweight", canon["qweight"])
    layer.load("scales", canon["scales"])
    with pytest.raises(ShardError, match=r"model.layers.0.mlp.up_proj: tensor 'zeros' was never loaded"):
        layer.process_weights_after_loading()
    fused = QuantLinear(
        256,
        192,
        s,
        output_sizes=(128, 32, 32),
        shard_names=("q", "k", "v"),
        act_dtype=torch.float32,
        prefix="attn.qkv_proj",
    )
    part = reference.quantize(dense(g, 128, 256), s)
    fused.load_canonical(part, "q")
    with pytest.raises(ShardError, match="missing slice\\(s\\) k, v"):
        fused.process_weights_after_loading()
    with pytest.raises(ShardError, match="unknown shard 'o'"):
        fused.load("qweight", part["qweight"], "o")


def test_impossible_splits_say_why() -> None:
    s = parse_scheme("w4a16-int-g128-sym")
    with pytest.raises(ShardError, match="not a multiple of 128"):
        QuantLinear(
            384, 64, s, parallel="row", tp_rank=0, tp_size=2
        )  # 192 per rank: a group straddles the cut
    with pytest.raises(ShardError, match="do not divide by 2 ranks"):
        QuantLinear(256, 63, s, parallel="column", tp_rank=0, tp_size=2)
    with pytest.raises(ShardError, match="flattened weight"):
        QuantLinear(256, 64, parse_scheme("w4a16-nf4-g64"), parallel="row", tp_rank=0, tp_size=2)
    with pytest.raises(ShardError, match=r"nested_absmax: .* inside a packed element, group or block"):
        QuantLinear(256, 64, parse_scheme("w4a16-nf4-g64-dq"), parallel="column", tp_rank=0, tp_size=2)
