"""The CUDA kernels on a real GPU: dispatch picks them, they match the fp32 reference on
awkward shapes, and QuantLinear replays under a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.capability import probe
from quantrt.env import Overrides
from quantrt.layers import QuantLinear

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3}


def any_k(scheme: str) -> bool:
    """Scales that allow any K (odd too): per channel or per tensor."""
    return "-ch-" in scheme or scheme.endswith(("-ch", "-tensor"))


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def build(
    scheme: str, K: int, N: int, dtype: torch.dtype, seed: int, kernel: str | None = None
) -> tuple[QuantLinear, object, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.03
    w[:, torch.randint(0, K, (3,), generator=g)] *= 6
    canon = reference.quantize(w, scheme, calib=torch.randn(64, K, generator=g))
    bias = torch.randn(N, generator=g)
    ov = Overrides(kernel=kernel) if kernel else None
    layer = QuantLinear.from_canonical(
        canon, bias=bias.to(dtype), device="cuda", act_dtype=dtype, overrides=ov
    )
    return layer, canon, bias


CASES = [
    ("w4a16-int-g128-asym", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-g128-asym", "cuda.mma_w4a16", torch.float16),
    ("w4a16-int-g128-sym", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-g128-sym", "cuda.mma_w4a16", torch.float16),
    ("w4a16-int-g32-sym", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-g64-asym", "cuda.mma_w4a16", torch.float16),
    ("w4a16-int-g128-asym-actorder", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-ch-asym", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-ch-sym", "cuda.mma_w4a16", torch.float16),
    ("w8a16-int-ch-sym", "cuda.mma_w8a16", torch.bfloat16),
    ("w8a16-int-ch-sym", "cuda.mma_w8a16", torch.float16),
    ("w8a16-int-g128-asym", "cuda.mma_w8a16", torch.bfloat16),
    ("w8a16-int-g128-asym", "cuda.mma_w8a16", torch.float16),
    ("w8a16-int-g32-sym", "cuda.mma_w8a16", torch.bfloat16),
    ("w4a16-int-g16-asym", "cuda.mma_w4a16", torch.float16),
    ("w4a16-int-g256-sym", "cuda.mma_w4a16", torch.bfloat16),
    ("w4a16-int-g128-asym", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-g128-sym", "cuda.triton_w4a16", torch.float16),
    ("w4a16-int-g32-sym", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-g128-asym-actorder", "cuda.triton_w4a16", torch.bfloat16),
    ("w4a16-int-ch-asym", "cuda.triton_w4a16", torch.bfloat16),
    ("w8a16-int-ch-sym", "cuda.triton_w8a16", torch.bfloat16),
    ("w8a16-int-g128-asym", "cuda.triton_w8a16", torch.float16),
    ("w4a16-int-g128-asym", "cuda.torch_tinygemm", torch.bfloat16),
    ("w4a16-int-g128-sym-actorder", "cuda.torch_tinygemm", torch.bfloat16),
    ("w8a8-fp8-ch", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-fp8-tensor", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-fp8-tensor-static", "cuda.torch_scaled_mm", torch.float16),
    ("w8a8-fp8-ch-static", "cuda.torch_scaled_mm", torch.bfloat16),
    ("w8a8-int-ch-sym", "cuda.torch_int_mm", torch.bfloat16),
    ("w8a8-int-ch-sym-static", "cuda.torch_int_mm", torch.float16),
    ("w8a8-int-tensor-sym-static", "cuda.torch_int_mm", torch.bfloat16),
    ("w8a8-fp8-ch", "cuda.triton_fp8", torch.bfloat16),
    ("w8a8-fp8-tensor", "cuda.triton_fp8", torch.bfloat16),
    ("w8a8-fp8-ch-static", "cuda.triton_fp8", torch.float16),
    ("w8a8-fp8-tensor-static", "cuda.triton_fp8", torch.bfloat16),
    ("w8a8-fp8-block128", "cuda.triton_block_fp8", torch.bfloat16),
    ("w8a8-fp8-block128", "cuda.triton_block_fp8", torch.float16),
    ("w3a16-int-g128-asym", "cuda.mma_w2w3", torch.bfloat16),
    ("w3a16-int-g128-sym", "cuda.mma_w2w3", torch.float16),
    ("w2a16-int-g128-asym", "cuda.mma_w2w3", torch.float16),
    ("w2a16-int-g64-sym", "cuda.mma_w2w3", torch.bfloat16),
    ("w8a16-fp8-ch", "cuda.mma_fp8", torch.bfloat16),
    ("w8a16-fp8-tensor", "cuda.mma_fp8", torch.float16),
    ("w8a16-fp8-block128", "cuda.mma_fp8", torch.bfloat16),
    ("w8a16-fp8-block128", "cuda.mma_fp8", torch.float16),
    ("w8a16-fp8e5m2-ch", "cuda.mma_fp8", torch.float16),
    ("w8a16-fp8e5m2-tensor", "cuda.mma_fp8", torch.bfloat16),
    ("w8a16-fp8e5m2-block128", "cuda.mma_fp8", torch.bfloat16),
    ("w8a16-fp8-ch", "cuda.triton_fp8_w8a16", torch.bfloat16),
    ("w8a16-fp8-block128", "cuda.triton_fp8_w8a16", torch.float16),
    ("w8a16-fp8e5m2-tensor", "cuda.triton_fp8_w8a16", torch.bfloat16),
    ("w8a8-int-ch-sym", "cuda.triton_int8", torch.bfloat16),
    ("w8a8-int-ch-sym-static", "cuda.triton_int8", torch.float16),
]


@pytest.mark.parametrize("scheme,kernel,dtype", CASES, ids=lambda v: str(v))
def test_kernel_matches_reference(scheme: str, kernel: str, dtype: torch.dtype) -> None:
    shapes = [(4096, 4096), (768 if "g256" in scheme else 640, 176)]
    if "mma" in kernel:  # K past the last full chunk, N odd (channel scales allow any K, odd too)
        tail = 201 if any_k(scheme) else 4352 if "g256" in scheme else 4224 if "g128" in scheme else 4160
        shapes.append((tail, 77))
    for K, N in shapes:
        layer, canon, bias = build(scheme, K, N, dtype, seed=K + N, kernel=kernel)
        assert layer.kernel_name == kernel, layer.selection.explain()
        ms = (1, 5, 16, 17, 33, 64, 65, 100, 128, 300) if "mma" in kernel else (1, 16, 17, 300)
        for M in ms:
            g = torch.Generator().manual_seed(M)
            x = torch.randn(M, K, generator=g).to("cuda", dtype)
            y = layer(x)
            ref = reference.linear(x.cpu(), canon, bias, out_dtype=torch.float32)
            assert y.dtype == dtype and y.shape == (M, N)
            assert rel(y.cpu(), ref) < TOL[dtype], (K, N, M, rel(y.cpu(), ref))
        xs = torch.randn(5, 2 * K, device="cuda", dtype=dtype)[:, ::2]
        assert (
            rel(layer(xs).cpu(), reference.linear(xs.cpu(), canon, bias, out_dtype=torch.float32))
            < TOL[dtype]
        )
        assert layer(torch.empty(0, K, device="cuda", dtype=dtype)).shape == (0, N)


@pytest.mark.parametrize(
    "scheme,kernel,m",
    [
        ("w4a16-int-g128-asym", None, 1),
        ("w4a16-int-g128-asym", None, 16),
        ("w4a16-int-g128-asym", None, 300),
        ("w8a16-int-ch-sym", None, 16),
        ("w4a16-int-g128-asym", "cuda.triton_w4a16", 16),
        ("w8a8-fp8-ch", None, 16),
        ("w8a8-fp8-ch", None, 300),
        ("w8a8-fp8-block128", None, 16),
        ("w8a16-fp8-ch", None, 1),
        ("w8a16-fp8-block128", None, 16),
        ("w8a8-int-ch-sym", None, 16),
    ],
)
def test_cuda_graph_replay_equals_eager(scheme: str, kernel: str | None, m: int) -> None:
    layer, _, _ = build(scheme, 4096, 4096, torch.bfloat16, seed=1, kernel=kernel)
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    eager = layer(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(y, layer(x)) < 1e-3  # split-K reduces with fp32 atomics: summation order may differ
    assert eager.shape == y.shape


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-asym", "w8a16-int-g128-sym"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mma_kernel_on_extreme_codes_and_scales(scheme: str, dtype: torch.dtype) -> None:
    """Codes 0 and 2^b-1 everywhere, zeros at both ends, scales spanning 1e-4..8."""
    K, N = 1024, 136
    g = torch.Generator().manual_seed(7)
    canon = reference.quantize(torch.randn(N, K, generator=g), scheme)
    bits = canon.scheme.bits
    codes = torch.zeros(N, K, dtype=torch.uint8)
    codes[::2] = (1 << bits) - 1
    codes[:, ::3] = 0
    from quantrt.packing import pack_codes

    canon.tensors["qweight"] = pack_codes(codes, bits)
    sc = canon["scales"]
    canon.tensors["scales"] = torch.where(torch.rand(sc.shape, generator=g) < 0.5, 1e-4, 8.0).to(sc.dtype)
    if "zeros" in canon.tensors:
        z = canon["zeros"]
        canon.tensors["zeros"] = torch.where(torch.rand(z.shape, generator=g) < 0.5, 0, 1 << bits).to(z.dtype)
    layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=dtype)
    assert layer.kernel_name.startswith("cuda.mma_"), layer.selection.explain()
    for m in (1, 16, 100):
        x = (torch.randn(m, K, generator=g) * 0.1).to("cuda", dtype)
        ref = reference.linear(x.cpu(), canon, None, out_dtype=torch.float32)
        assert rel(layer(x).cpu(), ref) < TOL[dtype], (m, rel(layer(x).cpu(), ref))


def test_mma_kernel_writes_into_out_and_compiles() -> None:
    layer, canon, bias = build("w4a16-int-g128-sym", 512, 264, torch.bfloat16, seed=3)
    assert layer.kernel_name == "cuda.mma_w4a16"
    for m in (4, 300):  # the mma path and the dequant+cuBLAS path
        xm = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, 264), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = layer(xm, out=out)
        ref = reference.linear(xm.cpu(), canon, bias, out_dtype=torch.float32)
        assert y.data_ptr() == out.data_ptr() and rel(out.cpu(), ref) < TOL[torch.bfloat16], m
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    ref = reference.linear(x.cpu(), canon, bias, out_dtype=torch.float32)
    compiled = torch.compile(lambda t: layer(t), fullgraph=True)
    assert rel(compiled(x).cpu(), ref) < TOL[torch.bfloat16]


def test_probe_reports_this_gpu() -> None:
    caps = probe()
    dev = caps.device("cuda:0")
    assert (
        dev.runnable
        and dev.vendor == "nvidia"
        and dev.compute_capability == torch.cuda.get_device_capability(0)
    )
    major, minor = torch.cuda.get_device_capability(0)
    assert dev.arch == f"sm_{major}{minor}"
    if dev.arch == "sm_90":
        assert "fp8_e4m3" in dev.matrix_types and "fp4_e2m1" not in dev.matrix_types
        assert {"_scaled_mm", "_int_mm", "_weight_int4pack_mm"} <= dev.torch_ops


LAUNCH_SHAPES = [  # explicit launch shapes of the mma kernel, beyond what the committed table picks
    {"max_m": 8, "mt": 1, "nt": 4, "wn": 2, "swap": True, "stages": 4},
    {"max_m": 16, "mt": 1, "nt": 8, "wn": 4, "swap": True, "stages": 3},
    {"max_m": 40, "mt": 1, "nt": 4, "wn": 2, "swap": True, "stages": 2},  # 5 n8 parts of rows
    {"max_m": 64, "mt": 1, "nt": 2, "wn": 8, "swap": True, "stages": 2},
    {"max_m": 64, "mt": 1, "nt": 4, "wn": 4, "swap": True, "stages": 3, "fold": False},
    {"max_m": 32, "mt": 2, "nt": 4, "wn": 2, "swap": False, "stages": 2},
    {"max_m": 64, "mt": 4, "nt": 2, "wn": 8, "swap": False, "stages": 3, "fold": False},
    {"max_m": 128, "mt": 1, "nt": 2, "wn": 4, "swap": True, "xr": 64, "stages": 3, "fold": False},
    # the warpgroup-MMA kernel (Hopper): x rows as wgmma's n, 64 columns per warpgroup
    {"max_m": 16, "wgmma": True, "stages": 3},
    {"max_m": 40, "wgmma": True, "xr": 64, "wgn": 2, "stages": 2},
    {"max_m": 128, "wgmma": True, "stages": 2},
    {"max_m": 256, "wgmma": True, "stages": 2},
]


@pytest.mark.parametrize(
    "scheme,dtype",
    [
        ("w4a16-int-g128-asym", torch.bfloat16),
        ("w4a16-int-g32-sym", torch.float16),
        ("w8a16-int-ch-sym", torch.bfloat16),
        ("w8a16-int-g128-asym", torch.float16),
        ("w4a16-nvfp4", torch.bfloat16),
        ("w4a16-mxfp4", torch.float16),
        ("w4a16-nf4-g64", torch.bfloat16),
        ("w8a16-fp8-block128", torch.bfloat16),
        ("w8a16-fp8e5m2-ch", torch.float16),
    ],
    ids=str,
)
def test_mma_launch_shapes_match_reference(scheme: str, dtype: torch.dtype) -> None:
    """Every launch geometry (swapped parts, m16 tiles, warps sharing x over N, K groups, the
    wgmma kernel) against the reference; N = 328 leaves the last column block partly past the padded weight."""
    from quantrt.backends.cuda import mma_wna16 as mk

    K = 1401 if any_k(scheme) else 1408  # channel scales: K odd, rows re-aligned per call
    layer, canon, bias = build(scheme, K, 328, dtype, seed=11)
    assert layer.kernel_name.startswith("cuda.mma_"), layer.selection.explain()
    lay = layer._state.layout
    dev = torch.cuda.current_device()
    limit = mk.smem_limit(dev)
    szb = mk.sz_bytes(dtype, lay.code)
    g = torch.Generator().manual_seed(5)
    hopper = torch.cuda.get_device_capability(dev) == (9, 0)
    for row in LAUNCH_SHAPES:
        if row.get("wgmma") and (not hopper or lay.code != lay.bits):
            continue  # sm_90a code, integer codes only
        shape = mk.Shape.of(row, lay.bits, dtype, lay.gpc, foldable=mk.folds(lay.code, lay.bits))
        for wk in (1, 3):
            if shape.smem(wk, lay.gpc, szb, lay.bits) > limit:
                continue
            tile = mk.make_tile(shape, dtype, lay.code, lay.gpc, dev, wk)
            run = mk.tile_strategy(tile).fn  # this launch shape for every batch size
            for m in (1, 7, shape.rows, shape.rows + 5):  # one row block, and past it
                x = torch.randn(m, K + 3, generator=g)[:, 3:]  # not 16-byte aligned
                y = run(lay, x.to("cuda", dtype), bias.to("cuda", dtype), None, None)
                ref = reference.linear(x.to(dtype), canon, bias.to(dtype), out_dtype=torch.float32)
                err = rel(y.cpu(), ref)
                assert err < TOL[dtype], (row, wk, m, err, mk.tile_expr(dtype, lay.code, lay.gpc, shape))


@pytest.mark.parametrize(
    "scheme,kernel",
    [
        ("w8a8-fp8-ch", "cuda.triton_fp8"),
        ("w8a8-fp8-block128", "cuda.triton_block_fp8"),
        ("w8a16-fp8-ch", "cuda.triton_fp8_w8a16"),
        ("w8a8-int-ch-sym", "cuda.triton_int8"),
    ],
)
def test_w8a8_kernels_compile_fullgraph(scheme: str, kernel: str) -> None:
    """torch.compile traces the W8A8 kernels through the prepared layer's op (no graph break)."""
    layer, canon, bias = build(scheme, 512, 256, torch.bfloat16, seed=5, kernel=kernel)
    assert layer.kernel_name == kernel
    for m in (3, 100):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        ref = reference.linear(x.cpu(), canon, bias, out_dtype=torch.float32)
        compiled = torch.compile(lambda t: layer(t), fullgraph=True)
        assert rel(compiled(x).cpu(), ref) < TOL[torch.bfloat16], m
