"""The Triton FP8 W8A8 kernels (rowwise and block scales) against references that never run them:
an fp64 dequantize-then-matmul of the same codes, and quantrt's reference on canonical weights.
Awkward shapes (ragged M, N, K and scale blocks), split-K, out=, bias, fp8 edge codes (±max,
subnormals, -0.0) and bad inputs. On the CPU they run under TRITON_INTERPRET=1 (fp32, fp16 and bf16
out; the interpreter rounds bf16 by truncation, hence its looser bound); tests/gpu runs them on the H200.
"""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.fp8_mm import fp8_block_matmul, fp8_rowwise_matmul
from quantrt.torchops import dynamic_scale, per_channel_scales, quantize_fp8

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
#: the smallest subnormal of each fp8 type (2^-9 for e4m3fn, 2^-16 for e5m2). Triton 3.6's interpreter
#: widens fp8 dot operands to fp16 and loses e5m2 subnormals there (e5m2 and fp16 share the exponent
#: range, and its converter renormalises them), so on the CPU e5m2 data uses the smallest normal instead.
SUB = {E4M3: 2.0**-9, E5M2: 2.0**-16 if DEV == "cuda" else 2.0**-14}
#: output rounding per dtype: (relative, absolute) on top of fp32 accumulation error
ROUND = {
    torch.float32: (0.0, 0.0),
    torch.float16: (2.0**-11, 2.0**-24),
    torch.bfloat16: (2.0**-8 if DEV == "cuda" else 2.0**-7, 0.0),
}
ACC_TOL = 1e-5  # fp32 accumulation order, relative to sum_k |x * w|


def fp8_codes(shape: tuple[int, int], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Random fp8 codes with outliers and edge values: ±max, smallest subnormals, -0.0, min normal."""
    fmax = torch.finfo(dtype).max
    v = torch.randn(shape, generator=g) * (fmax / 32)
    flat = v.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)
    edges = (fmax, -fmax, SUB[dtype], -SUB[dtype], 3 * SUB[dtype], -0.0, torch.finfo(dtype).smallest_normal)
    for i, e in zip(idx, edges * 2, strict=False):
        flat[i] = e
    flat[idx[14:20]] *= 40  # outliers, saturated at ±max by the cast
    q = v.clamp(-fmax, fmax).to(dtype)
    assert (q.float() == fmax).any() and (q.float() == SUB[dtype]).any()
    assert torch.signbit(q.float()[q.float() == 0]).any()  # -0.0 survived
    return q


def subnormal_row(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A row of only subnormal codes (and -0.0): flushing them to zero must show up in the output."""
    k = torch.randint(1, 4, (n,), generator=g).float() * SUB[dtype]
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    row = k * sign
    row[::7] = -0.0
    return row.to(dtype)


def check(y: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, out_dtype: torch.dtype) -> None:
    """Elementwise: |y - ref| <= ACC_TOL * sum_k|x w| (+ the output dtype's rounding); and not all zero."""
    r, a = ROUND[out_dtype]
    y = y.double().cpu()
    assert torch.isfinite(y).all()
    err = (y - ref).abs()
    bound = ACC_TOL * mag + r * ref.abs() + a
    worst = int((err - bound).argmax())
    assert (err <= bound).all(), (worst, float(err.view(-1)[worst]), float(bound.view(-1)[worst]))
    assert ref.abs().max() > 0


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


CONFIGS = (
    TileConfig(16, 32, 64),
    TileConfig(16, 64, 128, split_k=3),
    TileConfig(32, 64, 64, split_k=3),
    TileConfig(16, 16, 64, num_warps=2, num_stages=2),
)


@pytest.mark.parametrize(
    "x_dtype,w_dtype,out_dtype",
    [
        (E4M3, E4M3, torch.float32),
        (E4M3, E4M3, torch.float16),
        (E4M3, E4M3, torch.bfloat16),
        (E5M2, E5M2, torch.float32),
        (E5M2, E5M2, torch.float16),
        (E4M3, E5M2, torch.float32),  # e4m3 activations with e5m2 weights
    ],
    ids=str,
)
@pytest.mark.parametrize("K,N", [(200, 77), (448, 200)])
def test_rowwise_matches_fp64_dequant(
    x_dtype: torch.dtype, w_dtype: torch.dtype, out_dtype: torch.dtype, K: int, N: int
) -> None:
    g = torch.Generator().manual_seed(K + N + sum(map(ord, f"{x_dtype}{w_dtype}{out_dtype}")))
    w = fp8_codes((N, K), w_dtype, g)
    w[1] = subnormal_row(K, w_dtype, g)
    w_scale = (torch.rand(N, generator=g) + 0.5) / torch.finfo(w_dtype).max
    w_scale[1] = 1 / (8 * SUB[w_dtype])  # brings the subnormal row to outputs of order 1
    for i, M in enumerate((1, 5, 16, 33)):
        xq = fp8_codes((M, K), x_dtype, g)
        per_token = i % 2 == 0
        if per_token:
            a_scale = (torch.rand(M, 1, generator=g) + 0.5) / torch.finfo(x_dtype).max
            if M > 1:
                xq[0] = subnormal_row(K, x_dtype, g)
                a_scale[0] = 1 / (8 * SUB[x_dtype])
        else:
            a_scale = torch.tensor(0.7 / torch.finfo(x_dtype).max)  # per tensor, 0-dim
        bias = torch.randn(N, generator=g) if i != 1 else None
        config = CONFIGS[i]
        y = fp8_rowwise_matmul(
            xq.to(DEV),
            a_scale.to(DEV),
            w.to(DEV),
            w_scale.to(DEV),
            None if bias is None else bias.to(DEV, out_dtype),
            out_dtype,
            config,
        )
        assert y.shape == (M, N) and y.dtype == out_dtype and y.device.type == DEV
        xd = xq.double() * a_scale.double().reshape(-1, 1)
        wd = w.double() * w_scale.double()[:, None]
        ref = xd @ wd.T
        mag = xd.abs() @ wd.abs().T
        if bias is not None:
            b = bias.to(out_dtype).double()
            ref, mag = ref + b, mag + b.abs()
        check(y, ref, mag, out_dtype)


def block_dequant(t: torch.Tensor, s: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    rows, cols = t.shape
    return t.double() * s.double().repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize(
    "N,K,block,configs",
    [
        (
            200,
            300,
            (128, 128),
            (
                TileConfig(16, 32, 128),
                TileConfig(16, 64, 64, split_k=3),
                TileConfig(32, 128, 128, split_k=3),
                TileConfig(16, 32, 32, num_warps=2),
            ),
        ),
        (77, 200, (64, 64), (TileConfig(16, 32, 64), TileConfig(16, 64, 32, split_k=3))),
    ],
)
def test_block_matches_fp64_dequant(
    N: int, K: int, block: tuple[int, int], configs: tuple[TileConfig, ...], out_dtype: torch.dtype
) -> None:
    bn, bk = block
    nkb = -(-K // bk)
    g = torch.Generator().manual_seed(N + K + bn)
    w = fp8_codes((N, K), E4M3, g)
    w[1] = subnormal_row(K, E4M3, g)
    # scales spanning 2^-6..2^6 between blocks: a scale applied to the wrong block is far off
    w_scale = 2.0 ** torch.randint(-6, 7, (-(-N // bn), nkb), generator=g).float() / 448
    for i, M in enumerate((1, 5, 16, 33)):
        xq = fp8_codes((M, K), E4M3, g)
        x_scale = 2.0 ** torch.randint(-6, 7, (M, nkb), generator=g).float() / 448
        x_scale *= torch.rand(M, nkb, generator=g) + 0.5
        if i % 2:  # column-major activation scales (the layout TMA-based producers write)
            x_scale = x_scale.t().contiguous().t()
        bias = torch.randn(N, generator=g) if i != 1 else None
        y = fp8_block_matmul(
            xq.to(DEV),
            x_scale.to(DEV),
            w.to(DEV),
            w_scale.to(DEV),
            block,
            None if bias is None else bias.to(DEV),
            out_dtype,
            configs[i % len(configs)],
        )
        assert y.shape == (M, N) and y.dtype == out_dtype
        xd = block_dequant(xq, x_scale, 1, bk)
        wd = block_dequant(w, w_scale, bn, bk)
        ref = xd @ wd.T
        mag = xd.abs() @ wd.abs().T
        if bias is not None:
            ref, mag = ref + bias.double(), mag + bias.double().abs()
        check(y, ref, mag, out_dtype)


def test_large_m_grouped_tile_order() -> None:
    """More M-tiles than one group of 8, ragged last group: every tile is visited exactly once."""
    g = torch.Generator().manual_seed(11)
    M, K, N = 150, 96, 40
    xq, w = fp8_codes((M, K), E4M3, g), fp8_codes((N, K), E4M3, g)
    a_scale, w_scale = torch.rand(M, 1, generator=g) / 448, torch.rand(N, generator=g) / 448
    y = fp8_rowwise_matmul(
        xq.to(DEV),
        a_scale.to(DEV),
        w.to(DEV),
        w_scale.to(DEV),
        None,
        torch.float32,
        TileConfig(16, 16, 32),
    )
    xd, wd = xq.double() * a_scale.double(), w.double() * w_scale.double()[:, None]
    check(y, xd @ wd.T, xd.abs() @ wd.abs().T, torch.float32)
    x_scale = torch.rand(M, 1, generator=g) / 448
    ws = torch.rand(1, 1, generator=g) / 448
    y = fp8_block_matmul(
        xq.to(DEV),
        x_scale.to(DEV),
        w.to(DEV),
        ws.to(DEV),
        (128, 128),
        None,
        torch.float32,
        TileConfig(32, 16, 32),
    )
    xd, wd = xq.double() * x_scale.double(), w.double() * ws.double()
    check(y, xd @ wd.T, xd.abs() @ wd.abs().T, torch.float32)


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = dynamic_scale(x.abs().amax(dim=1, keepdim=True), 448.0)
    return quantize_fp8(x, E4M3, s), s


def per_token_group_fp8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As quantrt.reference.activations: groups of ``group`` channels, a ragged last group its own scale."""
    M, K = x.shape
    ng = -(-K // group)
    padded = torch.nn.functional.pad(x, (0, ng * group - K)).view(M, ng, group)
    s = dynamic_scale(padded.abs().amax(dim=2, keepdim=True), 448.0)
    q = quantize_fp8(padded, E4M3, s).view(M, ng * group)[:, :K].contiguous()
    return q, s.view(M, ng)


@pytest.mark.parametrize(
    "scheme,N,K,sizes",
    [
        ("w8a8-fp8-ch", 77, 200, ()),
        ("w8a8-fp8-tensor", 77, 200, (48, 29)),  # a fused layer: one scale per slice
        ("w8a8-fp8-block128", 200, 300, ()),
    ],
)
def test_end_to_end_against_reference(scheme: str, N: int, K: int, sizes: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(N * K)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (3,), generator=g)] *= 8
    if sizes:
        w[sizes[0] :] *= 5  # slices with different ranges get different scales
    canon = reference.quantize(w, scheme, output_sizes=sizes)
    bias = torch.randn(N, generator=g)
    for i, M in enumerate((1, 5, 33)):
        x = torch.randn(M, K, generator=g)
        x[:, torch.randint(0, K, (2,), generator=g)] *= 20
        b = bias if i != 1 else None
        ref = reference.linear(x, canon, b, out_dtype=torch.float32)
        config = TileConfig(16, 32, 128, split_k=1 + 2 * (i % 2))
        bd = None if b is None else b.to(DEV)
        if scheme.endswith("block128"):
            xq, xs = per_token_group_fp8(x, 128)
            y = fp8_block_matmul(
                xq.to(DEV), xs.to(DEV), canon["qweight"].to(DEV), canon["scales"].to(DEV),
                (128, 128), bd, torch.float32, config,
            )  # fmt: skip
        else:
            xq, xs = per_token_fp8(x)
            ws = per_channel_scales(canon)
            assert ws.shape == (N,)
            y = fp8_rowwise_matmul(
                xq.to(DEV), xs.to(DEV), canon["qweight"].to(DEV), ws.to(DEV), bd, torch.float32, config
            )
        assert y.shape == (M, N) and y.dtype == torch.float32
        assert rel(y, ref) < 1e-5, (M, rel(y, ref))


def test_m_zero_out_and_strided_out() -> None:
    g = torch.Generator().manual_seed(5)
    K, N = 160, 48
    w = fp8_codes((N, K), E4M3, g).to(DEV)
    ws = (torch.rand(N, generator=g) / 448).to(DEV)
    wsb = (torch.rand(1, 2, generator=g) / 448).to(DEV)
    cfg = TileConfig(16, 16, 32, split_k=3)
    x0 = torch.empty(0, K, dtype=E4M3, device=DEV)
    for dt in (torch.float16, torch.float32):
        y = fp8_rowwise_matmul(x0, torch.ones(0, 1, device=DEV), w, ws, None, dt, cfg)
        assert y.shape == (0, N) and y.dtype == dt
        y = fp8_block_matmul(x0, torch.ones(0, 2, device=DEV), w, wsb, (128, 128), None, dt, cfg)
        assert y.shape == (0, N) and y.dtype == dt
        out0 = torch.empty(0, N, dtype=dt, device=DEV)
        assert fp8_rowwise_matmul(x0, torch.ones(0, 1, device=DEV), w, ws, None, dt, cfg, out=out0) is out0
    M = 3
    xq = fp8_codes((M, K), E4M3, g)
    a = torch.rand(M, 1, generator=g) / 448
    xs = torch.rand(M, 2, generator=g) / 448
    bias = torch.randn(N, generator=g)
    ref_row = (xq.double() * a.double()) @ (w.cpu().double() * ws.cpu().double()[:, None]).T + bias.double()
    ref_blk = block_dequant(xq, xs, 1, 128) @ block_dequant(w.cpu(), wsb.cpu(), 128, 128).T + bias.double()
    for dt in (torch.float16, torch.float32):
        for split in (1, 3):
            cfg = TileConfig(16, 16, 64, split_k=split)
            # NaN-filled, and a column slice of a wider buffer: strides honoured, split-K needs no zeroed output
            big = torch.full((M, N + 8), float("nan"), dtype=dt, device=DEV)
            out = big[:, 4 : 4 + N]
            bd = bias.to(DEV)
            y = fp8_rowwise_matmul(xq.to(DEV), a.to(DEV), w, ws, bd, dt, cfg, out=out)
            assert y.data_ptr() == out.data_ptr() and y.shape == (M, N)
            assert rel(out, ref_row) < (1e-3 if dt == torch.float16 else 1e-6), (dt, split)
            assert big[:, :4].isnan().all() and big[:, 4 + N :].isnan().all()
            out.fill_(float("nan"))
            y = fp8_block_matmul(xq.to(DEV), xs.to(DEV), w, wsb, (128, 128), bd, dt, cfg, out=out)
            assert y.data_ptr() == out.data_ptr()
            assert rel(out, ref_blk) < (1e-3 if dt == torch.float16 else 1e-6), (dt, split)
            assert big[:, :4].isnan().all() and big[:, 4 + N :].isnan().all()


def test_rejects_bad_inputs() -> None:
    K, N, M = 256, 64, 2
    xq = torch.zeros(M, K, dtype=E4M3, device=DEV)
    w = torch.zeros(N, K, dtype=E4M3, device=DEV)
    a = torch.ones(M, 1, device=DEV)
    ws = torch.ones(N, device=DEV)
    wsb = torch.ones(1, 2, device=DEV)
    xs = torch.ones(M, 2, device=DEV)
    cfg = TileConfig(16, 32, 64)
    f32 = torch.float32
    row, blk = fp8_rowwise_matmul, fp8_block_matmul
    C, B = TileConfig, (128, 128)
    bad_out = torch.empty(M, N, dtype=torch.float16, device=DEV)
    cases = [
        (lambda: row(xq.half(), a, w, ws, None, f32, cfg), "must be fp8.*found torch.float16"),
        (lambda: row(xq, a, w.to(torch.float8_e4m3fnuz), ws, None, f32, cfg), "both be OCP fp8 or both fnuz"),
        (lambda: row(xq, a, w[:, :128], ws, None, f32, cfg), r"K = 256.*found \[64, 128\]"),
        (lambda: row(xq, a.double(), w, ws, None, f32, cfg), "a_scale must be float32, found torch.float64"),
        (lambda: row(xq, a[:1].expand(3, 1), w, ws, None, f32, cfg), r"a_scale must have shape \[2, 1\]"),
        (lambda: row(xq, a, w, ws[:10], None, f32, cfg), r"w_scale must have shape \[64\].*found \[10\]"),
        (lambda: row(xq, a, w, ws, torch.ones(N + 1, device=DEV), f32, cfg), r"bias must be .*\[64\]"),
        (lambda: row(xq, a, w, ws, None, torch.int32, cfg), "out_dtype must be one of"),
        (lambda: row(xq, a, w, ws, None, f32, C(8, 32, 64)), "block_m must be a power of two >= 16"),
        (lambda: row(xq, a, w, ws, None, f32, C(16, 32, 16)), "block_k must be .* >= 32, found 16"),
        (lambda: row(xq, a, w, ws, None, f32, C(16, 48, 64)), "block_n must be a power of two"),
        (lambda: row(xq, a, w, ws, None, f32, C(16, 32, 64, 0)), "split_k"),
        (lambda: row(xq, a, w, ws, None, f32, cfg, bad_out), r"out must be torch.float32 \[2, 64\].*float16"),
        (lambda: blk(xq, xs, w, wsb, B, None, f32, C(16, 32, 256)), "block_k=256 must divide"),
        (lambda: blk(xq, xs, w, wsb, (64, 128), None, f32, C(16, 128, 64)), "block_n=128 must divide"),
        (lambda: blk(xq, xs, w, wsb.expand(2, 2), B, None, f32, cfg), r"w_scale must have shape \[1, 2\]"),
        (lambda: blk(xq, xs[:, :1], w, wsb, B, None, f32, cfg), r"x_scale must have shape \[2, 2\]"),
        (lambda: blk(xq, xs, w, wsb.half(), B, None, f32, cfg), "w_scale must be float32"),
    ]  # fmt: skip
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_in_cuda_graph() -> None:
    """No host synchronisation: both launchers (with split-K's buffer and cast) replay from a graph."""
    g = torch.Generator().manual_seed(9)
    M, K, N = 4, 256, 128
    xq = fp8_codes((M, K), E4M3, g).cuda()
    w = fp8_codes((N, K), E4M3, g).cuda()
    a = (torch.rand(M, 1, generator=g) / 448).cuda()
    ws = (torch.rand(N, generator=g) / 448).cuda()
    xs = (torch.rand(M, 2, generator=g) / 448).cuda()
    wsb = (torch.rand(1, 2, generator=g) / 448).cuda()
    cfg = TileConfig(16, 64, 128, split_k=2)
    for _ in range(2):  # compile outside the capture
        fp8_rowwise_matmul(xq, a, w, ws, None, torch.bfloat16, cfg)
        fp8_block_matmul(xq, xs, w, wsb, (128, 128), None, torch.bfloat16, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1 = fp8_rowwise_matmul(xq, a, w, ws, None, torch.bfloat16, cfg)
        y2 = fp8_block_matmul(xq, xs, w, wsb, (128, 128), None, torch.bfloat16, cfg)
    a.mul_(2)
    xs.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    ref1 = (xq.double() * a.double()) @ (w.double() * ws.double()[:, None]).T
    ref2 = block_dequant(xq, xs, 1, 128) @ block_dequant(w, wsb, 128, 128).T
    assert rel(y1, ref1) < 1e-2 and rel(y2, ref2) < 1e-2
