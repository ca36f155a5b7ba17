"""The Triton GGUF kernels (backends/triton/gguf.py) against gguf-py, llama.cpp's own numpy
dequantizers: the planes hold exactly the native blocks' bytes, the dequantizer equals
``gguf.quants.dequantize`` bit for bit in fp32 (random bytes with random finite f16 scales from
subnormal to 65504, adversarial bytes, and llama.cpp-written files), and the fused GEMV matches
fp64 ``x @ dequant(W).T`` (relative Frobenius error < 1e-5 with fp32 activations, < 2e-3 with fp16).

Inputs are fresh random draws every run (the seed is in every failure message). On the CPU the
kernels run under TRITON_INTERPRET=1, whose fp32 -> bf16 conversion truncates, so bf16 runs on a GPU
only; shapes stay small because the interpreter is slow.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf_testing import (
    DEV,
    FIXTURES,
    INTERPRET,
    dense,
    fixture_rows,
    fresh_seed,
    legacy,
    planes_of,
    rel,
    set_scales,
    typical_d,
)

from quantrt.backends.triton.common import TileCounters
from quantrt.backends.triton.gguf import (
    PLANE_NAMES,
    PLANES,
    GGUFConfig,
    gguf_dequant,
    gguf_matmul,
    gguf_planes,
    plane_list,
)
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import GGUF_TYPES

TYPES = tuple(GGUF_TYPES)
SHAPE_TYPES = ("q4_0", "q4_k", "q6_k")  # the awkward-shape cases run on these three
SKIP_BF16 = pytest.mark.skipif(INTERPRET, reason="Triton's interpreter truncates fp32 -> bf16")
ACT = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=SKIP_BF16)]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# -- inputs and references ------------------------------------------------------------------------------


def check_matmul(x, q, gtype, K, config, *, bias=None, out=None, seed=0) -> torch.Tensor:
    """gguf_matmul against fp64 x @ dequant(W).T (+ bias), within the activation dtype's tolerance."""
    N = q.shape[0]
    y = gguf_matmul(x, planes_of(q, gtype, K), gtype, N, K, bias=bias, config=config, out=out)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype and y.device == x.device
    ref = x.double().cpu() @ dense(q, gtype).double().T
    if bias is not None:
        ref += bias.double().cpu()
    err = rel(y, ref)
    assert err < TOL[x.dtype], (
        f"{gtype} M={x.shape[0]} N={N} K={K} {x.dtype} {config}: {err:.3g} (seed {seed})"
    )
    return y


# -- planes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gtype", TYPES)
def test_planes_hold_exactly_the_block_bytes(gtype: str):
    seed = fresh_seed()
    B = GGUF_TYPES[gtype][0]
    N, K = 5, 3 * B
    q = random_blocks(gtype, N, K, seed, sane=False)
    planes = gguf_planes(q, gtype, N, K)
    assert tuple(planes) == PLANE_NAMES[gtype]
    assert sum(p.numel() * p.element_size() for p in planes.values()) == q.numel()
    parts = []
    for name, _, size, dtype in PLANES[gtype]:
        p = planes[name]
        assert p.dtype == dtype and p.is_contiguous() and p.shape[0] == N
        parts.append(p.view(torch.uint8).reshape(N, K // B, size))
    assert torch.equal(torch.cat(parts, dim=-1).reshape(N, -1), q), f"seed {seed}"
    assert [n for n, *_ in PLANES[gtype]] == list(PLANE_NAMES[gtype])
    assert list(plane_list(planes, gtype)) == [planes[n] for n in PLANE_NAMES[gtype]]


def test_plane_layouts_named_in_the_brief():
    q = random_blocks("q6_k", 3, 512, fresh_seed())
    p = gguf_planes(q, "q6_k", 3, 512)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in p.items()} == {
        "ql": (torch.uint8, (3, 256)),
        "qh": (torch.uint8, (3, 128)),
        "scales": (torch.int8, (3, 32)),
        "d": (torch.float16, (3, 2)),
    }
    p = gguf_planes(random_blocks("q8_0", 3, 256, fresh_seed()), "q8_0", 3, 256)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in p.items()} == {
        "d": (torch.float16, (3, 8)),
        "qs": (torch.int8, (3, 256)),
    }


# -- the dequantizer: bit-exact against gguf-py --------------------------------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # fp16 inf, as torch's
@pytest.mark.parametrize("gtype", TYPES)
def test_dequant_is_bit_exact(gtype: str):
    """Random bytes with any finite f16 scale: fp32 equals gguf-py bit for bit, fp16 is its rounding;
    a row range into a strided ``out``; a legacy K that is not a multiple of 256."""
    seed = fresh_seed()
    N, K = 21, (32 * 9 if legacy(gtype) else 512)
    q = random_blocks(gtype, N, K, seed, sane=False)
    want = dense(q, gtype)
    planes = planes_of(q, gtype, K)
    got = gguf_dequant(planes, gtype, N, K, torch.float32, 0, N)
    assert got.shape == (N, K) and got.dtype == torch.float32
    bad = (got.cpu() != want).sum().item()
    assert bad == 0, f"{gtype}: {bad} of {N * K} values differ from gguf-py (seed {seed})"
    wide = torch.full((N, K + 7), float("nan"), device=DEV, dtype=torch.float16)
    out = wide[3 : N - 2, 5 : K + 5]
    assert gguf_dequant(planes, gtype, N, K, torch.float16, 5, N, out=out) is out
    assert torch.equal(out.cpu(), want[5:].to(torch.float16)), f"seed {seed}"
    assert wide[:, :5].isnan().all() and wide[:, K + 5 :].isnan().all() and wide[:3].isnan().all()
    assert gguf_dequant(planes, gtype, N, K, torch.float32, 4, 4).shape == (0, K)


@pytest.mark.parametrize("gtype", TYPES)
def test_dequant_adversarial_bytes(gtype: str):
    """Every byte 0x00, 0xFF, 0x80 or alternating (codes at both extremes, q6_k's int8 scales at -1
    and -128, the 6-bit packed scales of q3_k/q4_k/q5_k at 63 or 0) under sane random f16 scales."""
    seed = fresh_seed()
    N, K = 9, 2 * GGUF_TYPES[gtype][0]
    for fill in (0x00, 0xFF, 0x80, 0x55, 0xAA):
        q = random_blocks(gtype, N, K, seed, fill=fill)
        got = gguf_dequant(planes_of(q, gtype, K), gtype, N, K, torch.float32, 0, N)
        assert torch.equal(got.cpu(), dense(q, gtype)), f"{gtype} fill {fill:#x} (seed {seed})"


def test_fixtures_are_there():
    types = set()
    for file, name in fixture_rows(GGUF_TYPES):
        t = next(t for t in gguf.GGUFReader(FIXTURES / file).tensors if t.name == name)
        types.add(t.tensor_type.name.lower())
    assert types == {"q4_0", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}


@pytest.mark.parametrize("file", sorted({f for f, _ in fixture_rows(GGUF_TYPES)}))
def test_llama_cpp_files(file: str):
    """A few rows of each quantized tensor type llama.cpp wrote: bit-exact dequantization, and the
    GEMV on them (fp32 activations)."""
    seed = fresh_seed()
    names = {n for f, n in fixture_rows(GGUF_TYPES) if f == file}
    for t in gguf.GGUFReader(FIXTURES / file).tensors:
        if t.name not in names:
            continue
        gtype = t.tensor_type.name.lower()
        K, N = int(t.shape[0]), int(np.prod([int(d) for d in t.shape[1:]]))
        q = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(N, -1))
        rows = torch.cat([q[:4], q[N // 2 : N // 2 + 3], q[-3:]])  # 10 rows from the start, middle and end
        want = torch.from_numpy(gguf_dequantize(t.data, t.tensor_type).reshape(N, K))
        want = torch.cat([want[:4], want[N // 2 : N // 2 + 3], want[-3:]])
        got = gguf_dequant(planes_of(rows, gtype, K), gtype, 10, K, torch.float32, 0, 10)
        assert torch.equal(got.cpu(), want), f"{file}:{t.name}"
        x = torch.randn(2, K, generator=torch.Generator().manual_seed(seed)).to(DEV)
        check_matmul(x, rows, gtype, K, GGUFConfig(block_m=2, block_n=4, block_k=512), seed=seed)


# -- the GEMV: every type ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ACT, ids=str)
@pytest.mark.parametrize("gtype", TYPES)
def test_matmul_every_type(gtype: str, dtype: torch.dtype):
    """M = 3 in tiles of 2 rows, N = 37 in tiles of 16, a legacy K of 9 blocks (a masked tail)."""
    seed = fresh_seed()
    N, K = 37, (32 * 9 if legacy(gtype) else 512)
    q = random_blocks(gtype, N, K, seed)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)
    check_matmul(x, q, gtype, K, GGUFConfig(block_m=2, block_n=16, block_k=256), seed=seed)


@pytest.mark.parametrize("gtype", TYPES)
def test_matmul_adversarial_bytes(gtype: str):
    """Codes at their extremes (every byte 0xFF / 0x80, so every packed scale at its maximum and
    q6_k's at -1 / -128), and the scale fields alone extreme under random codes."""
    seed = fresh_seed()
    N, K = 12, 2 * GGUF_TYPES[gtype][0]
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(seed)).to(DEV)
    cfg = GGUFConfig(block_m=2, block_n=8, block_k=256)
    cases = [random_blocks(gtype, N, K, seed, fill=f) for f in (0xFF, 0x80)]
    base = random_blocks(gtype, N, K, seed)
    if gtype == "q6_k":  # negative int8 scales only, -128 included
        neg = torch.randint(0x80, 0x100, (N, K // 256, 16), generator=torch.Generator().manual_seed(seed))
        neg[:, :, 0] = 0x80
        cases.append(set_scales(base, gtype, neg.to(torch.uint8)))
    if gtype in ("q3_k", "q4_k", "q5_k"):  # every 6-bit scale (and min) at 63
        cases.append(set_scales(base, gtype, 0xFF))
    for q in cases:
        check_matmul(x, q, gtype, K, cfg, seed=seed)


# -- the GEMV: awkward shapes, strides, epilogue -----------------------------------------------------


@pytest.mark.parametrize("gtype", SHAPE_TYPES)
def test_shapes_and_strides(gtype: str):
    """M = 1 with block_m = 4 (> M), M = 3 with block_m = 2, M = 8 in one tile; non-contiguous x (every
    other column, and column slices of a wider tensor); N = 37 in tiles of 16, 1 and 4;
    block_k larger than K (only the masked tail runs) and legacy K tails."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    K = 32 * 9 if legacy(gtype) else 768
    N = 37
    q = random_blocks(gtype, N, K, seed)
    wide = torch.randn(8, 2 * K + 3, generator=g).to(DEV)
    for x, cfg in (
        (wide[:1, 1 : 2 * K + 1 : 2], GGUFConfig(block_m=4, block_n=16, block_k=256)),
        (wide.half()[:3, 1 : K + 1], GGUFConfig(block_m=2, block_n=1, block_k=512)),
        (wide[:8, 3 : K + 3], GGUFConfig(block_m=8, block_n=4, block_k=1024, num_warps=2)),
        (wide[2:4, 5 : K + 5], None),  # the type's default: block_k 0 (auto, larger than this K)
    ):
        assert not x.is_contiguous()
        check_matmul(x, q, gtype, K, cfg, seed=seed)


@pytest.mark.parametrize("gtype", SHAPE_TYPES)
def test_bias_out_split_k_and_empty(gtype: str):
    """bias; out= (a column slice of a poisoned wider buffer); split_k > 1 (the partials reduced in
    the launch, into out's strides), more splits than K tiles; M = 0."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    K = 32 * 9 if legacy(gtype) else 768
    N = 37
    q = random_blocks(gtype, N, K, seed)
    planes = planes_of(q, gtype, K)
    for dtype, cfg in (
        (torch.float32, GGUFConfig(block_m=2, block_n=16, split_k=3, block_k=256)),
        (torch.float16, GGUFConfig(block_m=4, block_n=8, split_k=2, block_k=512)),
        (torch.float32, GGUFConfig(block_m=1, block_n=32, split_k=7, block_k=256)),
        (torch.float16, GGUFConfig(block_m=2, block_n=16, split_k=1, block_k=256)),
    ):
        x = torch.randn(3, K, generator=g).to(DEV, dtype)
        bias = torch.randn(N, generator=g).to(DEV, torch.float16)
        poisoned = torch.full((3, N + 5), float("nan"), device=DEV, dtype=dtype)
        out = poisoned[:, 2 : N + 2]
        y = check_matmul(x, q, gtype, K, cfg, bias=bias, out=out, seed=seed)
        assert y is out and not out.isnan().any()
        assert poisoned[:, :2].isnan().all() and poisoned[:, N + 2 :].isnan().all()
    x0 = torch.randn(0, K, device=DEV)
    assert gguf_matmul(x0, planes, gtype, N, K).shape == (0, N)
    out0 = torch.empty(0, N, device=DEV)
    assert gguf_matmul(x0, planes, gtype, N, K, out=out0) is out0


def test_split_k_counters_shared_across_calls_reset_and_deterministic():
    """One counter set (fewer counters than the first launch needs: it grows) through calls at
    several M and splits: each matches the reference, repeats the same bits, and leaves every
    counter at zero (a counter left set would let the wrong program finish the next call's tile)."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    K, N = 768, 45
    q = random_blocks("q4_k", N, K, seed)
    planes = planes_of(q, "q4_k", K)
    counters = TileCounters(2, torch.device(DEV))
    for M, split in ((1, 2), (3, 3), (6, 5), (1, 7)):
        x = torch.randn(M, K, generator=g).to(DEV)
        cfg = GGUFConfig(block_m=2, block_n=8, split_k=split, block_k=256)
        first = gguf_matmul(x, planes, "q4_k", N, K, config=cfg, counters=counters)
        ref = x.double().cpu() @ dense(q, "q4_k").double().T
        assert rel(first, ref) < TOL[torch.float32], (M, split, seed)
        for _ in range(2):
            assert torch.equal(gguf_matmul(x, planes, "q4_k", N, K, config=cfg, counters=counters), first)
        assert int(counters.get(0).abs().sum()) == 0, (M, split, "a counter was not reset")


def test_a_wrong_byte_is_caught():
    """The checks notice one flipped code bit among 16 x 512 q4_k weights (qs byte 77 of a row is
    run c = 2, byte 13: its high nibble is element 64 * 2 + 32 + 13 = 173)."""
    seed = fresh_seed()
    q = set_scales(random_blocks("q4_k", 16, 512, seed), "q4_k", 0x21)  # no sub-block scale is 0
    q = typical_d(q, "q4_k", 5, 173)
    planes = planes_of(q, "q4_k", 512)
    planes["qs"][5, 77] ^= 0x80
    got = gguf_dequant(planes, "q4_k", 16, 512, torch.float32, 0, 16).cpu()
    diff = (got != dense(q, "q4_k")).nonzero().tolist()
    assert diff == [[5, 173]], f"seed {seed}"
    x = torch.randn(1, 512, device=DEV)
    x[0, 173] = 50.0
    y = gguf_matmul(x, planes, "q4_k", 16, 512, config=GGUFConfig(1, 16)).cpu()
    clean = x.double().cpu() @ dense(q, "q4_k").double().T
    # the flipped weight moves only row 5, by about its own size: measured on that row (the whole
    # output's norm is set by the other rows' random super-block scales, which can dwarf row 5's)
    assert rel(y[:, 5], clean[:, 5]) > 100 * TOL[torch.float32], f"seed {seed}"
    assert rel(y, x.double().cpu() @ got.double().T) <= TOL[torch.float32], f"seed {seed}"


# -- the prepared layer, validation --------------------------------------------------------------------


def test_prepared_layer_compiles_through_the_one_op():
    """A ``cuda.triton_gguf`` layer under torch.compile (fullgraph): traced through
    ``quantrt::linear``, whose fake is [M, N] in the output dtype, with the eager result at a GEMV
    batch and at a dequant + cuBLAS one; its exact rows are gguf-py's fp32 weights."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from quantrt.backends.cuda.triton_kernels import CudaTritonGGUF
    from quantrt.canonical import CanonicalWeight
    from quantrt.schemes import parse_scheme
    from quantrt.specs import LayerSpec

    seed = fresh_seed()
    q = random_blocks("q6_k", 10, 256, seed)
    canon = CanonicalWeight(parse_scheme("gguf-q6_k"), 10, 256, {"qweight": q.to(DEV)})
    layer = CudaTritonGGUF().prepare(canon, LayerSpec(canon.scheme, 256, 10, act_dtype=torch.float16))
    bias = torch.randn(10, device=DEV, dtype=torch.float16)
    compiled = torch.compile(lambda x: layer(x, bias) * 2, backend="aot_eager", fullgraph=True)
    for m, path in ((2, "gemv"), (20, "dequant+cuBLAS")):
        x = torch.randn(m, 256, device=DEV, dtype=torch.float16)
        assert layer.strategy(m).name.startswith(path)
        want = layer(x, bias)
        assert rel(want, x.double().cpu() @ dense(q, "q6_k").double().T + bias.double().cpu()) < TOL[x.dtype]
        assert torch.equal(compiled(x), want * 2), (m, f"seed {seed}")
    with FakeTensorMode() as mode:
        fy = torch.ops.quantrt.linear(mode.from_tensor(x), None, layer.id)
    assert fy.shape == (20, 10) and fy.dtype == torch.float16
    assert torch.equal(layer.dequant_rows(3, 7).cpu(), dense(q, "q6_k")[3:7]), f"seed {seed}"


def test_bad_arguments_are_refused():
    q = random_blocks("q4_k", 4, 256, fresh_seed())
    planes = planes_of(q, "q4_k", 256)
    x = torch.randn(1, 256, device=DEV)
    cfg = GGUFConfig(1, 4)

    def refused(match: str, fn, *args, **kw):
        with pytest.raises(ValueError, match=match):
            fn(*args, **kw)

    refused("unknown GGUF type", gguf_planes, q, "q7_0", 4, 256)
    refused("multiple of the q4_k block size", gguf_planes, q, "q4_k", 4, 200)
    refused(r"uint8 \[4, 144\]", gguf_planes, q[:, :-1], "q4_k", 4, 256)
    refused("unknown GGUF type", gguf_matmul, x, planes, "iq4_xs", 4, 256)
    refused("multiple of the q4_0 block size", gguf_matmul, x, planes, "q4_0", 4, 250)
    refused("planes must be a dict of", gguf_matmul, x, {"qs": planes["qs"]}, "q4_k", 4, 256)
    refused("plane 'qs' must be a contiguous uint8", gguf_matmul, x, {**planes, "qs": planes["qs"][:, :64]}, "q4_k", 4, 256)  # fmt: skip
    refused(
        "plane 'head' must be", gguf_matmul, x, {**planes, "head": planes["head"].float()}, "q4_k", 4, 256
    )
    refused("x must be", gguf_matmul, x.double(), planes, "q4_k", 4, 256)
    refused("x must be", gguf_matmul, x[:, :128], planes, "q4_k", 4, 256)
    refused("bias must be", gguf_matmul, x, planes, "q4_k", 4, 256, bias=torch.zeros(5, device=DEV))
    refused("out must be", gguf_matmul, x, planes, "q4_k", 4, 256, out=torch.zeros(1, 5, device=DEV))
    for bad, match in (
        (GGUFConfig(3, 4), "block_m"),
        (GGUFConfig(1, 6), "block_n"),
        (GGUFConfig(1, 4, block_k=128), "block_k"),
        (GGUFConfig(1, 4, block_k=768), "block_k"),
        (GGUFConfig(1, 4, split_k=0), "split_k"),
        (GGUFConfig(1, 4, num_warps=3), "num_warps"),
        (GGUFConfig(1, 4, num_stages=0), "num_stages"),
        (GGUFConfig(8, 2048, block_k=1024), "exceeds"),
    ):
        refused(match, gguf_matmul, x, planes, "q4_k", 4, 256, config=bad)
    refused("dtype must be", gguf_dequant, planes, "q4_k", 4, 256, torch.int8, 0, 4)
    refused("n0 <= n1", gguf_dequant, planes, "q4_k", 4, 256, torch.float32, 3, 2)
    refused("n0 <= n1", gguf_dequant, planes, "q4_k", 4, 256, torch.float32, 0, 5)
    refused(
        "out must be",
        gguf_dequant,
        planes,
        "q4_k",
        4,
        256,
        torch.float32,
        0,
        4,
        torch.empty(4, 255, device=DEV),
    )
    assert gguf_matmul(x, planes, "Q4_K", 4, 256, config=cfg).shape == (1, 4)  # type names in any case
