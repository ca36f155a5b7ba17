"""cuda.mma_fp8 on a real GPU: every finite fp8 code decodes to its value on each path (the
swapped tiles, a wider one, the dense dequantization), and the kernel is the one dispatch picks for
fp8 weight-only checkpoints."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.layers import QuantLinear

FP8 = {"w8a16-fp8-ch": torch.float8_e4m3fn, "w8a16-fp8e5m2-ch": torch.float8_e5m2}


@pytest.mark.parametrize("scheme", list(FP8))
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m", [1, 16, 300])
def test_every_code_decodes_to_its_value(scheme: str, act: torch.dtype, m: int) -> None:
    """Weights that hold every finite code (-0 and the subnormals too), one-hot x rows: each output
    is one code times its column's scale, rounded once to the activation dtype, exactly as torch's
    own fp8 conversion gives it."""
    dt = FP8[scheme]
    b = torch.arange(256, dtype=torch.uint8)
    codes = b[torch.isfinite(b.view(dt).float())]
    N, K = 64, 48
    w = codes[torch.arange(N * K) % len(codes)].reshape(N, K)
    canon = reference.quantize(torch.randn(N, K), scheme)
    canon.tensors["qweight"] = w.view(dt)
    g = torch.Generator().manual_seed(m)
    s = 0.25 + 0.75 * torch.rand(N, generator=g)  # fp16 keeps e5m2's largest code times the scale
    canon.tensors["scales"] = s.reshape(canon["scales"].shape).to(canon["scales"].dtype)
    layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=act)
    assert layer.kernel_name == "cuda.mma_fp8", layer.selection.explain()
    k = torch.arange(m) % K
    x = torch.zeros(m, K)
    x[torch.arange(m), k] = 1.0
    y = layer(x.to("cuda", act)).cpu()
    want = (w.view(dt).float()[:, k].t() * s[None, :]).to(act)  # [m, N]
    assert torch.equal(y, want), (y.float() - want.float()).abs().max()


@pytest.mark.parametrize(
    "scheme", ["w8a16-fp8-tensor", "w8a16-fp8-ch", "w8a16-fp8-block128", "w8a16-fp8e5m2-block128"]
)
def test_dispatch_picks_the_tensor_core_kernel(scheme: str) -> None:
    canon = reference.quantize(torch.randn(256, 512), scheme)
    layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
    assert layer.kernel_name == "cuda.mma_fp8", layer.selection.explain()
