"""The NVIDIA FP4 (NVFP4, MXFP4), bitsandbytes NF4/FP4 and GGUF kernels on a real GPU: dispatch
picks them, every path (GEMV, tiles, dequant + cuBLAS in slices) matches the fp32 reference on
awkward shapes in bf16 (which the CPU interpreter cannot check), on llama.cpp's own files and on
adversarial codes, and the layers replay under a CUDA graph."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from quantrt import reference
from quantrt.canonical import CanonicalWeight
from quantrt.env import Overrides
from quantrt.layers import QuantLinear
from quantrt.schemes import parse_scheme

TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
GGUF_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
#: the GGUF types on ``cuda.mma_gguf_blocks`` (a parameter per 32-input block)
BLOCK32_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k", "q6_k")


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def build(scheme: str, K: int, N: int, dtype: torch.dtype, seed: int, kernel: str | None = None):
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


def with_slices(layer: QuantLinear, rows: int) -> None:
    """The layer's dense strategy (the last one) dequantizing ``rows`` rows of W per cuBLAS call."""
    from quantrt.backends.triton import dense_slices
    from quantrt.backends.triton import gguf_kernel as triton_gguf
    from quantrt.backends.triton import lut4_kernel as triton_lut4

    state, spec = layer._state, layer.layer_spec()
    module = triton_gguf if layer.kernel_name == "cuda.triton_gguf" else triton_lut4
    dense = dense_slices.dense_strategy(rows, spec.N_part, module._dequant)
    tail = dense_slices.in_act_dtype([dense], spec.act_dtype, spec.output_dtype)
    layer._state = layer._kernel.prepared(
        state.layout, [*state.strategies[:-1], *tail], spec, state.device, rows=state.rows
    )


def awkward_k(scheme: str) -> int:
    """K a multiple of the format's block but of no tile: 21 legacy GGUF blocks, 3 super-blocks, 11 groups of 64 (5 of 128)."""
    if scheme.startswith("gguf"):
        return 32 * 21 if scheme.endswith(("_0", "_1")) else 256 * 3
    return 128 * 5 if "-g128" in scheme else 64 * 11


CASES = [
    ("w4a16-nvfp4", "cuda.mma_fp4", torch.bfloat16),
    ("w4a16-nvfp4", "cuda.mma_fp4", torch.float16),
    ("w4a16-mxfp4", "cuda.mma_fp4", torch.bfloat16),
    ("w4a16-mxfp4", "cuda.mma_fp4", torch.float16),
    ("w4a16-nvfp4", "cuda.triton_fp4", torch.bfloat16),
    ("w4a16-nvfp4", "cuda.triton_fp4", torch.float16),
    ("w4a16-mxfp4", "cuda.triton_fp4", torch.bfloat16),
    ("w4a16-mxfp4", "cuda.triton_fp4", torch.float16),
    ("w4a16-nf4-g64", "cuda.mma_bnb4", torch.bfloat16),
    ("w4a16-nf4-g64-dq", "cuda.mma_bnb4", torch.float16),
    ("w4a16-bnbfp4-g64", "cuda.mma_bnb4", torch.bfloat16),
    ("w4a16-nf4-g128", "cuda.mma_bnb4", torch.float16),  # one group per chunk: unfolded, chunk shift
    ("w4a16-nf4-g64", "cuda.triton_bnb4", torch.bfloat16),
    ("w4a16-nf4-g64-dq", "cuda.triton_bnb4", torch.float16),
    ("w4a16-bnbfp4-g64", "cuda.triton_bnb4", torch.float16),
    ("w4a16-bnbfp4-g64-dq", "cuda.triton_bnb4", torch.bfloat16),
    *[(f"gguf-{t}", "cuda.triton_gguf", torch.bfloat16) for t in GGUF_TYPES],
    ("gguf-q4_k", "cuda.triton_gguf", torch.float16),
    ("gguf-q8_0", "cuda.triton_gguf", torch.float16),
    *[
        (f"gguf-{t}", "cuda.gemv_gguf", dt)
        for t in ("q4_k", "q6_k")
        for dt in (torch.bfloat16, torch.float16)
    ],
    ("gguf-q4_k", "cuda.mma_gguf", torch.bfloat16),
    ("gguf-q4_k", "cuda.mma_gguf", torch.float16),
    ("gguf-q8_0", "cuda.mma_gguf_q8", torch.bfloat16),
    ("gguf-q8_0", "cuda.mma_gguf_q8", torch.float16),
    *[
        (f"gguf-{t}", "cuda.mma_gguf_blocks", dt)
        for t in BLOCK32_TYPES
        for dt in (torch.bfloat16, torch.float16)
    ],
]
#: the GGUF types the CUDA GEMV takes (the others stay with the Triton GEMV)
CUDA_GEMV_TYPES = ("q4_k", "q6_k")
#: the kernel dispatch picks per GGUF type on this GPU
GGUF_KERNEL = {
    "q4_k": "cuda.mma_gguf",
    "q6_k": "cuda.gemv_gguf",
    "q8_0": "cuda.mma_gguf_q8",
    **{t: "cuda.mma_gguf_blocks" for t in BLOCK32_TYPES if t != "q6_k"},
}
#: the tensor-core kernel of each GGUF type it takes
MMA_KERNEL = {
    "q4_k": "cuda.mma_gguf",
    "q8_0": "cuda.mma_gguf_q8",
    **{t: "cuda.mma_gguf_blocks" for t in BLOCK32_TYPES},
}


@pytest.mark.parametrize("scheme,kernel,dtype", CASES, ids=str)
def test_kernel_matches_reference(scheme: str, kernel: str, dtype: torch.dtype) -> None:
    for K, N in [(2048, 1024), (awkward_k(scheme), 177)]:
        layer, canon, bias = build(scheme, K, N, dtype, seed=K + N, kernel=kernel)
        assert layer.kernel_name == kernel, layer.selection.explain()
        for M in (1, 2, 5, 16, 17, 64, 65, 300):
            x = torch.randn(M, K, device="cuda").to(dtype)
            y = layer(x)
            ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
            assert y.dtype == dtype and y.shape == (M, N)
            assert rel(y, ref) < TOL[dtype], (K, N, M, layer._kernel.strategy(layer._state, M), rel(y, ref))
        xs = torch.randn(5, 2 * K, device="cuda", dtype=dtype)[:, ::2]
        assert rel(layer(xs), reference.linear(xs, canon, bias, out_dtype=torch.float32)) < TOL[dtype]
        assert layer(torch.empty(0, K, device="cuda", dtype=dtype)).shape == (0, N)


def test_w4a4_nvfp4_runs_as_labelled_weight_only_substitute_on_hopper() -> None:
    layer, canon, bias = build("w4a4-nvfp4", 1024, 256, torch.bfloat16, seed=4)
    if torch.cuda.get_device_capability() < (10, 0):
        assert layer.kernel_name == "cuda.mma_fp4" and layer.selection.label == "weight-only substitute"
    x = torch.randn(7, 1024, device="cuda", dtype=torch.bfloat16)
    ref = reference.linear(x, canon, bias, out_dtype=torch.float32, weight_only=True)
    assert rel(layer(x), ref) < TOL[torch.bfloat16]


def test_dense_path_in_several_slices_matches_reference() -> None:
    """A workspace smaller than the weight: cuBLAS runs slice by slice (bias per slice)."""
    from quantrt.backends.cuda import mma_wna16

    for scheme, kernel in (("w4a16-nvfp4", "cuda.triton_fp4"), ("gguf-q6_k", "cuda.triton_gguf"),
                           ("w4a16-nvfp4", "cuda.mma_fp4")):  # fmt: skip
        layer, canon, bias = build(scheme, 512, 700, torch.bfloat16, seed=9, kernel=kernel)
        if kernel == "cuda.mma_fp4":  # K slices of one 128-input chunk, the column factor after the sum
            lay = dataclasses.replace(layer._state.layout, slice_chunks=1)
            layer._state = mma_wna16.build(layer._kernel, lay, layer.layer_spec())
            assert "K slices of 128" in layer._kernel.strategy(layer._state, 300)
        else:
            with_slices(layer, 256)
            assert "slices of 256" in layer._kernel.strategy(layer._state, 300)
        x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
        ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
        assert rel(layer(x), ref) < TOL[torch.bfloat16], scheme
        out = torch.full((300, 700), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert layer(x, out=out).data_ptr() == out.data_ptr() and rel(out, ref) < TOL[torch.bfloat16]


def _fp4_weight(scheme: str, N: int, K: int, g: torch.Generator) -> CanonicalWeight:
    s = parse_scheme(scheme)
    G = s.group_size
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    codes[0] = 8  # fp4 -0 everywhere in one row
    codes[1, ::2] = 7  # the largest magnitude, 6
    codes[2] &= 0xB  # |value| <= 1.5: times 2^127 (MXFP4 row 2) it stays finite in fp32
    qweight = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    if s.family == "nvfp4":
        sc = torch.randint(0, 0x7F, (N, K // G), generator=g, dtype=torch.uint8)
        sc[2] = 0x7E  # the largest e4m3 scale, 448
        sc[3] = 1  # the smallest subnormal
        t = {"scales": sc.view(torch.float8_e4m3fn), "global_scale": torch.tensor([0.37])}
    else:
        sc = torch.randint(110, 135, (N, K // G), generator=g, dtype=torch.uint8)
        sc[2] = 254  # 2^127: checked with x scaled down, so the sums stay finite
        sc[3] = 0  # 2^-127: checked with x scaled up
        t = {"scales": sc}
    return CanonicalWeight(s, N, K, {"qweight": qweight, **t})


@pytest.mark.parametrize("kernel", ["cuda.mma_fp4", "cuda.triton_fp4"])
@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4"])
@pytest.mark.parametrize("M", [1, 16, 300])
def test_fp4_adversarial_codes_and_scales(scheme: str, M: int, kernel: str) -> None:
    g = torch.Generator().manual_seed(M)
    N, K = 136, 1024
    canon = _fp4_weight(scheme, N, K, g)
    layer = QuantLinear.from_canonical(
        canon, device="cuda", act_dtype=torch.bfloat16, overrides=Overrides(kernel=kernel)
    )
    assert layer.kernel_name == kernel, layer.selection.explain()
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = reference.dequantize(canon).double()
    y = layer(x.cuda()).float().cpu()
    ref = x.double() @ w.T
    rows = [r for r in range(N) if r not in (2, 3) or "mx" not in scheme]
    assert rel(y[:, rows], ref[:, rows]) < TOL[torch.bfloat16]
    assert torch.equal(y[:, 0], torch.zeros(M)), "fp4 -0 codes must contribute nothing"
    if "mx" in scheme:  # the extreme exponents, each with x scaled so its row's sums are normal numbers
        for row, scale in ((2, 2.0**-120), (3, 2.0**100)):
            xs = (x.double() * scale).to(torch.bfloat16)
            ys = layer(xs.cuda()).double().cpu()[:, row]
            assert rel(ys, (xs.double() @ w.T)[:, row]) < TOL[torch.bfloat16], row


def _fixture_tensors() -> list[tuple[str, str, np.ndarray, list[int]]]:
    """The first 2-D tensor of each type across the fixture files (every file holds q6_k, so
    taking one per file would test q6_k alone)."""
    found, seen = [], set()
    for path in sorted(FIXTURES.glob("*.gguf")):
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            name = t.tensor_type.name.lower()
            if name in GGUF_TYPES and len(t.shape) == 2 and name not in seen:
                seen.add(name)
                found.append((path.name, name, np.array(t.data), [int(v) for v in t.shape]))
    return found


def test_gguf_llama_cpp_files_match_gguf_py() -> None:
    """A tensor of every llama.cpp-written fixture file, against gguf-py's own dequantizer."""
    from gguf.quants import dequantize as gguf_dequantize

    tensors = _fixture_tensors()
    assert {t[1] for t in tensors} >= {"q4_0", "q8_0", "q4_k", "q6_k"}, [t[:2] for t in tensors]
    for fname, t, data, shape in tensors:
        K, N = shape
        qweight = torch.from_numpy(data.view(np.uint8).reshape(N, -1).copy())
        canon = CanonicalWeight(parse_scheme(f"gguf-{t}"), N, K, {"qweight": qweight})
        w = (
            torch.from_numpy(gguf_dequantize(data, gguf.GGMLQuantizationType[t.upper()]))
            .reshape(N, K)
            .double()
        )
        layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.float16)
        assert layer.kernel_name == GGUF_KERNEL.get(t, "cuda.triton_gguf"), layer.selection.explain()
        for M in (1, 3, 200):
            x = torch.randn(M, K).half()
            ref = x.double() @ w.T
            assert rel(layer(x.cuda()), ref) < TOL[torch.float16], (fname, M)


#: llama.cpp's block layouts: (elements, bytes) and the byte offsets of the fp16 scales in a block
GGUF_BLOCK = {"q4_k": (256, 144, (0, 2)), "q6_k": (256, 210, (208,))}


@pytest.mark.parametrize("t", CUDA_GEMV_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gemv_gguf_random_blocks_match_gguf_py(t: str, dtype: torch.dtype) -> None:
    """Blocks of random bytes (every code, 6-bit scale and min, negative q6_k scales) with finite
    fp16 block scales, against gguf-py's dequantizer: the CUDA GEMV at M=1 with the table's shape
    and with forced shapes of several x rows per block (what ci/tune_gguf_gemv.py sweeps), the
    Triton GEMV after it; K with a partial last step, N not a multiple of any block's rows."""
    from gguf.quants import dequantize as gguf_dequantize

    from quantrt.backends.cuda import gguf_gemv
    from quantrt.backends.cuda.cupy_kernels import Launch, function

    B, T, d_offsets = GGUF_BLOCK[t]
    g = torch.Generator().manual_seed(7)
    for K, N in [(B * 3, 37), (B * 21, 45), (B * 40, 9)]:
        blocks = torch.randint(0, 256, (N, K // B, T), generator=g, dtype=torch.uint8)
        for off in d_offsets:
            d = (torch.rand(N, K // B, generator=g) * 0.02 - 0.01).half()
            blocks[:, :, off : off + 2] = d.view(torch.uint8).reshape(N, K // B, 2)
        qweight = blocks.reshape(N, -1)
        w = torch.from_numpy(gguf_dequantize(qweight.numpy(), gguf.GGMLQuantizationType[t.upper()]))
        w = w.reshape(N, K).double()
        canon = CanonicalWeight(parse_scheme(f"gguf-{t}"), N, K, {"qweight": qweight})
        bias = torch.randn(N, generator=g)
        layer = QuantLinear.from_canonical(
            canon,
            bias=bias.to(dtype),
            device="cuda",
            act_dtype=dtype,
            overrides=Overrides(kernel="cuda.gemv_gguf"),
        )
        assert layer.kernel_name == "cuda.gemv_gguf", layer.selection.explain()
        table = layer._state.layout
        forced = [
            gguf_gemv.GemvShape(8, r, xm, wp) for r, xm, wp in ((2, 4, 4), (1, 4, 2), (3, 2, 8), (1, 1, 1))
        ]
        for shape in (None, *forced):
            if shape is not None:  # every batch size on one forced launch shape
                fn = Launch(function(gguf_gemv.SOURCE, shape.expr(dtype, t), 0), gguf_gemv.ARGS)
                lay = dataclasses.replace(table, shapes=(shape,), launches=(fn,))
                layer._state = gguf_gemv.build(layer._kernel, lay, layer.layer_spec())
            for M in (1, 2, 3, 4, 7, 8):
                x = torch.randn(M, K, generator=g).to(dtype)
                ref = x.double() @ w.T + bias.to(dtype).double()
                y = layer(x.cuda())
                path = layer._kernel.strategy(layer._state, M)
                cuda = M <= layer._state.layout.shapes[-1].max_m
                assert path.startswith("cuda gemv" if cuda else "triton gemv"), (M, path)
                assert rel(y, ref) < TOL[dtype], (K, N, M, shape, path, rel(y, ref))


@pytest.mark.parametrize("t", ["q4_k", *BLOCK32_TYPES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mma_gguf_random_blocks_match_gguf_py(t: str, dtype: torch.dtype) -> None:
    """The GGUF types on the tensor-core kernel: random block bytes (every code and fifth bit,
    6-bit scale and min; any finite f16 field in bf16, weight-sized ones in fp16), against
    gguf-py's dequantizer, at every path (swapped tiles, the dense path in whole and in one-chunk
    slices, where q4_k's dequantizer's chunk parity picks the sub-block), N not a multiple of 64,
    K not of the 128-input chunk, bias and out=."""
    from gguf.quants import dequantize as gguf_dequantize

    from quantrt.backends.cuda import mma_wna16
    from quantrt.reference.gguf import random_blocks

    legacy = t.endswith(("_0", "_1"))
    shapes = [(32 * 21, 37, 1), (32 * 165, 200, 2)] if legacy else [(256 * 3, 37, 1), (256 * 21, 200, 2)]
    for K, N, seed in shapes:
        qweight = random_blocks(t, N, K, seed=seed, sane=dtype == torch.float16)
        w = (
            torch.from_numpy(gguf_dequantize(qweight.numpy(), gguf.GGMLQuantizationType[t.upper()]))
            .reshape(N, K)
            .double()
        )
        canon = CanonicalWeight(parse_scheme(f"gguf-{t}"), N, K, {"qweight": qweight})
        bias = torch.randn(N)
        layer = QuantLinear.from_canonical(
            canon,
            bias=bias.to(dtype),
            device="cuda",
            act_dtype=dtype,
            overrides=Overrides(kernel=MMA_KERNEL[t]),
        )
        whole = layer._state
        for slices in (None, 1):
            if slices:
                lay = dataclasses.replace(whole.layout, slice_chunks=slices)
                layer._state = mma_wna16.build(layer._kernel, lay, layer.layer_spec())
            for M in (1, 3, 8, 16, 33, 64, 300):
                x = torch.randn(M, K).to(dtype)
                ref = x.double() @ w.T + bias.to(dtype).double()
                path = layer._kernel.strategy(layer._state, M)
                y = layer(x.cuda())
                assert rel(y, ref) < TOL[dtype], (K, N, M, path, rel(y, ref))
                out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
                assert layer(x.cuda(), out=out).data_ptr() == out.data_ptr()
                assert rel(out, ref) < TOL[dtype], (M, path)


@pytest.mark.parametrize(
    "scheme,m",
    [
        ("w4a16-nvfp4", 1),
        ("w4a16-mxfp4", 16),
        ("w4a16-nf4-g64", 1),
        ("gguf-q4_k", 1),
        ("gguf-q8_0", 4),
        ("gguf-q6_k", 1),
        ("gguf-q4_0", 1),
        ("gguf-q5_k", 16),
        ("w4a16-nvfp4", 300),
    ],
)
def test_cuda_graph_replay_equals_eager(scheme: str, m: int) -> None:
    layer, _, _ = build(scheme, 4096, 4096, torch.bfloat16, seed=1)
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(y, layer(x)) < 1e-3


@pytest.mark.parametrize("scheme", ["w4a16-nvfp4", "w4a16-mxfp4", "w4a16-nf4-g64", "gguf-q4_k", "gguf-q5_k"])
def test_small_batches_compile_fullgraph(scheme: str) -> None:
    torch._dynamo.reset()  # the lambda below is one code object for every case: its recompiles add up
    layer, canon, bias = build(scheme, 512, 256, torch.bfloat16, seed=5)
    for m in (1, 3):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        ref = reference.linear(x, canon, bias, out_dtype=torch.float32)
        compiled = torch.compile(lambda t: layer(t), fullgraph=True)
        assert rel(compiled(x), ref) < TOL[torch.bfloat16], m
