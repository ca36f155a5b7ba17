"""The host side of ``cuda.gemv_gguf`` (backends/cuda/gguf_gemv.py) without a GPU: which layers it
takes on the H200 preset and why it declines the others, and how its launch table is read (warps
capped at K's steps, malformed rows refused with the type and the row)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantrt.backends.cuda import gguf_gemv
from quantrt.backends.cuda.gguf_gemv import CudaGemvGGUF, GemvShape, shapes_for
from quantrt.backends.triton import tile_table
from quantrt.capability import load_preset
from quantrt.dispatch import select
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec


def spec(t: str, K: int = 4096, N: int = 4096) -> LayerSpec:
    return LayerSpec(parse_scheme(f"gguf-{t}"), K, N)


def test_h200_plans_it_for_q6_k_and_q4_k_goes_to_the_tensor_core_kernel() -> None:
    caps = load_preset("h200")
    assert select(spec("q6_k"), "cuda:0", caps).kernel.name == "cuda.gemv_gguf"
    sel = select(spec("q4_k"), "cuda:0", caps)
    assert sel.kernel.name == "cuda.mma_gguf", sel.explain()
    assert "cuda.gemv_gguf" in sel.explain()  # the GEMV still supports it, ranked after


@pytest.mark.parametrize("t", ["q6_k", "q8_0", "q4_0", "q5_k"])
def test_the_tensor_core_kernels_take_q4_k_and_q8_0_only_and_say_why(t: str) -> None:
    from quantrt.backends.cuda.mma_gguf import CudaMmaGGUF, CudaMmaGGUFQ8

    gpu = load_preset("h200").device("cuda:0")
    for kernel, own in ((CudaMmaGGUF, "q4_k"), (CudaMmaGGUFQ8, "q8_0")):
        v = kernel.supports(spec(t), gpu)
        if t == own:
            assert v, v.predicate
        else:
            assert not v and v.predicate == f"GGUF {own} weights" and dict(v.values) == {"gguf_type": t}


@pytest.mark.parametrize("t", ["q8_0", "q4_0", "q5_k", "q2_k"])
def test_other_types_go_to_the_tensor_core_kernels_and_say_why(t: str) -> None:
    caps = load_preset("h200")
    v = CudaGemvGGUF.supports(spec(t), caps.device("cuda:0"))
    assert not v and v.predicate == "GGUF type one of q4_k, q6_k" and dict(v.values) == {"gguf_type": t}
    want = "cuda.mma_gguf_q8" if t == "q8_0" else "cuda.mma_gguf_blocks"
    assert select(spec(t), "cuda:0", caps).kernel.name == want


def test_q6_k_stays_with_the_gemv_ahead_of_the_tensor_core_kernel() -> None:
    """q6_k's 8-bit tensor-core layout streams at 49-73% of copy at M=1 against the GEMV's 72-88%
    (docs/performance.md): the GEMV ranks first, the tensor-core kernel is there by name."""
    caps = load_preset("h200")
    sel = select(spec("q6_k"), "cuda:0", caps)
    assert sel.kernel.name == "cuda.gemv_gguf" and "cuda.mma_gguf_blocks" in sel.explain()


def test_without_cupy_it_declines_with_the_reason() -> None:
    caps = load_preset("h200")
    gpu = caps.device("cuda:0")
    gpu = dataclasses.replace(gpu, libraries=gpu.libraries - {"cupy"})
    v = CudaGemvGGUF.supports(spec("q4_k"), gpu)
    assert not v and "cupy importable" in v.predicate
    caps = dataclasses.replace(caps, accelerators=(gpu,))
    assert select(spec("q4_k"), "cuda:0", caps).kernel.name == "cuda.triton_gguf"


def test_warps_are_capped_at_the_steps_of_k() -> None:
    doc = {"gemv": {"1": {"rows": 4, "xm": 1, "warps": 8}, "4": {"rows": 2, "xm": 4, "warps": 2}}}
    # q4_k: 1024 weights per warp step, so K=2048 has two steps; q6_k: 2048, K=2048 has one
    assert shapes_for(doc, "q4_k", 2048) == (GemvShape(1, 4, 1, 2), GemvShape(4, 2, 4, 2))
    assert shapes_for(doc, "q6_k", 2048) == (GemvShape(1, 4, 1, 1), GemvShape(4, 2, 4, 1))
    assert shapes_for(doc, "q4_k", 1024 * 20) == (GemvShape(1, 4, 1, 8), GemvShape(4, 2, 4, 2))


@pytest.mark.parametrize(
    "row",
    [{"rows": 0, "xm": 1, "warps": 1}, {"rows": 8, "xm": 8, "warps": 1}, {"rows": 1, "xm": 1, "warps": 9}],
)
def test_malformed_rows_are_refused(row: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=r"bad shape for q4_k up to M=1"):
        shapes_for({"gemv": {"1": row}}, "q4_k", 4096)


def test_the_committed_table_reads_for_every_type() -> None:
    doc = tile_table.load("quantrt.backends.cuda", gguf_gemv.TABLE, "default")
    for t in gguf_gemv.TYPE_ID:
        shapes = shapes_for(doc, t, 8192)
        assert shapes and [s.max_m for s in shapes] == sorted(s.max_m for s in shapes)
        assert (
            shapes[0].expr(torch.bfloat16, t).startswith(f"gguf_gemv<__nv_bfloat16, {gguf_gemv.TYPE_ID[t]}, ")
        )
