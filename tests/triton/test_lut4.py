"""The Triton 4-bit code-book kernels (backends/triton/lut4.py: NVFP4, MXFP4, NF4, bnb FP4) against
fp64 math written here: e2m1 from its value list, e4m3 through torch's float8 conversion, e8m0 as
2.0 ** (E - 127), code books by indexing. Weights come from quantrt's reference quantizer (converted
to the kernels' prepared layout, checked against reference.dequantize) or are built adversarially:
all 16 codes in every row, -0, the largest e4m3 scale, e4m3 subnormal scales, e8m0 E = 0 and 254.

Both paths (block_m = 1 GEMV, tl.dot tiles) run on awkward shapes: K not a multiple of block_k,
block_k below and above the group size, ragged N and M, non-contiguous x, bias, out=, split-K.
On the CPU they run under TRITON_INTERPRET=1 with fp16 and fp32 activations (the interpreter's
bf16 dot is wrong); on a GPU bf16 runs too. Inputs are fresh random numbers each run."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from quantrt import reference
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.lut4 import lut4_dequant, lut4_matmul
from quantrt.canonical import unpack_bnb4
from quantrt.reference.bnb import code_table
from quantrt.reference.fp4 import pack_fp4

DEV = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BF16 = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(INTERPRET, reason="Triton's interpreter computes bf16 dots wrongly"),
)
ACT = [torch.float16, torch.float32, BF16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # by output (= activation) dtype
#: e2m1 magnitudes of codes 0..7 (OCP MX v1.0); bit 3 is the sign, so code 8 is -0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_F64 = torch.tensor([m * s for s in (1.0, -1.0) for m in E2M1_MAGNITUDES], dtype=torch.float64)
SCHEMES = {
    "nvfp4": "w4a16-nvfp4",
    "mxfp4": "w4a16-mxfp4",
    "nf4": "w4a16-nf4-g64",
    "fp4_bnb": "w4a16-bnbfp4-g64",
}


@dataclass
class Prepared:
    """The kernels' inputs (on CPU; .to() moves them)."""

    codes: torch.Tensor
    scales: torch.Tensor
    group: int
    kind: str
    table: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None

    def args(self) -> tuple:
        table, row_scale = (t if t is None else t.to(DEV) for t in (self.table, self.row_scale))
        return (self.codes.to(DEV), self.scales.to(DEV), self.group, self.kind, table, row_scale)

    def weight64(self) -> torch.Tensor:
        """W [N, K] in fp64, from the definitions (not from the kernel's decode)."""
        c = torch.stack([self.codes & 0xF, self.codes >> 4], dim=-1).flatten(1).long()  # low nibble = even k
        v = (E2M1_F64 if self.table is None else self.table.double())[c]
        if self.kind == "e4m3":
            s = self.scales.view(torch.float8_e4m3fn).double()
        elif self.kind == "e8m0":
            s = 2.0 ** (self.scales.double() - 127)
        else:
            s = self.scales.double()
        w = v * s.repeat_interleave(self.group, dim=1)
        return w if self.row_scale is None else w * self.row_scale.double()[:, None]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double().cpu(), ref.double().cpu()
    return float((y - ref).norm() / ref.norm())


def col_err(y: torch.Tensor, x: torch.Tensor, w64: torch.Tensor) -> float:
    """max |y - ref| / (|x| @ |W|.T): error on the scale of fp32 accumulation, element by element, so
    a sum that cancels does not look inaccurate while a wrong code or scale (an O(1) change) shows."""
    x64 = x.double().cpu()
    return float(((y.double().cpu() - x64 @ w64.T).abs() / (x64.abs() @ w64.abs().T)).max())


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def quantized(fmt: str, N: int, K: int, g: torch.Generator) -> Prepared:
    """Reference-quantized random weights (outlier columns, two NVFP4 slices), in the prepared layout."""
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (3,), generator=g)] *= 8
    sizes = (N // 3, N - N // 3)
    canon = reference.quantize(w, SCHEMES[fmt], output_sizes=sizes)
    if fmt in ("nvfp4", "mxfp4"):
        nv = fmt == "nvfp4"
        p = Prepared(
            canon["qweight"],
            canon["scales"].view(torch.uint8),
            16 if nv else 32,
            "e4m3" if nv else "e8m0",
            row_scale=canon["global_scale"][canon.slice_index()].contiguous() if nv else None,
        )
    else:
        G = canon.scheme.group_size
        codes = unpack_bnb4(canon["qweight"], N * K).view(N, K)  # bnb packs the high nibble first, flat
        p = Prepared(pack_fp4(codes), canon["absmax"].view(N, K // G), G, "f32", table=canon["code"])
    assert torch.allclose(p.weight64(), reference.dequantize(canon).double(), rtol=1e-6, atol=0)
    return p


def all_codes(N: int, K: int, g: torch.Generator) -> torch.Tensor:
    """Packed codes where every row holds all 16 codes, in a random order per row and repeat."""
    idx = torch.stack([torch.randperm(16, generator=g) for _ in range(N * K // 16)]).view(N, K)
    return pack_fp4(idx.to(torch.uint8))


def adversarial(fmt: str, N: int, K: int, g: torch.Generator) -> Prepared:
    codes = all_codes(N, K, g)
    if fmt == "nvfp4":  # e4m3 scales: 448 (0x7E), subnormals (0x01..0x07), random normals; row scales
        ng = K // 16
        s = torch.randint(0x08, 0x7E, (N, ng), generator=g, dtype=torch.uint8)
        s[0::3] = 0x7E
        s[1::3, 0::2] = torch.randint(1, 8, s[1::3, 0::2].shape, generator=g, dtype=torch.uint8)
        s[2, :] = torch.arange(1, 8, dtype=torch.uint8).repeat(ng)[:ng]  # a row of subnormal scales only
        r = (torch.rand(N, generator=g) + 0.5) * 2.0 ** torch.randint(
            -10, -1, (N,), generator=g
        )  # fp16 y fits
        return Prepared(codes, s, 16, "e4m3", row_scale=r)
    G = 64 if fmt != "nf4" else 32
    s = (torch.rand(N, K // G, generator=g) + 0.1) * 2.0 ** torch.randint(-20, 10, (N, K // G), generator=g)
    return Prepared(codes, s, G, "f32", table=code_table(fmt))


# -- the identities behind the decode ------------------------------------------------------------


def test_bit_identities() -> None:
    """e2m1 via fp16 bits (-0 included), e4m3 via fp16 bits, e8m0 via fp32 bits, against fp64."""
    c = torch.arange(16, dtype=torch.int32)
    e2m1 = (((c & 8) << 12) | ((c & 7) << 9)).to(torch.int16).view(torch.float16).double() * 2.0**14
    assert torch.equal(e2m1, E2M1_F64) and torch.equal(e2m1.signbit(), c >= 8)
    b = torch.arange(256, dtype=torch.int32)
    ok = (b & 0x7F) != 0x7F
    e4m3 = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(torch.int16).view(torch.float16).double() * 256
    assert torch.equal(e4m3[ok], b.to(torch.uint8).view(torch.float8_e4m3fn).double()[ok])
    e = torch.arange(255, dtype=torch.int32)
    e8m0 = ((e << 23) | ((e == 0).int() << 22)).view(torch.float32).double()
    assert torch.equal(e8m0, 2.0 ** (e.double() - 127))


# -- lut4_dequant: exact ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 6 * 2^127 is inf in fp32
@pytest.mark.parametrize("kind", ["e4m3", "e8m0", "nf4", "fp4_bnb"])
def test_dequant_every_code_and_scale_exact(kind: str) -> None:
    """Every code with every scale of the kind, over a row range: bit-exact in fp32 (-0 kept); with a
    row scale, (value * scale) * row_scale rounds once."""
    g = gen()
    if kind == "e4m3":
        scales = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)  # ±0 .. ±448
        group = 16
    elif kind == "e8m0":
        scales = torch.arange(255, dtype=torch.uint8)
        group = 32
    else:
        scales = torch.randn(64, generator=g) * 2.0 ** torch.randint(-30, 30, (64,), generator=g)
        scales[:2] = torch.tensor([0.0, 3.0e38])
        group = 16
    scales = torch.cat([scales, scales[: scales.numel() % 2]])  # an even count: two per row
    ns = scales.numel()
    N, K = ns // 2, 2 * group * 16  # each row: two scales, each group all 16 codes twice
    codes = all_codes(N, K, g)
    s = scales[torch.randperm(ns, generator=g)].view(N, 2).repeat_interleave(16, dim=1)
    table = code_table(kind) if kind in ("nf4", "fp4_bnb") else None
    p = Prepared(codes, s.contiguous(), group, "f32" if table is not None else kind, table=table)
    n0, n1 = 3, N - 2
    want = p.weight64()[n0:n1].float()
    got = lut4_dequant(*p.args(), torch.float32, n0, n1).cpu()
    assert got.shape == (n1 - n0, K) and got.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
    if kind == "e4m3":  # NVFP4: values * scales are exact, so one rounding by the row scale
        p.row_scale = (torch.rand(N, generator=g) + 0.5) * (2.0 ** torch.randint(-4, 4, (N,), generator=g))
        out = torch.full((n1 - n0, K), float("nan"), device=DEV)
        got = lut4_dequant(*p.args(), torch.float32, n0, n1, out=out)
        assert got is out
        assert torch.equal(out.cpu(), p.weight64()[n0:n1].float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("fmt", list(SCHEMES))
def test_dequant_quantized_rows(fmt: str, dtype: torch.dtype) -> None:
    """Reference-quantized weights, a row range that cuts tiles, K below one dequant block."""
    N, K = 45, 192
    p = quantized(fmt, N, K, gen())
    want = p.weight64()[5:42]
    got = lut4_dequant(*p.args(), dtype, 5, 42)
    assert got.dtype == dtype and got.shape == (37, K)
    if dtype == torch.float32:  # one rounding: by the row scale (NVFP4) or the code book product (bnb)
        assert torch.equal(got.cpu(), want.float())
    else:
        assert rel(got, want) < TOL[dtype]
    assert lut4_dequant(*p.args(), dtype, 7, 7).shape == (0, K)


# -- lut4_matmul ---------------------------------------------------------------------------------

#: (M, config, x layout, bias, out=): K = 320 is 2.5 tiles of 128, 10 of 32, 20 of 16; N = 45 is ragged
CASES = [
    (1, TileConfig(1, 8, 128), "dense", True, False),  # GEMV, block_k > group, ragged last tile
    (1, TileConfig(1, 16, 16, 3), "strided", False, True),  # GEMV, block_k <= group, split-K
    (3, TileConfig(1, 4, 64, 2), "slice", True, False),  # GEMV over 3 rows
    (17, TileConfig(16, 32, 128), "slice", True, True),  # tiles, ragged K and M
    (3, TileConfig(16, 16, 32, 3), "dense", False, False),  # tiles, block_k <= group, split-K
    (17, TileConfig(32, 16, 64, 2), "kmajor", True, False),
]


def make_x(
    M: int, K: int, act: torch.dtype, layout: str, g: torch.Generator, scale: float = 1.0
) -> torch.Tensor:
    x = (torch.randn(M, 2 * K, generator=g) * scale).to(DEV, act)  # cast first: .to() would make it dense
    x = {
        "dense": x[:, :K].contiguous(),
        "strided": x[:, ::2],  # stride_xk = 2
        "slice": x[:, 3 : K + 3],  # a column slice of a wider tensor
        "kmajor": x.T.contiguous().T[:, 1::2],  # stride_xm = 1
    }[layout]
    assert layout == "dense" or not x.is_contiguous()
    return x


@pytest.mark.parametrize("act", ACT, ids=str)
@pytest.mark.parametrize("fmt", list(SCHEMES))
def test_matmul_quantized_weights(fmt: str, act: torch.dtype) -> None:
    g = gen()
    N, K = 45, 320
    p = quantized(fmt, N, K, g)
    w64 = p.weight64()
    b = torch.randn(N, generator=g)
    for M, cfg, layout, has_bias, has_out in CASES:
        x = make_x(M, K, act, layout, g)
        bias = b.to(DEV, act) if has_bias else None
        out = torch.full((M, N), float("nan"), dtype=act, device=DEV) if has_out else None
        y = lut4_matmul(x, *p.args(), bias=bias, config=cfg, out=out)
        assert y.shape == (M, N) and y.dtype == act
        assert out is None or y is out
        ref = x.double().cpu() @ w64.T + (b.to(act).double() if has_bias else 0)
        e = rel(y, ref)
        assert e < TOL[act], (M, cfg, e)


@pytest.mark.parametrize("act", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "nf4", "fp4_bnb"])
def test_adversarial_codes_and_scales(fmt: str, act: torch.dtype) -> None:
    """All 16 codes in every row; e4m3 448 and subnormal scales with row scales; code-book scales from
    2^-20 to 2^10 (fp32). fp32 is checked element by element, so tiny-scale rows of W must be right on
    their own."""
    g = gen()
    N, K = 45, 256
    p = adversarial(fmt, N, K, g)
    if act == torch.float16 and p.kind == "f32":
        p.scales = p.scales.clamp(2.0**-6, 2.0**6)  # value * scale must fit fp16 for the tiles
    w64 = p.weight64()
    for M, cfg in ((1, TileConfig(1, 16, 64)), (1, TileConfig(1, 8, 16, 2)), (6, TileConfig(16, 16, 64, 2))):
        x = make_x(M, K, act, "dense", g)
        y = lut4_matmul(x, *p.args(), config=cfg)
        assert torch.isfinite(y).all()
        if act == torch.float32:
            assert col_err(y, x, w64) < 1e-5, (cfg, col_err(y, x, w64))
        else:
            assert rel(y, x.double().cpu() @ w64.T) < TOL[act], cfg


@pytest.mark.parametrize("extreme", [0, 254])
def test_e8m0_extreme_exponents(extreme: int) -> None:
    """MXFP4 scales 2^-127 (an fp32 subnormal) and 2^127 in fp32: whole rows at the extreme, rows that
    mix it with ordinary exponents, ordinary rows; x scaled so every result is a finite normal.

    The GEMV sums value * x before scaling, so it takes every code even where value * 2^127 overflows
    fp32; the tiles decode W in fp32, so there the 2^127 groups hold only codes whose W is finite
    (|value| <= 1.5, as the fp32 reference's own dequantized weight would need)."""
    g = gen()
    N, K = 40, 256
    s = torch.randint(118, 137, (N, K // 32), generator=g, dtype=torch.uint8)
    s[0::3] = extreme
    s[1::3, 1::2] = extreme
    gemv = Prepared(all_codes(N, K, g), s, 32, "e8m0")
    huge = (s == 254).repeat_interleave(16, dim=1)  # the code bytes of the 2^127 groups
    tiles = Prepared(
        torch.where(huge, gemv.codes & 0xBB, gemv.codes), s, 32, "e8m0"
    )  # clear bit 2: |v| <= 1.5
    x_scale = 2.0**10 if extreme == 0 else 2.0**-16
    for M, cfg in ((1, TileConfig(1, 8, 128)), (1, TileConfig(1, 16, 16, 3)), (5, TileConfig(16, 16, 64))):
        p = gemv if cfg.block_m == 1 else tiles
        x = make_x(M, K, torch.float32, "dense", g, x_scale)
        y = lut4_matmul(x, *p.args(), config=cfg)
        assert torch.isfinite(y).all()
        assert col_err(y, x, p.weight64()) < 1e-5, (cfg, col_err(y, x, p.weight64()))


def test_m_zero_and_out() -> None:
    g = gen()
    N, K = 33, 128
    p = quantized("nvfp4", N, K, g)
    for cfg in (TileConfig(1, 8, 64), TileConfig(16, 32, 64)):
        y = lut4_matmul(torch.empty(0, K, device=DEV), *p.args(), config=cfg)
        assert y.shape == (0, N) and y.dtype == torch.float32
        empty = torch.empty(0, N, dtype=torch.float16, device=DEV)
        assert (
            lut4_matmul(torch.empty(0, K, dtype=torch.float16, device=DEV), *p.args(), config=cfg, out=empty)
            is empty
        )
    x = torch.randn(3, K, generator=g).half().to(DEV)
    b = torch.randn(N, generator=g).half().to(DEV)
    ref = x.double().cpu() @ p.weight64().T + b.double().cpu()
    wide = torch.full((3, 2 * N), float("nan"), dtype=torch.float16, device=DEV)  # a strided out
    lut4_matmul(x, *p.args(), bias=b, config=TileConfig(16, 32, 64, 2), out=wide[:, ::2])
    assert rel(wide[:, ::2], ref) < 2e-3 and wide[:, 1::2].isnan().all()
    y = lut4_matmul(x[:1], *p.args(), bias=b)  # the default tile (GEMV for one row)
    assert rel(y, ref[:1]) < 2e-3


def test_traced_op_matches_and_fakes() -> None:
    """torch.compile traces the NVIDIA kernel through the prepared layer's op (quantrt::linear): the
    launcher's result, the fake's shape and dtype, a fullgraph trace without a graph break."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from quantrt.backends.cuda.triton_kernels import CudaTritonBnb4
    from quantrt.specs import LayerSpec

    g = gen()
    N, K = 40, 128
    canon = reference.quantize(torch.randn(N, K, generator=g) * 0.05, "w4a16-nf4-g64").to(DEV)
    k = CudaTritonBnb4()
    state = k.prepare(canon, LayerSpec(canon.scheme, K, N, act_dtype=torch.float16))
    lay = state.layout
    x = torch.randn(2, K, generator=g).half().to(DEV)
    bias = torch.randn(N, generator=g).half().to(DEV)
    y = torch.ops.quantrt.linear(x, bias, state.id)
    cfg = TileConfig(16, 16, 64, 2, 4, 1)
    want = lut4_matmul(x, lay.codes, lay.scales, lay.group, lay.scale_kind, lay.table, None, bias, cfg)
    assert y.shape == (2, N) and rel(y, want) < 1e-3 and torch.equal(y, k.apply(state, x, bias))
    with FakeTensorMode() as mode:
        fy = torch.ops.quantrt.linear(mode.from_tensor(x), None, state.id)
        assert fy.shape == (2, N) and fy.dtype == x.dtype
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: state(t, bias), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), y)


def test_rejects_bad_inputs() -> None:
    N, K = 32, 128
    x = torch.randn(2, K, device=DEV)
    good = {
        "x": x,
        "codes": torch.zeros(N, K // 2, dtype=torch.uint8, device=DEV),
        "scales": torch.zeros(N, K // 16, dtype=torch.uint8, device=DEV),
        "group": 16,
        "scale_kind": "e4m3",
        "table": None,
        "row_scale": None,
        "bias": None,
        "config": TileConfig(16, 32, 64),
    }

    def call(**kw):
        return lut4_matmul(**{**good, **kw})

    bad = [
        ({"x": x.to(torch.int8)}, r"x must be a 2-D float16/bfloat16/float32 \[M, K\] tensor, found int8"),
        ({"scale_kind": "ue8m0"}, r"scale_kind must be one of e4m3, e8m0, f32, found 'ue8m0'"),
        ({"group": 48}, r"group must be a power of two >= 2, found 48"),
        ({"group": 256}, r"the group size 256 must divide K=128"),
        ({"codes": good["codes"].view(torch.int8)}, r"codes must be a 2-D uint8 \[N, K/2\].*found int8"),
        ({"codes": good["codes"][:, :32]}, r"codes must be uint8 \[N, 64\].*found \[32, 32\]"),
        ({"scales": good["scales"].float()}, r"e4m3 scales must be uint8 \[32, 8\].*found float32"),
        ({"scale_kind": "f32"}, r"f32 scales must be float32 \[32, 8\].*found uint8"),
        ({"scales": good["scales"][:, :4]}, r"scales must be uint8 \[32, 8\].*found uint8 \[32, 4\]"),
        (
            {"table": torch.zeros(8, device=DEV)},
            r"table must be a contiguous float32 \[16\].*found float32 \[8\]",
        ),
        (
            {"row_scale": torch.ones(N, 1, device=DEV)},
            r"row_scale must be .*float32 \[32\].*found float32 \[32, 1\]",
        ),
        (
            {"config": TileConfig(1, 3, 64)},
            r"GEMV \(block_m=1\) block_n must be a power of two >= 1, found 3",
        ),
        ({"config": TileConfig(1, 8, 1)}, r"GEMV \(block_m=1\) block_k must be a power of two >= 2, found 1"),
        ({"config": TileConfig(16, 32, 16)}, r"block_k must be a power of two >= 32, found 16"),
        ({"config": TileConfig(16, 32, 64, 0)}, r"split_k must be a positive integer, found 0"),
        ({"bias": torch.ones(31, device=DEV)}, r"bias must be .*\[32\].*found float32 \[31\]"),
        ({"out": torch.empty(2, N, dtype=torch.float16, device=DEV)}, r"out must be float32 \[2, 32\]"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            call(**kw)
    dq = (good["codes"], good["scales"], 16, "e4m3", None, None)
    with pytest.raises(ValueError, match=r"0 <= n0 <= n1 <= N=32, found n0=4, n1=33"):
        lut4_dequant(*dq, torch.float32, 4, 33)
    with pytest.raises(ValueError, match=r"dtype must be float16, bfloat16 or float32, found torch.int32"):
        lut4_dequant(*dq, torch.int32, 0, 4)
    with pytest.raises(ValueError, match=r"out must be float16 \[4, 128\]"):
        lut4_dequant(*dq, torch.float16, 0, 4, out=torch.empty(4, K, device=DEV))
