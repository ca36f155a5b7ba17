"""The Triton INT8 W8A8 GEMM against exact integer math and the fp32 reference: -128/127 codes
everywhere, awkward shapes, per-token and per-tensor activation scales, split-K, bias and out=.
On the CPU it runs under TRITON_INTERPRET=1 (int8 dots are exact there); on a GPU as compiled."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.int8_mm import int8_matmul
from quantrt.torchops import quantize_int8_per_token

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}  # by output dtype


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def fp64_reference(
    xq: torch.Tensor, a: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    """Exact integer products, then the scales and bias in fp64."""
    acc = xq.cpu().long() @ w.cpu().long().T
    y = acc.double() * a.cpu().double().reshape(-1, 1) * s.cpu().double()
    return y if b is None else y + b.cpu().double()


@pytest.mark.parametrize("split", [1, 3])
def test_extreme_codes_are_exact(split: int) -> None:
    """-128 and 127 everywhere: with unit scales every output is an integer below 2^24, so fp32 is exact."""
    M, N, K = 33, 77, 300
    g = torch.Generator().manual_seed(1)
    pick = torch.tensor([-128, 127], dtype=torch.int8)
    xq = pick[torch.randint(0, 2, (M, K), generator=g)]
    w = pick[torch.randint(0, 2, (N, K), generator=g)]
    xq[0], w[0], w[1] = -128, -128, 127  # the largest sums: 128 * 128 * 300 and -128 * 127 * 300
    one = torch.ones(1, device=DEV)
    y = int8_matmul(xq.to(DEV), one, w.to(DEV), torch.ones(N, device=DEV), None, torch.float32,
                    TileConfig(16, 32, 64, split))  # fmt: skip
    want = (xq.long() @ w.long().T).float()
    assert want[0, 0] == 128 * 128 * K and want[0, 1] == -128 * 127 * K
    assert torch.equal(y.cpu(), want)


@pytest.mark.parametrize(
    "K,cfg",
    [(200, TileConfig(16, 32, 32)), (300, TileConfig(16, 16, 64)), (256, TileConfig(32, 64, 32))],
    ids=["K200", "K300", "K256-bigtile"],
)
def test_matches_integer_math(K: int, cfg: TileConfig) -> None:
    N = 77
    g = torch.Generator().manual_seed(K)
    w = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    w[:, :3] = -128
    w[:, 3:5] = 127
    s = torch.rand(N, generator=g) * 1e-2 + 1e-4
    b = torch.randn(N, generator=g)
    cases = [  # M, split_k, per-token scale?, bias?, output dtype
        (1, 3, True, True, torch.float32),
        (5, 1, False, True, torch.float16),
        (16, 3, True, False, torch.bfloat16),
        (33, 1, True, True, torch.float32),
        (33, 3, False, False, torch.float16),
    ]
    for M, split, per_token, has_b, out_dtype in cases:
        xq = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        xq[:, -2:] = -128  # the ragged last K-tile holds extremes
        a = torch.rand(M, 1, generator=g) * 0.1 + 1e-3 if per_token else torch.tensor([0.037])
        bias = b.to(out_dtype) if has_b else None
        c = TileConfig(cfg.block_m, cfg.block_n, cfg.block_k, split)
        y = int8_matmul(xq.to(DEV), a.to(DEV), w.to(DEV), s.to(DEV), None if bias is None else bias.to(DEV),
                        out_dtype, c)  # fmt: skip
        assert y.shape == (M, N) and y.dtype == out_dtype
        e = rel(y, fp64_reference(xq, a, w, s, bias))
        assert e < TOL[out_dtype], (M, split, per_token, out_dtype, e)


@pytest.mark.parametrize("split", [1, 3])
def test_end_to_end_against_reference_linear(split: int) -> None:
    """w8a8-int-ch-sym: canonical uint8 offset-128 codes converted once, activations per token."""
    N, K = 77, 200
    g = torch.Generator().manual_seed(5)
    wf = torch.randn(N, K, generator=g) * 0.05
    wf[:, torch.randint(0, K, (3,), generator=g)] *= 8
    canon = reference.quantize(wf, "w8a8-int-ch-sym")
    assert canon["qweight"].dtype == torch.uint8
    w = (canon["qweight"].int() - 128).to(torch.int8)
    s = canon["scales"].reshape(N)
    b = torch.randn(N, generator=g)
    for M in (1, 5, 33):
        x = torch.randn(M, K, generator=g)
        x[:, 7] *= 20  # an outlier channel sets each row's scale
        xq, a = quantize_int8_per_token(x)
        y = int8_matmul(xq.to(DEV), a.to(DEV), w.to(DEV), s.to(DEV), b.to(DEV), torch.float32,
                        TileConfig(16, 32, 64, split))  # fmt: skip
        ref = reference.linear(x, canon, b, out_dtype=torch.float32)
        assert rel(y, ref) < 1e-5, M


def test_m_zero_and_out() -> None:
    N, K = 40, 96
    g = torch.Generator().manual_seed(9)
    w = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8).to(DEV)
    s = (torch.rand(N, generator=g) + 0.5).to(DEV)
    b = torch.randn(N, generator=g).to(DEV)
    cfg = TileConfig(16, 32, 32)
    x0 = torch.empty(0, K, dtype=torch.int8, device=DEV)
    y = int8_matmul(x0, torch.empty(0, 1, device=DEV), w, s, None, torch.bfloat16, cfg)
    assert y.shape == (0, N) and y.dtype == torch.bfloat16
    empty = torch.empty(0, N, device=DEV)
    assert int8_matmul(x0, torch.ones(1, device=DEV), w, s, b, torch.float32, cfg, out=empty) is empty
    xq = torch.randint(-128, 128, (3, K), generator=g, dtype=torch.int8).to(DEV)
    a = (torch.rand(3, 1, generator=g) * 0.01 + 1e-3).to(DEV)  # outputs within fp16 range
    ref = fp64_reference(xq, a, w, s, b)
    for out_dtype in (torch.float16, torch.float32):
        for split in (1, 3):
            out = torch.full((3, N), float("nan"), dtype=out_dtype, device=DEV)
            y = int8_matmul(xq, a, w, s, b, out_dtype, TileConfig(16, 32, 32, split), out=out)
            assert y is out
            assert rel(out, ref) < TOL[out_dtype], (out_dtype, split)
    wide = torch.full((3, 2 * N), float("nan"), device=DEV)  # a strided out (every other column)
    int8_matmul(xq, a, w, s, b, torch.float32, TileConfig(16, 32, 32, 3), out=wide[:, ::2])
    assert rel(wide[:, ::2], ref) < 1e-6 and wide[:, 1::2].isnan().all()


def test_rejects_bad_inputs_with_expected_and_found() -> None:
    N, K = 32, 64
    xq = torch.zeros(2, K, dtype=torch.int8, device=DEV)
    w = torch.ones(N, K, dtype=torch.int8, device=DEV)
    a = torch.ones(2, 1, device=DEV)
    s = torch.ones(N, device=DEV)
    cfg = TileConfig(16, 32, 32)

    def call(**kw):
        args = {"xq": xq, "a_scale": a, "w": w, "w_scale": s, "bias": None, "out_dtype": torch.float16}
        args["config"] = cfg
        args.update(kw)
        return int8_matmul(**args)

    with pytest.raises(ValueError, match=r"xq must be int8 \[M, K\], found torch.uint8"):
        call(xq=xq.to(torch.uint8))
    with pytest.raises(
        ValueError, match=r"w must be int8 \[N, 64\], found torch.uint8 \[32, 64\] .*offset-128"
    ):
        call(w=w.to(torch.uint8))
    with pytest.raises(ValueError, match=r"w must be int8 \[N, 64\], found torch.int8 \[32, 32\]"):
        call(w=w[:, :32])
    with pytest.raises(ValueError, match=r"a_scale must be float32 \[2, 1\] .*found torch.float32 \[2\]"):
        call(a_scale=a.reshape(2))
    with pytest.raises(ValueError, match=r"a_scale must be float32 .*found torch.float16 \[2, 1\]"):
        call(a_scale=a.half())
    with pytest.raises(ValueError, match=r"w_scale must be float32 \[32\].*found torch.float32 \[32, 1\]"):
        call(w_scale=s[:, None])
    with pytest.raises(ValueError, match=r"block_k must be a power of two >= 32, found 16"):
        call(config=TileConfig(16, 32, 16))
    with pytest.raises(ValueError, match=r"block_m must be a power of two >= 16, found 8"):
        call(config=TileConfig(8, 32, 32))
    with pytest.raises(ValueError, match=r"out must be float16 \[2, 32\].*found float32 \[2, 32\]"):
        call(out=torch.empty(2, N, device=DEV))
