"""The fused activation quantizers against quantrt's references, code for code and scale for scale:
per token (int8 and every fp8 flavour), per token group, static and dynamic per tensor, on ragged
shapes, non-contiguous x, all-zero rows, saturation and exact rounding ties. On the CPU they run
under TRITON_INTERPRET=1; on a GPU the fp8 tests also run the portable encoding beside the
hardware cast, and the launches are replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from quantrt import torchops
from quantrt.backends.triton import act_quant as aq
from quantrt.reference.activations import _per_group, _safe_scale
from quantrt.reference.fp8 import to_fp8

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8S = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
X_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
KINDS = [("int8", None), *(("fp8", d) for d in FP8S)]
SHAPES = [(M, K) for M in (0, 1, 3, 17) for K in (1, 7, 100, 129, 1000)]
LAYOUTS = ("contig", "slice", "transposed", "strided")


@pytest.fixture(params=["auto", "portable"] if DEV == "cuda" else ["auto"], autouse=True)
def fp8_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """On a GPU, run every test with the hardware fp8 cast (where used) and with the integer encoding."""
    if request.param == "portable":
        monkeypatch.setattr(aq, "_use_hw_fp8_cast", lambda x, dtype: False)
    return request.param


def make_x(M: int, K: int, dtype: torch.dtype, seed: int, layout: str = "contig") -> torch.Tensor:
    """Rows of very different magnitudes, two outlier channels, an all-zero row; laid out as asked."""
    g = torch.Generator().manual_seed(seed)
    mag = 10.0 ** (torch.rand(M, 1, generator=g) * 4 - 2)
    x = torch.randn(M, K, generator=g) * mag
    if K > 2:
        x[:, torch.randint(0, K, (2,), generator=g)] *= 20
    if M >= 3:
        x[1] = 0
    x = x.to(dtype)
    if layout == "slice":
        big = torch.zeros(M, K + 5, dtype=dtype)
        big[:, 2 : 2 + K] = x
        out = big.to(DEV)[:, 2 : 2 + K]
    elif layout == "transposed":
        out = x.t().contiguous().to(DEV).t()
    elif layout == "strided":
        big = torch.zeros(M, 2 * K, dtype=dtype)
        big[:, ::2] = x
        out = big.to(DEV)[:, ::2]
    else:
        out = x.to(DEV)
    assert torch.equal(out.cpu(), x)
    return out


def ref_codes(x: torch.Tensor, kind: str, fp8: torch.dtype | None, s: torch.Tensor) -> torch.Tensor:
    if kind == "int8":
        return torchops.quantize_int8_static(x, s)
    if fp8 in torchops.FP8_MAX:
        return torchops.quantize_fp8(x, fp8, s)
    return to_fp8(x.float() / s, fp8)  # e5m2fnuz: same formula, torchops has no entry for it


def ref_per_token(
    x: torch.Tensor, kind: str, fp8: torch.dtype | None, qmax: float | None = None, mult: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.cpu()
    if kind == "int8" and qmax is None and mult == 1.0:
        return torchops.quantize_int8_per_token(x)
    qm = qmax if qmax is not None else (127.0 if kind == "int8" else torchops.SCHEME_FP8_MAX)
    s = torchops.dynamic_scale(x.abs().amax(dim=1, keepdim=True), qm) * mult
    return ref_codes(x, kind, fp8, s), s


def assert_codes(q: torch.Tensor, ref: torch.Tensor, what: object) -> None:
    assert q.dtype == ref.dtype and q.shape == ref.shape and q.is_contiguous(), what
    a, b = q.cpu().view(torch.uint8), ref.view(torch.uint8)
    bad = a != b
    assert not bad.any(), (what, int(bad.sum()), a[bad][:8].tolist(), b[bad][:8].tolist())


def assert_scales(s: torch.Tensor, ref: torch.Tensor, what: object) -> None:
    assert s.dtype == torch.float32 and s.shape == ref.shape, (what, s.shape, ref.shape)
    assert torch.equal(s.cpu(), ref), (what, s.cpu().flatten()[:4], ref.flatten()[:4])


@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("kind,fp8", KINDS, ids=lambda v: str(v).replace("torch.", ""))
def test_per_token_matches_torchops(kind: str, fp8: torch.dtype | None, dtype: torch.dtype) -> None:
    kw = {} if fp8 is None else {"fp8_dtype": fp8}
    for i, (M, K) in enumerate(SHAPES):
        layout = LAYOUTS[i % len(LAYOUTS)]
        x = make_x(M, K, dtype, seed=i, layout=layout)
        q, s = aq.quantize_per_token(x, kind, **kw)
        rq, rs = ref_per_token(x, kind, fp8)
        assert_scales(s, rs, (M, K, layout))
        assert_codes(q, rq, (M, K, layout))


@pytest.mark.parametrize("kind,fp8", KINDS, ids=lambda v: str(v).replace("torch.", ""))
def test_per_token_qmax_scale_mult_and_saturation(kind: str, fp8: torch.dtype | None) -> None:
    """A qmax above the code range saturates the row extremes; scale_mult as torchops uses it for
    e4m3fnuz (scale doubled, clamp at the flavour's own 240)."""
    kw = {} if fp8 is None else {"fp8_dtype": fp8}
    qmax = 160.0 if kind == "int8" else 600.0
    x = make_x(17, 129, torch.float16, seed=5, layout="slice")
    for qm, mult in ((qmax, 1.0), (None, 2.0), (qmax, 0.5)):
        q, s = aq.quantize_per_token(x, kind, qmax=qm, scale_mult=mult, **kw)
        rq, rs = ref_per_token(x, kind, fp8, qm, mult)
        assert_scales(s, rs, (qm, mult))
        assert_codes(q, rq, (qm, mult))
        if qm is not None and (kind == "int8" or fp8 == torch.float8_e4m3fn):
            c = q.cpu().float()
            lo, hi = (-128.0, 127.0) if kind == "int8" else (-448.0, 448.0)
            assert c.min() == lo and c.max() == hi  # both clamps were hit, not only approached


@pytest.mark.parametrize(
    "kind,fp8", [("int8", None), ("fp8", torch.float8_e4m3fn), ("fp8", torch.float8_e5m2)]
)
def test_per_token_two_pass_loop(kind: str, fp8: torch.dtype | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows longer than one block: amax over a loop on K, then a second loop quantizes."""
    kw = {} if fp8 is None else {"fp8_dtype": fp8}
    x = make_x(3, 20000, torch.bfloat16, seed=6)
    q, s = aq.quantize_per_token(x, kind, **kw)
    rq, rs = ref_per_token(x, kind, fp8)
    assert_scales(s, rs, "K=20000")
    assert_codes(q, rq, "K=20000")
    monkeypatch.setattr(aq, "_SINGLE_PASS_MAX", 64)
    monkeypatch.setattr(aq, "_LOOP_BLOCK", 32)
    for i, (M, K) in enumerate([(1, 65), (3, 100), (17, 129), (2, 1000)]):
        x = make_x(M, K, torch.float16, seed=10 + i, layout=LAYOUTS[i])
        q, s = aq.quantize_per_token(x, kind, **kw)
        rq, rs = ref_per_token(x, kind, fp8)
        assert_scales(s, rs, (M, K))
        assert_codes(q, rq, (M, K))


def test_int8_ties_round_half_to_even() -> None:
    """x / s exactly k + 0.5: a power-of-two scale (row amax 127 * 2^-3) makes the division exact."""
    k = torch.arange(-127, 127, dtype=torch.float32)  # |k + 0.5| < 127: the amax is the last value
    ties = (k + 0.5) * 0.125
    row = torch.cat([ties, torch.tensor([127 * 0.125])])
    for dtype in X_DTYPES:
        x = torch.stack([row, -row, row.flip(0)]).to(dtype)
        assert torch.equal(x.float(), torch.stack([row, -row, row.flip(0)]))  # exact in every dtype
        q, s = aq.quantize_per_token(x.to(DEV), "int8")
        assert torch.equal(s.cpu(), torch.full((3, 1), 0.125))
        rq, _ = torchops.quantize_int8_per_token(x)
        assert_codes(q, rq, dtype)
        expect = torch.where(k.remainder(2) == 0, k, k + 1)  # k + 0.5 rounds to the even neighbour
        assert torch.equal(q[0, :-1].cpu().float(), expect)
    # static scale: ties, and ties beyond the range (clamped)
    s = torch.tensor(0.25)
    x = ((torch.arange(-200, 200, dtype=torch.float32) + 0.5) * 0.25).reshape(8, 50)
    q = aq.quantize_static(x.to(DEV), s.to(DEV), "int8")
    assert_codes(q, torchops.quantize_int8_static(x, s), "static ties")


def fp8_grid_probe(dtype: torch.dtype) -> torch.Tensor:
    """Every finite fp8 value, the midpoints between neighbours (ties) and the fp32 values just
    beside them, both signs, and values past the range."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    v = v[torch.isfinite(v) & (v >= 0)].unique().sort().values
    mid = (v[1:] + v[:-1]) / 2
    near = torch.cat([torch.nextafter(mid, torch.tensor(0.0)), torch.nextafter(mid, torch.tensor(1e30))])
    fmax = float(v[-1])
    beyond = torch.tensor([fmax * 1.03, fmax * 1.1, fmax * 4, 1e30, float("inf")])
    pos = torch.cat([v, mid, near, beyond, v[1:4] / 4])
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("fp8", FP8S, ids=str)
def test_fp8_ties_subnormals_and_saturation(fp8: torch.dtype) -> None:
    """Static scale 1: every rounding case of the cast against torch's round-to-nearest-even."""
    x = fp8_grid_probe(fp8)
    n = x.numel() + (-x.numel()) % 64
    x = torch.nn.functional.pad(x, (0, n - x.numel())).reshape(-1, 64)
    one = torch.ones(1, 1)
    q = aq.quantize_static(x.to(DEV), one.to(DEV), "fp8", fp8_dtype=fp8)
    assert_codes(q, ref_codes(x, "fp8", fp8, one), fp8)


@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("kind,fp8", KINDS, ids=lambda v: str(v).replace("torch.", ""))
def test_static_matches_torchops(kind: str, fp8: torch.dtype | None, dtype: torch.dtype) -> None:
    kw = {} if fp8 is None else {"fp8_dtype": fp8}
    shapes = [(0, 7), (1, 1), (3, 129), (17, 100), (5, 1000)]
    for i, (M, K) in enumerate(shapes):
        x = make_x(M, K, dtype, seed=20 + i, layout=LAYOUTS[i % len(LAYOUTS)])
        xc = x.cpu()
        amax = float(xc.float().abs().amax()) if x.numel() else 1.0
        qm = 127.0 if kind == "int8" else 448.0
        # a calibrated scale, and one 8x too small so the large values saturate
        for scale, shape in ((amax / qm, ()), (amax / qm / 8, (1,)), (0.37, (1, 1))):
            st = torch.tensor(scale, dtype=torch.float32).reshape(shape)
            q = aq.quantize_static(x, st.to(DEV), kind, **kw)
            assert_codes(q, ref_codes(xc, kind, fp8, st), (M, K, scale))


@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("kind,fp8", KINDS, ids=lambda v: str(v).replace("torch.", ""))
def test_per_tensor_dynamic(
    kind: str, fp8: torch.dtype | None, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = {} if fp8 is None else {"fp8_dtype": fp8}
    for i, (M, K) in enumerate([(1, 7), (3, 1000), (17, 129), (40, 3000)]):
        if i == 3:  # few programs: each reduces several row tiles before its atomic
            monkeypatch.setattr(aq, "_AMAX_PROGRAMS", 2)
        x = make_x(M, K, dtype, seed=30 + i, layout=LAYOUTS[i])
        mult = 2.0 if fp8 == torch.float8_e4m3fnuz else 1.0
        q, s = aq.quantize_per_tensor(x, kind, scale_mult=mult, **kw)
        xc = x.cpu()
        qm = 127.0 if kind == "int8" else torchops.SCHEME_FP8_MAX
        rs = torchops.dynamic_scale(xc.abs().amax(), qm) * mult
        assert_scales(s, rs, (M, K))
        assert_codes(q, ref_codes(xc, kind, fp8, rs), (M, K))
    # M = 0 and all zeros: the scale of zeros (1 * scale_mult), zero codes
    q, s = aq.quantize_per_tensor(torch.empty(0, 64, dtype=dtype, device=DEV), kind, **kw)
    assert q.shape == (0, 64) and s.shape == () and float(s) == 1.0
    q, s = aq.quantize_per_tensor(torch.zeros(3, 64, dtype=dtype, device=DEV), kind, scale_mult=0.5, **kw)
    assert float(s) == 0.5 and not q.cpu().view(torch.uint8).any()


def ref_group(x: torch.Tensor, group: int, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.activations' per-group arithmetic, returning codes and scales."""
    M, K = x.shape
    ng = -(-K // group)
    padded = torch.nn.functional.pad(x.float(), (0, ng * group - K)).view(M, ng, group)
    s = _safe_scale(padded.abs().amax(dim=2, keepdim=True), 448.0)
    return to_fp8(padded / s, fp8).view(M, ng * group)[:, :K], s.view(M, ng)


@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("group", [128, 64, 48])
def test_per_token_group_matches_reference(group: int, dtype: torch.dtype) -> None:
    shapes = [(3, 129), (1, 7), (0, 100), (17, 300), (2, 1000), (1, 4 * group)]
    for i, (M, K) in enumerate(shapes):
        x = make_x(M, K, dtype, seed=40 + i, layout=LAYOUTS[i % len(LAYOUTS)])
        xc = x.cpu()
        fp8 = FP8S[i % len(FP8S)]
        q, s = aq.quantize_per_token_group(x, group, fp8_dtype=fp8)
        rq, rs = ref_group(xc, group, fp8)
        assert s.shape == (M, -(-K // group))
        assert_scales(s, rs, (M, K, fp8))
        assert_codes(q, rq, (M, K, fp8))
        if fp8 == torch.float8_e4m3fn and M:  # the reference's own fake-quantized activations
            deq = q.cpu().float() * s.cpu().repeat_interleave(group, dim=1)[:, :K]
            assert torch.equal(deq, _per_group(xc.float(), group, "fp8_e4m3"))


def test_per_token_group_saturates_with_small_qmax() -> None:
    x = make_x(3, 300, torch.float32, seed=50, layout="transposed")
    q, s = aq.quantize_per_token_group(x, 128, qmax=200.0)
    xc = x.cpu()
    ng = 3
    padded = torch.nn.functional.pad(xc, (0, ng * 128 - 300)).view(3, ng, 128)
    rs = _safe_scale(padded.abs().amax(dim=2, keepdim=True), 200.0)
    assert_scales(s, rs.view(3, ng), "qmax 200")
    rq = to_fp8(padded / rs, torch.float8_e4m3fn).view(3, -1)[:, :300]
    assert_codes(q, rq, "qmax 200")  # qmax 200 < 448: no saturation, but the scale differs
    q, s = aq.quantize_per_token_group(x, 128, qmax=1000.0)
    assert q.cpu().float().abs().amax() == 448.0


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # numpy, NaN to int
def test_nan_rows_do_not_crash_or_spill() -> None:
    x = make_x(4, 129, torch.float16, seed=60)
    x[2, 5] = float("nan")
    for kind in ("int8", "fp8"):
        q, s = aq.quantize_per_token(x, kind)
        rq, rs = ref_per_token(x, kind, torch.float8_e4m3fn)
        keep = torch.tensor([0, 1, 3])
        assert_codes(q[keep].contiguous(), rq[keep], kind)
        assert_scales(s[keep], rs[keep], kind)
    q, s = aq.quantize_per_token_group(x, 64)
    assert q.shape == (4, 129) and s.shape == (4, 3)


def test_fp8_format_table_matches_torch() -> None:
    for dtype, f in aq.FP8_FORMATS.items():
        info = torch.finfo(dtype)
        v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
        step = float(v[v > 1].min()) - 1  # 2^-mant (finfo's eps is off for e5m2fnuz)
        assert (f.fmax, 2.0**f.emin, 2.0**-f.mant) == (info.max, info.smallest_normal, step)
        nan = torch.tensor([float("nan")]).to(dtype).view(torch.uint8).item()
        assert f.nan == nan and f.neg_zero == (
            torch.tensor([-0.0]).to(dtype).view(torch.uint8).item() == 0x80
        )


def test_validation() -> None:
    x = torch.randn(2, 8, device=DEV)
    with pytest.raises(ValueError, match="kind"):
        aq.quantize_per_token(x, "int4")
    with pytest.raises(ValueError, match="fp8_dtype"):
        aq.quantize_per_token(x, "fp8", fp8_dtype=torch.int8)
    with pytest.raises(ValueError, match="2-D"):
        aq.quantize_per_token(x[None], "int8")
    with pytest.raises(ValueError, match="float16"):
        aq.quantize_per_token(x.double(), "int8")
    with pytest.raises(ValueError, match="one float element"):
        aq.quantize_static(x, torch.ones(2, device=DEV), "fp8")
    with pytest.raises(ValueError, match="group"):
        aq.quantize_per_token_group(x, 0)
    if DEV == "cuda":
        with pytest.raises(ValueError, match="scale is on"):
            aq.quantize_static(x, torch.ones(1), "fp8")


def test_empty_shapes() -> None:
    for M, K in ((0, 64), (0, 0), (3, 0)):
        x = torch.empty(M, K, dtype=torch.bfloat16, device=DEV)
        q, s = aq.quantize_per_token(x, "fp8", scale_mult=2.0)
        assert q.shape == (M, K) and q.dtype == torch.float8_e4m3fn and s.shape == (M, 1)
        assert torch.equal(s.cpu(), torch.full((M, 1), 2.0))
        q, s = aq.quantize_per_token(x, "int8")
        assert q.shape == (M, K) and q.dtype == torch.int8 and s.shape == (M, 1)
        q, s = aq.quantize_per_token_group(x, 128)
        assert q.shape == (M, K) and s.shape == (M, -(-K // 128))
        assert aq.quantize_static(x, torch.ones((), device=DEV), "int8").shape == (M, K)


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need a CUDA device")
def test_cuda_graph_capture_and_replay() -> None:
    """No launch syncs with the host: all four modes capture into one graph and replay on new x."""
    x = torch.empty(9, 1000, dtype=torch.bfloat16, device=DEV)
    static = torch.tensor([0.01], device=DEV)
    x.copy_(make_x(9, 1000, torch.bfloat16, seed=70))

    def body() -> tuple[torch.Tensor, ...]:
        a = aq.quantize_per_token(x, "fp8")
        b = aq.quantize_per_token(x, "int8")
        c = aq.quantize_per_token_group(x, 128)
        d = aq.quantize_per_tensor(x, "fp8")
        e = aq.quantize_static(x, static, "int8")
        return (*a, *b, *c, *d, e)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        body()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = body()
    for seed in (71, 72):
        x.copy_(make_x(9, 1000, torch.bfloat16, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        xc = x.cpu()
        rq, rs = ref_per_token(xc, "fp8", torch.float8_e4m3fn)
        assert_codes(outs[0], rq, seed)
        assert_scales(outs[1], rs, seed)
        rq, rs = ref_per_token(xc, "int8", None)
        assert_codes(outs[2], rq, seed)
        assert_scales(outs[3], rs, seed)
        rq, rs = ref_group(xc, 128, torch.float8_e4m3fn)
        assert_codes(outs[4], rq, seed)
        assert_scales(outs[5], rs, seed)
        rs = torchops.dynamic_scale(xc.abs().amax(), 448.0)
        assert_scales(outs[7], rs, seed)
        assert_codes(outs[6], torchops.quantize_fp8(xc, torch.float8_e4m3fn, rs), seed)
        assert_codes(outs[8], torchops.quantize_int8_static(xc, static.cpu()), seed)
