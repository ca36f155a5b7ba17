"""Calls at decode sizes from bound launches (backends/triton/bound.py): a W8A8 or GGUF layer
called again and again at the same and other batch sizes, with and without bias and ``out=``, with x
contiguous, strided and off its 16-byte boundary, gives the reference's result every time, and
its workspace's regions hold what the calls need. The repeated calls are checked to run bound (no
launch through the launcher's specializing path). On the CPU a bound launch is run by Triton's
interpreter (:class:`_InterpretedBound`): each raw address the bound call assembles becomes a
tensor over that memory shaped like the tensor bound in its place, so the addresses, offsets and
fixed arguments are what the kernel reads and writes, as on the GPU."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import (
    CudaTritonBlockFp8,
    CudaTritonFp8,
    CudaTritonGGUF,
    CudaTritonInt8,
)
from quantrt.backends.triton import bound, gguf_kernel, w8a8_bound
from quantrt.backends.triton.bound import BOUND_M, regions, workspace_fn
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.gguf_gemm import GemmConfig
from quantrt.backends.triton.launch import Launcher
from quantrt.backends.triton.tile_table import BUCKETS
from quantrt.plans import layer_spec

DEV = "cuda" if torch.cuda.is_available() else "cpu"

CASES = [
    ("w8a8-fp8-ch", CudaTritonFp8),
    ("w8a8-fp8-ch-static", CudaTritonFp8),
    ("w8a8-fp8-block128", CudaTritonBlockFp8),
    ("w8a8-int-ch-sym", CudaTritonInt8),
    ("w8a8-int-tensor-sym-static", CudaTritonInt8),
    ("gguf-q4_k", CudaTritonGGUF),  # the GEMV
    ("gguf-q6_k", CudaTritonGGUF),
]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


class _Counted:
    """Counts the launches that go through :class:`Launcher` (its specializing path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        call = Launcher.__call__

        def counted(launcher, grid, *args, **meta):
            self.n += 1
            call(launcher, grid, *args, **meta)

        monkeypatch.setattr(Launcher, "__call__", counted)


def _at(address: int, like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the memory at ``address``, with ``like``'s dtype, sizes and strides."""
    extent = sum((n - 1) * st for n, st in zip(like.shape, like.stride())) + 1 if like.numel() else 1
    raw = (ctypes.c_uint8 * (extent * like.element_size())).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(like.dtype).as_strided(like.shape, like.stride())


class _InterpretedBound:
    """What :meth:`Launcher.bind` returns, for the interpreter: the launch's leading arguments come
    per call as addresses and are rebuilt as tensors like the ones bound (:func:`_at`); the rest of
    the arguments and the constexprs are the bound ones."""

    device = torch.device("cpu")

    def __init__(self, launcher: Launcher, grid: tuple, pointers: int, args: tuple, meta: dict) -> None:
        self.fn, self.grid, self.meta = launcher.fn, grid, meta
        self.like, self.rest = args[:pointers], args[pointers:]

    def __call__(self, stream: int, *addresses: int) -> None:
        assert len(addresses) == len(self.like)
        self.fn[self.grid](*(_at(a, t) for a, t in zip(addresses, self.like)), *self.rest, **self.meta)


@pytest.mark.parametrize("scheme,kernel", CASES)
def test_repeated_calls_match_the_reference(scheme: str, kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    _repeated_calls(scheme, kernel, monkeypatch)


@pytest.mark.parametrize("scheme", ["gguf-q4_k", "gguf-q6_k"])
def test_gguf_split_gemv_and_fused_gemm_bound(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF tables of the GPUs measured split no GEMV, and the CPU's has no fused GEMM: a table
    with both (split 3, the GEMM from 9 to 32 rows) runs the split GEMV's partials from the
    workspace and the GEMM bound."""
    configs = gguf_kernel._configs
    monkeypatch.setattr(
        gguf_kernel,
        "_configs",
        lambda doc, t, make: tuple((m, dataclasses.replace(c, split_k=3)) for m, c in configs(doc, t, make)),
    )
    tile = GemmConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=2)
    monkeypatch.setattr(gguf_kernel, "_gemm", lambda doc, t, make: ((tile,) * len(BUCKETS), 32))
    _repeated_calls(scheme, CudaTritonGGUF, monkeypatch)


def _repeated_calls(scheme: str, kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    launches = _Counted(monkeypatch)
    if DEV == "cpu":
        monkeypatch.setattr(
            Launcher, "bind", lambda self, grid, n, *a, **m: _InterpretedBound(self, grid, n, a, m)
        )
        monkeypatch.setattr(bound, "raw_stream", lambda device: 0)
        monkeypatch.setattr(w8a8_bound, "raw_stream", lambda device: 0)
    K, N = (256, 80) if "block" in scheme else (512, 77) if "gguf" in scheme else (300, 77)
    g = torch.Generator().manual_seed(K + N)
    w = torch.randn(N, K, generator=g) * 0.05
    calib = torch.randn(64, K, generator=g) * 2
    canon = reference.quantize(w, scheme, calib=calib if "static" in scheme else None)
    act = torch.bfloat16 if DEV == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    spec = layer_spec(scheme, K, N, act_dtype=act, bias=True)
    k = kernel()
    state = k.prepare(canon.to(DEV), spec)
    bias = torch.randn(N, generator=g).to(act).to(DEV)
    tol = 1e-2 if act == torch.bfloat16 else 3e-3
    # (rows, bias, out=, x layout): repeats of one size, then others, then ones that cannot run bound
    calls = (
        [(1, True, False, "plain")] * 3 + [(3, True, False, "plain")] * 2 + [(1, False, False, "plain")] * 2
    )
    calls += [(1, True, True, "plain"), (3, True, False, "strided"), (3, True, False, "unaligned")]
    calls += [(16, True, False, "plain")] * 2  # GGUF on a GPU: the fused GEMM
    calls += [(1, True, False, "plain"), (BOUND_M + 1, True, False, "plain")]
    for i, (m, with_bias, with_out, layout) in enumerate(calls):
        x = (torch.randn(m, K, generator=g) * 1.5).to(act)
        x[-1, i % K] = 40.0  # one value far out, in another column each call
        xd = x.to(DEV)
        if layout == "strided":
            xd = torch.empty(K, m, dtype=act, device=DEV).t().copy_(xd)
        elif layout == "unaligned":
            xd = torch.empty(m * K + 1, dtype=act, device=DEV)[1:].view(m, K).copy_(xd)
        out = torch.full((m, N), float("nan"), dtype=spec.output_dtype, device=DEV) if with_out else None
        before = launches.n
        y = k.apply(state, xd, bias if with_bias else None, out=out)
        ran = launches.n - before
        if with_out:
            assert y.data_ptr() == out.data_ptr()
        ref = reference.linear(x, canon, bias.cpu() if with_bias else None, out_dtype=torch.float32)
        assert rel(y, ref) < tol, (scheme, i, m, layout, rel(y, ref))
        # bound launches are filed by batch size and the dtypes of x and bias (``out=`` is not part of it)
        seen = any(c[0] == m and c[1] == with_bias and c[3] == "plain" for c in calls[:i])
        served = k.strategy(state, m)  # dequant + cuBLAS and _scaled_mm strategies do not bind
        repeat = (
            seen
            and layout == "plain"
            and m <= BOUND_M
            and not any(w in served for w in ("cuBLAS", "_scaled_mm"))
        )
        if repeat:
            assert ran == 0, (scheme, i, "a repeated call went through the launcher")
        else:  # the first call of its kind, or one that cannot run bound
            assert ran >= 1, (scheme, i, "a first or unbindable call took no launcher path")


def test_regions_hold_codes_scales_and_partials() -> None:
    s_off, p_off, end = regions(3, 200, 77, 2, 4)
    assert s_off >= 3 * 200 and s_off % 256 == 0
    assert p_off >= s_off + 4 * 3 * 2 and p_off % 256 == 0
    assert end == p_off + 4 * 4 * 3 * 77
    assert regions(3, 200, 77, 2, 1)[2] == p_off  # no split: no partials


def test_workspace_need_is_monotonic_and_bounded() -> None:
    bounds = (1, 16, 64, 256, 1 << 62)
    configs = (
        TileConfig(16, 64, 128, split_k=8),
        TileConfig(16, 64, 128, split_k=4),
        TileConfig(64, 64, 128, split_k=2),
        TileConfig(64, 128, 128),
        TileConfig(128, 128, 128),
    )
    need = workspace_fn(bounds, configs, 4096, 1024, 1)
    sizes = [need(m) for m in range(1, 400)]
    assert all(a <= b for a, b in itertools.pairwise(sizes))
    # a batch of 2 is served by the split-4 tile: its partials are [4, 2, N]
    assert need(2) >= regions(2, 4096, 1024, 1, 4)[2]
    assert need(10**6) == need(BOUND_M)  # larger batches take the checked path's own buffers
    assert workspace_fn(bounds, configs, 4096, 1024, 1, upto=64)(10**6) == need(64)
