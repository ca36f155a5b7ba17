"""The one-launch W8A8 GEMV (backends/triton/w8a8_gemv.py) against quantrt's reference, which
quantizes the activations as the scheme says and multiplies in fp32, and against the two-launch
path (the quantization kernel's stored codes, then the GEMM): every activation mode (per token, per
tensor, static), fp8 and int8, ragged K and N, one to four rows, bias, the output dtypes, strided
x. On the CPU it runs under TRITON_INTERPRET=1 (the software fp8 rounding); on a GPU with fp8
units the hardware cast too. The dispatch takes it only where a tile table has a ``gemv`` row."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import CudaTritonFp8, CudaTritonInt8
from quantrt.backends.triton import act_quant
from quantrt.backends.triton.act_quant import encoding, qmax_of
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.fp8_mm import fp8_rowwise_matmul
from quantrt.backends.triton.int8_mm import int8_matmul
from quantrt.backends.triton.tile_table import GemvConfig
from quantrt.backends.triton.w8a8_gemv import w8a8_gemv
from quantrt.plans import layer_spec
from quantrt.torchops import per_channel_scales

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = ("w8a8-fp8-ch", "w8a8-fp8-tensor", "w8a8-fp8-ch-static", "w8a8-fp8-tensor-static")
INT8 = ("w8a8-int-ch-sym", "w8a8-int-ch-sym-static", "w8a8-int-tensor-sym-static")
#: output rounding (relative) per dtype; the interpreter rounds bf16 by truncation
ROUND = {torch.float32: 1e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def layer(scheme: str, N: int, K: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (3,), generator=g)] *= 8  # outlier columns
    calib = torch.randn(64, K, generator=g) * 2
    return reference.quantize(w, scheme, calib=calib if "static" in scheme else None), g


def operands(canon):
    """What the prepared kernels hold: signed codes, fp32 channel scales, the static scale."""
    s = canon.scheme
    kind = "int8" if s.act == "int8" else "fp8"
    q = canon["qweight"]
    if kind == "int8":
        q = (q.to(torch.int16) - 128).to(torch.int8)
    ins = canon.get("input_scale")
    ins = None if ins is None else ins.float().amax().reshape(()).to(DEV)
    act = "static" if not s.act_dynamic else s.act_granularity
    return kind, q.contiguous().to(DEV), per_channel_scales(canon).contiguous().to(DEV), ins, act


def batch(g: torch.Generator, M: int, K: int) -> torch.Tensor:
    x = torch.randn(M, K, generator=g) * 1.5
    x[0, :5] = 0.0
    x[-1, 3] = 40.0  # far out: static fp8 codes saturate here
    return x


@pytest.mark.parametrize("scheme", FP8 + INT8)
@pytest.mark.parametrize("K,N,cfg", [(200, 77, GemvConfig(4, 32, 64)), (256, 96, GemvConfig(4, 16, 128, 2))])
def test_matches_the_reference(scheme: str, K: int, N: int, cfg: GemvConfig) -> None:
    canon, g = layer(scheme, N, K, K + N)
    kind, q, ws, ins, act = operands(canon)
    meta = encoding(q, kind, torch.float8_e4m3fn, "test")
    if act == "static" and kind == "fp8":
        meta["FMAX"] = 448.0
    bias = torch.randn(N, generator=g)
    for M in (1, 2, 3, 4):
        x = batch(g, M, K)
        b = bias if M != 2 else None
        y = w8a8_gemv(
            x.to(DEV), q, ws, None if b is None else b.to(DEV), torch.float32, cfg, meta,
            act=act, in_scale=ins, qmax=qmax_of(kind, None),
        )  # fmt: skip
        ref = reference.linear(x, canon, b, out_dtype=torch.float32)
        assert y.shape == (M, N) and y.dtype == torch.float32
        assert rel(y, ref) < 1e-6, (scheme, M, rel(y, ref))


@pytest.mark.parametrize("scheme", ["w8a8-fp8-ch", "w8a8-int-ch-sym"])
def test_codes_are_the_quantization_kernels(scheme: str) -> None:
    """The codes made inside the GEMV are the ones act_quant stores: the two-launch path's result,
    up to fp32 summation order (int8: exactly, both sum in int32)."""
    K, N = 320, 48
    canon, g = layer(scheme, N, K, 11)
    kind, q, ws, _, act = operands(canon)
    meta = encoding(q, kind, torch.float8_e4m3fn, "test")
    x = batch(g, 3, K).to(DEV)
    y = w8a8_gemv(
        x, q, ws, None, torch.float32, GemvConfig(4, 16, 64), meta, act=act, qmax=qmax_of(kind, None)
    )
    xq, xs = act_quant.quantize_per_token(x, kind)
    tile = TileConfig(16, 16, 64)
    two = (int8_matmul if kind == "int8" else fp8_rowwise_matmul)(xq, xs, q, ws, None, torch.float32, tile)
    if kind == "int8":
        assert torch.equal(y, two)
    else:
        assert rel(y, two) < 1e-6


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_output_dtypes_strided_x_and_out(out_dtype: torch.dtype) -> None:
    K, N = 192, 40
    canon, g = layer("w8a8-fp8-ch", N, K, 5)
    kind, q, ws, _, act = operands(canon)
    meta = encoding(q, kind, torch.float8_e4m3fn, "test")
    wide = batch(g, 3, 2 * K).to(out_dtype)
    x = wide[:, K:]  # rows 2K apart
    xt = batch(g, 3, K).to(out_dtype).t().contiguous().t()  # column-major: K stride 3
    bias = torch.randn(N, generator=g).to(out_dtype)
    for xx in (x, xt):
        assert not xx.is_contiguous()
        out = torch.full((3, N), float("nan"), dtype=out_dtype, device=DEV)
        y = w8a8_gemv(
            xx.to(DEV), q, ws, bias.to(DEV), out_dtype, GemvConfig(4, 16, 64), meta,
            act=act, qmax=qmax_of(kind, None), out=out,
        )  # fmt: skip
        assert y is out
        ref = reference.linear(xx.float(), canon, bias.float(), out_dtype=torch.float32)
        assert rel(y, ref) < ROUND[out_dtype], rel(y, ref)


def test_zero_rows_and_bounds() -> None:
    """An all-zero row has scale 1 and codes 0 (y = bias); more rows than the config takes is refused."""
    K, N = 128, 32
    canon, g = layer("w8a8-int-ch-sym", N, K, 3)
    kind, q, ws, _, act = operands(canon)
    meta = encoding(q, kind, torch.float8_e4m3fn, "test")
    bias = torch.randn(N, generator=g)
    x = batch(g, 2, K)
    x[1] = 0.0
    y = w8a8_gemv(
        x.to(DEV), q, ws, bias.to(DEV), torch.float32, GemvConfig(2, 32, 64), meta, act=act, qmax=127.0
    )
    assert torch.equal(y[1].cpu(), bias)
    assert rel(y, reference.linear(x, canon, bias, out_dtype=torch.float32)) < 1e-6
    with pytest.raises(ValueError, match="at most 2 rows per call, found 3"):
        w8a8_gemv(
            batch(g, 3, K).to(DEV),
            q,
            ws,
            None,
            torch.float32,
            GemvConfig(2, 32, 64),
            meta,
            act=act,
            qmax=127.0,
        )
    for bad in (dict(max_m=3), dict(block_n=24), dict(max_m=8), dict(num_warps=0)):
        with pytest.raises(ValueError, match="GemvConfig"):
            GemvConfig(**{"max_m": 4, "block_n": 32, "block_k": 64, **bad})


def with_gemv_row(kernel, monkeypatch, section: str, row: dict | None) -> None:
    """The kernel's policy reading a table with (or without) a ``gemv`` row in ``section``."""
    policy = kernel.policy
    real = type(policy).table

    def table(self, name, target):
        t = real(self, name, target)
        if name == "w8a8":
            t = {**t, section: {**t[section]}}
            t[section].pop("gemv", None)
            if row is not None:
                t[section]["gemv"] = row
        return t

    monkeypatch.setattr(type(policy), "table", table)


@pytest.mark.parametrize(
    "kernel,scheme,section",
    [
        (CudaTritonFp8, "w8a8-fp8-ch", "fp8_rowwise"),
        (CudaTritonFp8, "w8a8-fp8-tensor-static", "fp8_rowwise"),
        (CudaTritonInt8, "w8a8-int-ch-sym", "int8"),
        (CudaTritonInt8, "w8a8-int-tensor-sym-static", "int8"),
    ],
)
def test_dispatch_takes_it_where_the_table_has_a_row(kernel, scheme, section, monkeypatch) -> None:
    K, N = 256, 96
    canon, g = layer(scheme, N, K, 21)
    spec = layer_spec(scheme, K, N, act_dtype=torch.float16, bias=True)
    bias = torch.randn(N, generator=g).half()
    with_gemv_row(kernel, monkeypatch, section, None)
    plain = kernel().prepare(canon.to(DEV), spec)
    assert not any("gemv" in s.name for s in plain.strategies)
    with_gemv_row(kernel, monkeypatch, section, {"max_m": 4, "block_n": 32, "block_k": 64})
    k = kernel()
    state = k.prepare(canon.to(DEV), spec)
    for M in (1, 3, 4, 5):
        x = batch(g, M, K).half()
        name = k.strategy(state, M)
        assert ("gemv" in name) == (M <= 4), (M, name)
        y = k.apply(state, x.to(DEV), bias.to(DEV))
        ref = reference.linear(x.float(), canon, bias.float(), out_dtype=torch.float32)
        assert y.dtype == torch.float16 and rel(y, ref) < 3e-3, (M, name, rel(y, ref))
