"""cuda.mma_w2w3's operands on the CPU: 2- and 3-bit codes widened to nibbles, decoded the way the
int4 kernel decodes them (magic + q less the biased zero point, times the scale, in the activation
dtype), give the reference's weights; the kernel takes 2/3-bit weight-only layouts only."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.mma_narrow import CudaMmaNarrow, narrow_operands
from quantrt.backends.cuda.wna16_layout import magic
from quantrt.capability import load_preset
from quantrt.packing import unpack_codes
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec


@pytest.mark.parametrize(
    "scheme", ["w3a16-int-g128-asym", "w3a16-int-g128-sym", "w2a16-int-g128-asym", "w2a16-int-g64-sym"]
)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=str)
def test_widened_operands_decode_to_the_reference(scheme: str, act: torch.dtype) -> None:
    N, K = 72, 384  # N past one 64-column padding unit
    g = torch.Generator().manual_seed(len(scheme))
    canon = reference.quantize(torch.randn(N, K, generator=g), scheme)
    s = canon.scheme
    codes, sz, col, book = narrow_operands(canon, s.group_size, act)
    assert col is None and book is None and codes.shape == (N, K // 2)
    q = unpack_codes(codes, 4, K).long()
    assert torch.equal(q, unpack_codes(canon["qweight"], s.bits, K).long())  # the same codes, as nibbles
    assert int(q.max()) < 1 << s.bits
    # the kernel's decode: (magic + q - zb) * s in the activation dtype, zb and s from the pair
    pair = sz.view(torch.int32).view(act).reshape(sz.shape[0], sz.shape[1], 2)  # [groups, Npad, (zb, s)]
    gi = torch.arange(K) // s.group_size
    zb, sc = pair[gi, :N, 0].t().double(), pair[gi, :N, 1].t().double()  # [N, K]
    v = magic(4, act) + q.double()  # exact in the activation dtype
    got = ((v - zb).to(act) * sc.to(act)).to(torch.float32)
    want = reference.dequantize(canon).to(act).to(torch.float32)
    assert torch.allclose(got, want, rtol=2**-7, atol=0), (got - want).abs().max()


def test_takes_two_and_three_bit_weight_only_only() -> None:
    caps = load_preset("h100").default_device

    def ok(name: str) -> bool:
        return CudaMmaNarrow.can_implement(LayerSpec(parse_scheme(name), 512, 256), caps).ok

    assert ok("w3a16-int-g128-asym") and ok("w2a16-int-g64-sym")
    assert not ok("w4a16-int-g128-asym") and not ok("w8a16-int-ch-sym")
    v = CudaMmaNarrow.can_implement(LayerSpec(parse_scheme("w4a16-int-g128-sym"), 512, 256), caps)
    assert "2- or 3-bit integer weights" in v.reason
