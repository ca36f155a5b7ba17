"""A fused layer whose slices differ in type (llama.cpp's Q4_K_M stores v_proj as Q6_K beside
Q4_K q/k, in tests/fixtures/gguf written by llama.cpp's own quantizer): one kernel per run of
equal schemes, outputs concatenated, as one rank and as two."""

from __future__ import annotations

from pathlib import Path

import torch

from quantrt.checkpoint import open_checkpoint
from quantrt.layers import SlicedLinear

FILE = Path(__file__).resolve().parents[1] / "fixtures" / "gguf" / "tiny-llama-Q4_K_M.gguf"
QKV = [f"model.layers.0.self_attn.{n}_proj" for n in "qkv"]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def test_mixed_types_fuse_slice_by_slice() -> None:
    ck = open_checkpoint(FILE)
    schemes = [str(ck.layers[p].scheme) for p in QKV]
    assert schemes == ["gguf-q4_k", "gguf-q4_k", "gguf-q6_k"]
    x = torch.randn(3, ck.layers[QKV[0]].K, generator=torch.Generator().manual_seed(0))
    separate = torch.cat([ck.linear(p, act_dtype=torch.float32)(x) for p in QKV], dim=-1)
    fused = ck.linear(QKV, act_dtype=torch.float32)
    assert isinstance(fused, SlicedLinear) and len(fused.parts) == 2
    assert rel(fused(x), separate) < 1e-6
    ranks = [ck.linear(QKV, act_dtype=torch.float32, parallel="column", tp_rank=r, tp_size=2) for r in (0, 1)]
    outs = [r(x) for r in ranks]
    sizes = [ck.layers[p].N // 2 for p in QKV]
    halves = [torch.split(o, sizes, dim=-1) for o in outs]
    y = torch.cat([torch.cat([halves[0][i], halves[1][i]], dim=-1) for i in range(3)], dim=-1)
    assert rel(y, separate) < 1e-6
