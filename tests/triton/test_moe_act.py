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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["silu", "swigluoai"])
@pytest.mark.parametrize("A,inter,group", [(1, 128, 128), (4, 300, 128), (3, 96, 32)])
def test_gated_group_quant_is_activation_then_group_quant(
    kind: str, dtype: torch.dtype, A: int, inter: int, group: int
) -> None:
    """The fused launch gives the codes and scales of the activation (rounded to h's dtype) through
    ``quantize_per_token_group``, bit for bit (a ragged last group included), and dequantizes to the
    reference's per-group fake quantization of the torch activation."""
    from quantrt.backends.triton.act_quant import quantize_per_token_group
    from quantrt.backends.triton.moe_act import gated_group_quant
    from quantrt.reference.activations import _per_group

    g = torch.Generator().manual_seed(A * 100 + inter + group + len(kind))
    act = Activation(kind, alpha=1.5, limit=2.5)
    wide = (torch.randn(A, 2 * inter + 5, generator=g) * 3).to(DEV, dtype)
    h = wide[:, : 2 * inter]
    h[0, :group] = 0.0  # an all-zero group (gate zero): scale 1
    q, s = gated_group_quant(h, act.kind, group, act.alpha, act.limit)
    q2, s2 = quantize_per_token_group(gated_activation(h, act.kind, act.alpha, act.limit), group)
    ng = -(-inter // group)
    assert q.shape == (A, inter) and q.dtype == torch.float8_e4m3fn and s.shape == (A, ng)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    assert float(s[0, 0]) == 1.0
    deq = (q.float() * s.repeat_interleave(group, dim=1)[:, :inter]).cpu()
    ref = _per_group(act(h).to(dtype).float().cpu(), group, "fp8_e4m3")
    torch.testing.assert_close(deq, ref, rtol=0.07, atol=1e-3)
