"""The one-launch gated activation (``backends/triton/moe_act.py``) against the layer's torch
:class:`quantrt.moe.activation.Activation` (the definition), every kind, fp16 and fp32 (the
interpreter's dtypes; the GPU run adds bf16 through tests/gpu/test_moe_cuda.py's whole layers),
widths off the block, strided rows, A = 0."""

from __future__ import annotations

import pytest
import torch

from quantrt.backends.triton.moe_act import gated_activation
from quantrt.moe.activation import Activation

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh", "swigluoai"])
@pytest.mark.parametrize("A,inter", [(1, 7), (5, 96), (3, 1500)])
def test_matches_torch_activation(kind: str, dtype: torch.dtype, A: int, inter: int) -> None:
    g = torch.Generator().manual_seed(A * 1000 + inter + len(kind))
    act = Activation(kind, alpha=1.5, limit=2.5)
    wide = (torch.randn(A, 2 * inter + 3, generator=g) * 4).to(DEV, dtype)
    h = wide[:, : 2 * inter]  # rows strided past the width
    y = gated_activation(h, act.kind, act.alpha, act.limit)
    ref = act(h)
    assert y.shape == (A, inter) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y.float().cpu(), ref.float().cpu(), rtol=tol, atol=tol)
    if kind == "swigluoai":  # the clamps bite: values past the limit exist
        assert (h.abs() > act.limit).any()


def test_empty_and_bad_shapes() -> None:
    assert gated_activation(torch.empty(0, 8, device=DEV), "silu").shape == (0, 4)
    with pytest.raises(ValueError, match=r"\[A, 2I\]"):
        gated_activation(torch.randn(2, 5, device=DEV), "silu")
    with pytest.raises(ValueError, match="unknown kind"):
        gated_activation(torch.randn(2, 4, device=DEV), "relu")
