"""The NVIDIA wrappers of the FP4/NF4 and GGUF Triton kernels (backends/cuda/triton_lut4.py,
triton_gguf.py) under the CPU interpreter: what ``prepare`` makes of canonical tensors (bnb's
high-nibble-first flat blocks cut into rows, double quant resolved, NVFP4's per-slice global
scale, NaN scale codes refused), every strategy ``apply`` picks (GEMV, tiles, dequant + cuBLAS in
one or several slices, ``out=``) against the fp32 reference, and the supports() reasons."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import CudaTritonBnb4, CudaTritonFp4, CudaTritonGGUF
from quantrt.backends.triton import dense_slices
from quantrt.backends.triton import gguf_kernel as triton_gguf
from quantrt.backends.triton import lut4_kernel as triton_lut4
from quantrt.capability import load_preset
from quantrt.specs import LayerSpec

DT = torch.float16  # the interpreter's bf16 dots are wrong; bf16 runs in tests/gpu
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def make(scheme: str, N: int, K: int, sizes: tuple[int, ...] = ()):
    w = torch.randn(N, K) * 0.05
    w[:, torch.randint(0, K, (2,))] *= 5
    canon = reference.quantize(w, scheme, calib=torch.randn(8, K), output_sizes=sizes or (N,)).to(DEV)
    spec = LayerSpec(canon.scheme, K, N, act_dtype=DT, output_sizes=sizes)
    if scheme.startswith("gguf"):
        kernel = CudaTritonGGUF()
    elif "nf4" in scheme or "bnb" in scheme:
        kernel = CudaTritonBnb4()
    else:
        kernel = CudaTritonFp4()
    return kernel, kernel.prepare(canon, spec), canon


def with_slices(kernel, state, canon, rows: int):
    """``state`` with its dense strategy (the last) dequantizing ``rows`` rows per cuBLAS call."""
    module = triton_gguf if isinstance(kernel, CudaTritonGGUF) else triton_lut4
    dense = dense_slices.dense_strategy(rows, canon.N, module._dequant)
    strategies = [*state.strategies[:-1], *dense_slices.in_act_dtype([dense], DT, DT)]
    spec = LayerSpec(canon.scheme, canon.K, canon.N, act_dtype=DT)
    return kernel.prepared(state.layout, strategies, spec, state.device, rows=state.rows)


CASES = [
    ("w4a16-nvfp4", 320, (40, 32)),  # two fused slices, each with its own global scale
    ("w4a16-mxfp4", 288, ()),
    ("w4a16-nf4-g64", 256, ()),
    ("w4a16-nf4-g64-dq", 320, (48, 24)),  # one nested offset per slice
    ("w4a16-bnbfp4-g64-dq", 192, ()),
    ("w4a4-nvfp4", 256, ()),  # the weight-only substitute
    ("gguf-q4_0", 32 * 9, ()),
    ("gguf-q6_k", 512, ()),
]


@pytest.mark.parametrize("scheme,K,sizes", CASES, ids=lambda v: str(v))
def test_every_strategy_matches_reference(scheme: str, K: int, sizes: tuple[int, ...]) -> None:
    N = sum(sizes) or 72
    kernel, state, canon = make(scheme, N, K, sizes)
    bias = torch.randn(N).to(DEV, DT)
    seen = set()
    for m in (0, 1, 3, 70):
        x = torch.randn(m, 2 * K)[:, ::2].to(DEV, DT)  # not contiguous
        y = kernel.apply(state, x, bias)
        assert y.shape == (m, N) and y.dtype == DT
        seen.add(kernel.strategy(state, m).split()[0])
        if m:
            ref = reference.linear(x, canon, bias, out_dtype=torch.float32, weight_only=True)
            assert rel(y, ref) < 2e-3, (m, kernel.strategy(state, m), rel(y, ref))
    assert "dequant+cuBLAS" in seen and ("gemv" in seen), seen
    # the dense path in several row slices, into a caller's buffer
    sliced = with_slices(kernel, state, canon, 32)
    x = torch.randn(70, K).to(DEV, DT)
    out = torch.full((70, N), float("nan"), dtype=DT, device=DEV)
    y = kernel.apply(sliced, x, bias, out=out)
    ref = reference.linear(x, canon, bias, out_dtype=torch.float32, weight_only=True)
    assert y.data_ptr() == out.data_ptr() and rel(out, ref) < 2e-3
    assert "slices of 32" in kernel.strategy(sliced, 70)


@pytest.mark.parametrize("gtype,K", [("q6_k", 512), ("q8_0", 32 * 9)])
def test_gguf_table_routes_mid_batches_to_the_fused_gemm(gtype: str, K: int, monkeypatch) -> None:
    """A table with a ``gemm_max_m`` for the type: batches above the GEMV's bound up to it take the
    fused GEMM (its tile per M bucket, this type's row over the default), larger ones dequant +
    cuBLAS; a type the table leaves out never takes it."""
    from quantrt.backends.triton import tile_table

    real = tile_table.load

    def load(package: str, name: str, arch: str) -> dict:
        doc = real(package, name, arch)
        if name != "gguf":
            return doc
        tile = {"block_m": 16, "block_n": 32, "block_k": 64, "num_warps": 4, "num_stages": 2}
        return {
            **doc,
            "gemm": {"16": tile, "64": {**tile, "block_m": 32}},
            "gemm_types": {gtype: {"large": {**tile, "block_m": 64, "block_n": 16}}},
            "gemm_max_m": {gtype: 40},
        }

    monkeypatch.setattr(tile_table, "load", load)
    kernel, state, canon = make(f"gguf-{gtype}", 40, K)
    assert state.layout.gemm_max_m == 40 and state.layout.gemv_max_m < 9
    assert kernel.strategy(state, 9).startswith("fused gemm BM16 BN32 BK64")
    assert kernel.strategy(state, 40).startswith("fused gemm BM32")
    assert kernel.strategy(state, 41).startswith("dequant+cuBLAS")
    bias = torch.randn(40).to(DEV, DT)
    for m in (9, 40, 41):
        x = torch.randn(m, 2 * K)[:, ::2].to(DEV, DT)
        ref = reference.linear(x, canon, bias, out_dtype=torch.float32, weight_only=True)
        assert rel(kernel.apply(state, x, bias), ref) < 2e-3, (m, kernel.strategy(state, m))
    other = "q4_0" if gtype != "q4_0" else "q8_0"
    _, state2, _ = make(f"gguf-{other}", 40, 32 * 8)
    assert state2.layout.gemm_max_m == 0 and kernel.strategy(state2, 9).startswith("dequant+cuBLAS")


def test_bnb_rows_are_low_nibble_first_and_absmax_resolved() -> None:
    _, prepared, canon = make("w4a16-nf4-g64-dq", 16, 128)
    state = prepared.layout
    assert (
        state.codes.shape == (16, 64)
        and state.scales.shape == (16, 2)
        and state.scales.dtype == torch.float32
    )
    flat = canon["qweight"]  # high nibble = even element over the flattened weight
    assert int(state.codes[0, 0] & 0xF) == int(flat[0] >> 4) and int(state.codes[0, 0] >> 4) == int(
        flat[0] & 0xF
    )
    w = reference.dequantize(canon)
    code = canon["code"]
    c0 = state.codes[:, 0:1] & 0xF  # element (n, 0)
    assert torch.equal(code[c0.long()].view(16) * state.scales[:, 0], w[:, 0])


@pytest.mark.parametrize("scheme,bad", [("w4a16-nvfp4", 0x7F), ("w4a16-mxfp4", 255)])
def test_nan_scale_codes_are_refused_at_load(scheme: str, bad: int) -> None:
    w = torch.randn(32, 64)
    canon = reference.quantize(w, scheme).to(DEV)
    sc = canon["scales"].view(torch.uint8).clone()
    sc[3, 1] = bad
    canon.tensors["scales"] = sc.view(canon["scales"].dtype)
    spec = LayerSpec(canon.scheme, 64, 32, act_dtype=DT)
    with pytest.raises(ValueError, match="NaN"):
        CudaTritonFp4().prepare(canon, spec)


def test_supports_reasons() -> None:
    h200 = load_preset("h200").accelerators[0]
    a100 = load_preset("a100").accelerators[0]

    def spec(s: str, K: int = 4096, **kw):
        from quantrt.schemes import parse_scheme

        return LayerSpec(parse_scheme(s), K, 4096, **kw)

    assert CudaTritonFp4.supports(spec("w4a16-nvfp4"), h200) and CudaTritonFp4.supports(
        spec("w4a16-mxfp4"), a100
    )
    assert CudaTritonFp4.is_substitute(spec("w4a4-nvfp4")) and not CudaTritonFp4.is_substitute(
        spec("w4a16-nvfp4")
    )
    v = CudaTritonBnb4.supports(spec("w4a16-nf4-g64", K=4160 + 32), h200)
    assert not v and "blocksize" in v.reason
    v = CudaTritonGGUF.supports(spec("gguf-q4_k", act_dtype=torch.float32), h200)
    assert not v and "activations (bfloat16, float16)" in v.reason
    assert CudaTritonGGUF.supports(spec("gguf-q2_k"), h200)
    assert not CudaTritonFp4.supports(spec("w4a16-nf4-g64"), h200)
