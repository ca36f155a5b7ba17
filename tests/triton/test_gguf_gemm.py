"""The fused GGUF tensor-core GEMM (backends/triton/gguf_gemm.py) against gguf-py, llama.cpp's own
numpy dequantizers: ``gguf.quants.dequantize`` of the same raw blocks (fp32), then fp64
``x @ W.T (+ bias)``; relative Frobenius error < 1e-5 with fp32 activations (an IEEE fp32 dot), < 2e-3
with fp16 (the decoded tile is rounded to fp16 once), < 1.6e-2 with bf16.

Inputs are fresh random draws every run (the seed is in every failure message): random llama.cpp
blocks with weight-like f16 scales, adversarial bytes (codes and scales at their extremes, and every
byte random with any finite f16 scale), and rows of llama.cpp-written files. On the CPU the kernel
runs under TRITON_INTERPRET=1, whose ``tl.dot`` on bf16 operands is wrong, so bf16 runs on a GPU
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

from quantrt.backends.triton.gguf_gemm import (
    GEMM_TYPES,
    GemmConfig,
    default_gemm_config,
    gemm_candidates,
    gguf_gemm,
)
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import GGUF_TYPES

TYPES = tuple(GEMM_TYPES)
MUST = ("q8_0", "q6_k", "q4_k")
SKIP_BF16 = pytest.mark.skipif(INTERPRET, reason="Triton's interpreter computes tl.dot on bf16 wrongly")
ACT = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=SKIP_BF16)]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# -- inputs and references ------------------------------------------------------------------------------


def reference(x: torch.Tensor, q: torch.Tensor, gtype: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    ref = x.double().cpu() @ dense(q, gtype).double().T
    return ref if bias is None else ref + bias.double().cpu()


def check_gemm(x, q, gtype, K, config, *, bias=None, out=None, seed=0) -> torch.Tensor:
    """gguf_gemm against fp64 x @ dequant(W).T (+ bias), within the activation dtype's tolerance."""
    N = q.shape[0]
    y = gguf_gemm(x, planes_of(q, gtype, K), gtype, N, K, bias=bias, config=config, out=out)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype and y.device == x.device
    assert y.isfinite().all(), f"{gtype} {config}: non-finite output (seed {seed})"
    err = rel(y, reference(x, q, gtype, bias))
    assert err < TOL[x.dtype], (
        f"{gtype} M={x.shape[0]} N={N} K={K} {x.dtype} {config}: {err:.3g} (seed {seed})"
    )
    return y


def randn(*shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


# -- every type --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ACT, ids=str)
@pytest.mark.parametrize("gtype", TYPES)
def test_every_type(gtype: str, dtype: torch.dtype):
    """M = 17 in tiles of 16, N = 37 in tiles of 16, two M tiles per program group; a legacy K of 9
    blocks in steps of 64 (a masked last tile), a K-quant K of two blocks in steps of 128."""
    seed = fresh_seed()
    N, K = 37, (32 * 9 if legacy(gtype) else 512)
    q = random_blocks(gtype, N, K, seed)
    x = randn(17, K, seed=seed, dtype=dtype)
    check_gemm(x, q, gtype, K, GemmConfig(16, 16, 64 if legacy(gtype) else 128, group_m=2), seed=seed)


@pytest.mark.parametrize("gtype", TYPES)
def test_every_block_k(gtype: str):
    """Every K step the type allows (each a different tile decode: q6_k's one or two nibbles and one
    or two half blocks, q4_k's 1, 2 or 4 chunks, 1 to 8 legacy blocks), fp32 and fp16. Legacy K = 96
    leaves a masked tail for block_k 64 and only the masked tile for 128 and 256."""
    seed = fresh_seed()
    N, K = 19, (96 if legacy(gtype) else 512)
    q = random_blocks(gtype, N, K, seed)
    for bk in (32, 64, 128, 256) if legacy(gtype) else (64, 128, 256):
        for dtype in (torch.float32, torch.float16):
            check_gemm(
                randn(5, K, seed=seed + bk, dtype=dtype), q, gtype, K, GemmConfig(16, 16, bk), seed=seed
            )


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("gtype", TYPES)
def test_adversarial_bytes(gtype: str):
    """Every byte 0x00, 0xFF, 0x80, 0x55 or 0xAA (codes at both extremes, q6_k's int8 scales at -1
    and -128, the 6-bit packed scales and mins at 63 or 0) under weight-like f16 scales; every byte
    random with any finite f16 scale (subnormal to 65504); q6_k's scales all negative (-128
    included); every K-quant 6-bit scale and min at 63 under random codes."""
    seed = fresh_seed()
    N, K = 12, 2 * GGUF_TYPES[gtype][0]
    x = randn(5, K, seed=seed)
    cfg = GemmConfig(16, 16, 32 if legacy(gtype) else 64)
    cases = [random_blocks(gtype, N, K, seed, fill=f) for f in (0x00, 0xFF, 0x80, 0x55, 0xAA)]
    cases.append(random_blocks(gtype, N, K, seed, sane=False))
    base = random_blocks(gtype, N, K, seed)
    if gtype == "q6_k":
        neg = torch.randint(0x80, 0x100, (N, K // 256, 16), generator=torch.Generator().manual_seed(seed))
        neg[:, :, 0] = 0x80
        cases.append(set_scales(base, gtype, neg.to(torch.uint8)))
    if gtype in ("q4_k", "q5_k"):
        cases.append(set_scales(base, gtype, 0xFF))
    for i, q in enumerate(cases):
        if dense(q, gtype).abs().sum() == 0:  # all-zero weights: the output must be exactly 0
            y = gguf_gemm(x, planes_of(q, gtype, K), gtype, N, K, config=cfg)
            assert (y == 0).all(), f"{gtype} case {i} (seed {seed})"
            continue
        check_gemm(x, q, gtype, K, cfg, seed=seed)


# -- shapes, strides, epilogue ------------------------------------------------------------------------


@pytest.mark.parametrize("gtype", (*MUST, "q4_0"))
def test_shapes_and_strides(gtype: str):
    """M = 1 (one row in a tile of 16), 5, 17 and 40 (three M tiles, groups of 2: an uneven last group;
    groups of 1 and of 8); N = 37 in tiles of 16 and 32 and 64 (> N); non-contiguous x: every other
    column, a column slice of a wider tensor, a transposed view (K stride != 1); legacy K of 3 blocks
    in steps of 64 (a masked tail), with NaN past K in x's rows."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    K = 96 if legacy(gtype) else 512
    N = 37
    q = random_blocks(gtype, N, K, seed)
    bk = 64 if legacy(gtype) else 128
    wide = torch.randn(40, 2 * K + 3, generator=g).to(DEV)
    nan_tail = torch.cat([wide[:5, :K], torch.full((5, 70), float("nan"), device=DEV)], dim=1)
    transposed = torch.randn(K, 17, generator=g).to(DEV, torch.float16).t()
    for x, cfg in (
        (wide[:1, 1 : 2 * K + 1 : 2], GemmConfig(16, 16, bk)),
        (wide.half()[:5, 3 : K + 3], GemmConfig(16, 32, bk, group_m=1)),
        (transposed, GemmConfig(32, 64, bk, num_warps=8)),
        (wide[:40, 5 : K + 5], GemmConfig(16, 16, bk, group_m=2)),
        (wide.half()[:40, 5 : K + 5], GemmConfig(16, 16, bk, group_m=8)),
        (wide[7:24, :K], None),  # the default tile for M = 17
        (nan_tail[:, :K], GemmConfig(16, 16, bk)),  # x past K is NaN: a masked tail must not read it
    ):
        assert not x.is_contiguous()
        check_gemm(x, q, gtype, K, cfg, seed=seed)


@pytest.mark.parametrize("gtype", MUST)
def test_bias_out_and_empty(gtype: str):
    """bias (fp16 or fp32); out= a slice of a poisoned larger buffer (nothing outside it is written),
    or a transposed view;
    M = 0 returns [0, N] (or ``out``) without a launch."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    K = 256
    N = 37
    q = random_blocks(gtype, N, K, seed)
    planes = planes_of(q, gtype, K)
    cfg = GemmConfig(16, 16, 64)
    for dtype, bias_dtype in ((torch.float32, torch.float16), (torch.float16, torch.float32)):
        x = torch.randn(5, K, generator=g).to(DEV, dtype)
        bias = torch.randn(N, generator=g).to(DEV, bias_dtype)
        poisoned = torch.full((5 + 16, N + 5), float("nan"), device=DEV, dtype=dtype)
        out = poisoned[:5, 2 : N + 2]
        y = check_gemm(x, q, gtype, K, cfg, bias=bias, out=out, seed=seed)
        assert y is out and not out.isnan().any()
        assert (
            poisoned[:, :2].isnan().all()
            and poisoned[:, N + 2 :].isnan().all()
            and poisoned[5:].isnan().all()
        )
        out_t = torch.full((N, 5), float("nan"), device=DEV, dtype=dtype).t()
        assert check_gemm(x, q, gtype, K, cfg, bias=bias, out=out_t, seed=seed) is out_t
    x0 = torch.randn(0, K, device=DEV)
    y0 = gguf_gemm(x0, planes, gtype, N, K)
    assert y0.shape == (0, N) and y0.dtype == torch.float32
    out0 = torch.empty(0, N, device=DEV)
    assert gguf_gemm(x0, planes, gtype, N, K, out=out0) is out0


# A code byte of each type, the bit flipped, and the element whose value changes:
# q8_0: qs byte 5 of block 3 is element 3 * 32 + 5 = 101 (bit 6 of an int8 code: +-64);
# q4_k: qs byte 77 is chunk c = 2, byte 13: its high nibble is element 64 * 2 + 32 + 13 = 173;
# q6_k: ql byte 40 of the first half block is a = 1, l = 8: its high nibble (nib = 1, j = 3) is
#       element 32 * 3 + 8 = 104.
FLIPS = {"q8_0": (3 * 34 + 2 + 5, 0x40, 101), "q4_k": (16 + 77, 0x80, 173), "q6_k": (40, 0x80, 104)}


@pytest.mark.parametrize("gtype", MUST)
def test_a_flipped_code_byte_is_caught(gtype: str):
    """One flipped code bit among 16 x 512 weights moves exactly the expected weight, and the GEMM
    follows it: it matches the flipped weights and is far from the original ones."""
    seed = fresh_seed()
    K = 512
    q = random_blocks(gtype, 16, K, seed)
    if gtype != "q8_0":
        q = set_scales(q, gtype, 0x21)  # no sub-block scale is 0
    byte, bit, element = FLIPS[gtype]
    q = typical_d(q, gtype, 5, element)
    flipped = q.clone()
    flipped[5, byte] ^= bit
    diff = (dense(flipped, gtype) != dense(q, gtype)).nonzero().tolist()
    assert diff == [[5, element]], f"seed {seed}"
    x = randn(3, K, seed=seed)
    x[:, element] = 50.0
    y = check_gemm(x, flipped, gtype, K, GemmConfig(16, 16, 128), seed=seed)
    assert rel(y, reference(x, q, gtype)) > 100 * TOL[torch.float32], f"seed {seed}"


# -- llama.cpp-written files ----------------------------------------------------------------------------


def test_fixtures_cover_the_must_types():
    types = set()
    for file, name in fixture_rows(GEMM_TYPES):
        t = next(t for t in gguf.GGUFReader(FIXTURES / file).tensors if t.name == name)
        types.add(t.tensor_type.name.lower())
    assert types >= set(MUST) and types == {"q4_0", "q8_0", "q4_k", "q5_k", "q6_k"}


@pytest.mark.parametrize("file", sorted({f for f, _ in fixture_rows(GEMM_TYPES)}))
def test_llama_cpp_files(file: str):
    """Ten rows (start, middle, end) of each supported tensor type llama.cpp wrote, fp32 and fp16
    activations, against gguf-py's dequantization of the whole tensor."""
    seed = fresh_seed()
    names = {n for f, n in fixture_rows(GEMM_TYPES) if f == file}
    for t in gguf.GGUFReader(FIXTURES / file).tensors:
        if t.name not in names:
            continue
        gtype = t.tensor_type.name.lower()
        K, N = int(t.shape[0]), int(np.prod([int(d) for d in t.shape[1:]]))
        q = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(N, -1))
        picks = [*range(4), *range(N // 2, N // 2 + 3), *range(N - 3, N)]
        rows = q[picks]
        want = torch.from_numpy(gguf_dequantize(t.data, t.tensor_type).reshape(N, K))[picks]
        assert torch.equal(dense(rows, gtype), want), f"{file}:{t.name}"
        for dtype in (torch.float32, torch.float16):
            x = randn(5, K, seed=seed, dtype=dtype)
            y = gguf_gemm(x, planes_of(rows, gtype, K), gtype, 10, K, config=GemmConfig(16, 16, 128))
            err = rel(y, x.double().cpu() @ want.double().T)
            assert err < TOL[dtype], f"{file}:{t.name} {gtype} {dtype}: {err:.3g} (seed {seed})"


# -- configs, torch op, validation ----------------------------------------------------------------------


def test_configs():
    """The default tile grows with M; every candidate of every type runs (q6_k, fp16) and is accepted
    for every type."""
    seed = fresh_seed()
    sizes = [default_gemm_config("q4_k", m).block_m for m in (1, 16, 17, 32, 33, 64, 65, 4096)]
    assert sizes == sorted(sizes) and sizes[0] == 16 and sizes[-1] == 128
    K, N = 256, 37
    q = random_blocks("q6_k", N, K, seed)
    x = randn(17, K, seed=seed, dtype=torch.float16)
    cands = gemm_candidates("q6_k")
    assert len(cands) >= 8 and len(set(cands)) == len(cands)
    for m, top in ((1, 32), (16, 32), (33, 64), (64, 64), (65, 128), (256, 256)):
        mine = gemm_candidates("q6_k", m)
        assert mine and max(c.block_m for c in mine) == top and set(mine) <= set(cands), (m, top)
    for cfg in cands:
        check_gemm(x, q, "q6_k", K, cfg, seed=seed)
    for gtype in TYPES:
        assert gemm_candidates(gtype) and default_gemm_config(gtype, 256)
        qq = random_blocks(gtype, 4, K, seed)
        planes = planes_of(qq, gtype, K)
        for cfg in gemm_candidates(gtype):  # validation only: M = 0 launches nothing
            assert gguf_gemm(x[:0], planes, gtype, 4, K, config=cfg).shape == (0, 4)


def test_prepared_gemm_strategy_compiles_through_the_one_op(monkeypatch):
    """A ``cuda.triton_gguf`` layer whose table routes mid batches to the fused GEMM: the strategy is
    the GEMM's, and torch.compile (fullgraph) traces the layer through ``quantrt::linear``, whose fake
    is [M, N] in the output dtype and whose result is the eager one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from quantrt.backends.cuda.triton_kernels import CudaTritonGGUF
    from quantrt.backends.triton import tile_table
    from quantrt.canonical import CanonicalWeight
    from quantrt.schemes import parse_scheme
    from quantrt.specs import LayerSpec

    real = tile_table.load
    tile = {"block_m": 16, "block_n": 16, "block_k": 128, "num_warps": 4, "num_stages": 2, "group_m": 4}

    def load(package: str, name: str, arch: str) -> dict:
        doc = real(package, name, arch)
        if name != "gguf":
            return doc
        return {**doc, "gemm": {"16": tile}, "gemm_types": {}, "gemm_max_m": {"q6_k": 64}}

    monkeypatch.setattr(tile_table, "load", load)
    seed = fresh_seed()
    q = random_blocks("q6_k", 10, 256, seed)
    canon = CanonicalWeight(parse_scheme("gguf-q6_k"), 10, 256, {"qweight": q.to(DEV)})
    layer = CudaTritonGGUF().prepare(canon, LayerSpec(canon.scheme, 256, 10, act_dtype=torch.float16))
    x = randn(17, 256, seed=seed, dtype=torch.float16)
    bias = randn(10, seed=seed + 1, dtype=torch.float16)
    assert layer.strategy(17).name == "fused gemm BM16 BN16 BK128 W4 S2"
    want = gguf_gemm(x, planes_of(q, "q6_k", 256), "q6_k", 10, 256, bias=bias, config=GemmConfig(**tile))
    assert torch.equal(layer(x, bias), want), f"seed {seed}"
    compiled = torch.compile(lambda x, b: layer(x, b) * 2, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, bias), want * 2), f"seed {seed}"
    with FakeTensorMode() as mode:
        fy = torch.ops.quantrt.linear(mode.from_tensor(x), None, layer.id)
    assert fy.shape == (17, 10) and fy.dtype == torch.float16


def test_bad_arguments_are_refused():
    q = random_blocks("q4_k", 4, 256, fresh_seed())
    planes = planes_of(q, "q4_k", 256)
    x = torch.randn(1, 256, device=DEV)

    def refused(match: str, *args, **kw):
        with pytest.raises(ValueError, match=match):
            gguf_gemm(*args, **kw)

    supported = r"'q2_k' is not supported by the fused GEMM; supported: q4_0, .*q8_0, .*q6_k"
    refused(supported, x, planes, "q2_k", 4, 256)
    refused("'q3_k' is not supported", x, planes, "Q3_K", 4, 256)
    refused("unknown GGUF type", x, planes, "iq4_xs", 4, 256)
    refused("multiple of the q4_k block size", x, planes, "q4_k", 4, 200)
    refused("multiple of the q8_0 block size", x, planes, "q8_0", 4, 250)
    refused("planes must be a dict of", x, {"qs": planes["qs"]}, "q4_k", 4, 256)
    refused(
        "plane 'qs' must be a contiguous uint8", x, {**planes, "qs": planes["qs"][:, :64]}, "q4_k", 4, 256
    )
    refused("plane 'head' must be", x, {**planes, "head": planes["head"].float()}, "q4_k", 4, 256)
    refused("x must be", x.double(), planes, "q4_k", 4, 256)
    refused("x must be", x.to(torch.int8), planes, "q4_k", 4, 256)
    refused("x must be", x[:, :128], planes, "q4_k", 4, 256)
    refused("x must be", x[0], planes, "q4_k", 4, 256)
    refused("bias must be", x, planes, "q4_k", 4, 256, bias=torch.zeros(5, device=DEV))
    refused("out must be", x, planes, "q4_k", 4, 256, out=torch.zeros(1, 5, device=DEV))
    refused("out must be", x, planes, "q4_k", 4, 256, out=torch.zeros(1, 4, device=DEV, dtype=torch.float16))
    for bad, match in (
        (GemmConfig(8, 16, 64), "block_m must be a power of two from 16 to 256"),
        (GemmConfig(16, 24, 64), "block_n"),
        (GemmConfig(16, 512, 64), "block_n"),
        (GemmConfig(16, 16, 32), "block_k must be a power of two from 64 to 256 for q4_k"),
        (GemmConfig(16, 16, 512), "block_k"),
        (GemmConfig(16, 16, 64, num_warps=3), "num_warps"),
        (GemmConfig(16, 16, 64, num_stages=0), "num_stages"),
        (GemmConfig(16, 16, 64, group_m=0), "group_m"),
        ((16, 16, 64), "config must be a GemmConfig"),
    ):
        refused(match, x, planes, "q4_k", 4, 256, config=bad)
    q8 = planes_of(random_blocks("q8_0", 4, 64, fresh_seed()), "q8_0", 64)
    refused("block_k must be a power of two from 32 to 256 for q8_0", x[:, :64], q8, "q8_0", 4, 64, config=GemmConfig(16, 16, 16))  # fmt: skip
    assert gguf_gemm(x[:, :64], q8, "Q8_0", 4, 64, config=GemmConfig(16, 16, 32)).shape == (1, 4)
    with pytest.raises(ValueError, match="not supported by the fused GEMM"):
        default_gemm_config("q2_k", 16)
    with pytest.raises(ValueError, match="not supported by the fused GEMM"):
        gemm_candidates("q3_k")


def test_committed_h200_table_is_complete_and_valid():
    """tunings/gguf_sm_90.json: every type it bounds is a GEMM type with a valid tile in every M
    bucket (the loader's fill-in included), and the bound lies above the GEMV's."""
    from quantrt.backends.triton import tile_table
    from quantrt.backends.triton.gguf_gemm import _check_gemm_config
    from quantrt.backends.triton.gguf_kernel import _gemm

    doc = tile_table.load("quantrt.backends.cuda", "gguf", "sm_90")
    assert doc["gemm_max_m"], "the H200 table enables the GEMM for some type"
    for gtype, bound in doc["gemm_max_m"].items():
        tiles, got = _gemm(doc, gtype, GemmConfig)
        assert gtype in GEMM_TYPES and got == bound > doc["gemv_max_m"]
        assert len(tiles) == len(tile_table.KEYS)
        for c in tiles:
            _check_gemm_config(c, gtype)
    assert _gemm(doc, "q2_k", GemmConfig) == ((), 0)
