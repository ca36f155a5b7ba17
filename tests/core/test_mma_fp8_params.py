"""cuda.mma_fp8's operands on the CPU: the kernel's fp8 bit placement (its constants read from the
CUDA source) gives every finite code's value in bf16 and fp16, as torch's own fp8 conversion does;
the scales reach the kernel's [group, column] table as stored; the kernel takes what it can run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda import mma_wna16
from quantrt.backends.cuda.mma_fp8 import CODES, CudaMmaFp8, fp8_operands
from quantrt.capability import load_preset
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec

SOURCE = Path(mma_wna16.__file__).parent / "kernels" / "wna16_common.cuh"
CT = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
FP8 = {"F8E4": torch.float8_e4m3fn, "F8E5": torch.float8_e5m2}


def kernel_constants(act: torch.dtype, code: str) -> tuple[int, int]:
    """(SHIFT, LIFT2) of ``Fp8Bits<act, code>`` as the kernel source states them."""
    src = SOURCE.read_text()
    m = re.search(
        rf"struct Fp8Bits<{CT[act]}, {code}> \{{\s*static constexpr int SHIFT = (\d+);\s*"
        rf"static constexpr u32 LIFT2 = (0x[0-9A-Fa-f]+|0)u?;",
        src,
    )
    assert m, (act, code)
    return int(m.group(1)), int(m.group(2), 16) if m.group(2).startswith("0x") else 0


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("code", ["F8E4", "F8E5"])
def test_bit_placement_gives_every_finite_code(act: torch.dtype, code: str) -> None:
    shift, lift2 = kernel_constants(act, code)
    assert lift2 == 0 or lift2 >> 16 == lift2 & 0xFFFF  # the same factor in both halves
    b = torch.arange(256, dtype=torch.int32)
    want = b.to(torch.uint8).view(FP8[code]).double()
    finite = torch.isfinite(want)
    bits = ((b & 0x7F) << shift) | ((b & 0x80) << 8)  # fp8_pair, one half
    placed = bits.to(torch.int16).view(act).double()
    lift = (
        1.0
        if lift2 == 0
        else torch.tensor(lift2 & 0xFFFF, dtype=torch.int32).to(torch.int16).view(act).double()
    )
    got = placed * lift  # the kernel's one multiply: exact, the product has the code's few bits
    assert torch.equal(got[finite], want[finite])
    assert finite.sum() >= 248  # only e4m3fn's two NaN and e5m2's infinities and six NaN are left out
    zero = (b & 0x7F) == 0
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero]))  # -0 stays -0


def test_code_enum_names_fp8() -> None:
    assert CODES == {"fp8_e4m3": mma_wna16.F8E4, "fp8_e5m2": mma_wna16.F8E5}
    assert mma_wna16.code_bits(mma_wna16.F8E4) == 8 and mma_wna16.folds(mma_wna16.F8E5, 8)
    assert mma_wna16.sz_bytes(torch.bfloat16, mma_wna16.F8E4) == 4


@pytest.mark.parametrize("scheme", ["w8a16-fp8-block128", "w8a16-fp8e5m2-ch", "w8a16-fp8-tensor"])
def test_scales_reach_the_kernel_table_as_stored(scheme: str) -> None:
    """N and K ragged against the 128 blocks and the 64-input chunks: every weight's scale at
    [its group, its column], zeros past N and K."""
    N, K = 200, 300
    g = torch.Generator().manual_seed(3)
    canon = reference.quantize(torch.randn(N, K, generator=g), scheme)
    codes, sz, col, book = fp8_operands(canon, None, torch.bfloat16)
    assert col is None and book is None and sz.dtype == torch.float32
    assert torch.equal(codes, canon["qweight"].view(torch.uint8))
    s = canon["scales"].float()
    k = torch.arange(K)
    n = torch.arange(N)
    if canon.scheme.granularity == "block":
        assert sz.shape == (-(-320 // 128), 256)  # K padded to 5 chunks of 64; N to 64 columns
        want = s[n[:, None] // 128, k[None, :] // 128]  # [N, K]
        got = sz[k[None, :] // 128, n[:, None]]
    else:
        assert sz.shape == (1, 256)
        want = s.reshape(-1).expand(N) if s.numel() == 1 else s.reshape(N)
        got = sz[0, :N]
    assert torch.equal(got, want)
    assert not sz[:, N:].any()


def test_can_implement_states_each_reason() -> None:
    h200 = load_preset("h200").default_device
    a100 = load_preset("a100").default_device

    def verdict(name: str, caps, K: int = 512):
        return CudaMmaFp8.can_implement(LayerSpec(parse_scheme(name), K, 256, act_dtype=torch.bfloat16), caps)

    assert verdict("w8a16-fp8-block128", h200).ok
    assert verdict("w8a16-fp8e5m2-tensor", h200).ok
    assert "fp8 matrix units run W8A8 natively" in verdict("w8a8-fp8-ch", h200).reason
    assert verdict("w8a8-fp8-ch", a100).ok and CudaMmaFp8.is_substitute(
        LayerSpec(parse_scheme("w8a8-fp8-ch"), 512, 256)
    )
    assert "fp8 weights" in verdict("w8a16-int-ch-sym", h200).reason
    v = CudaMmaFp8.can_implement(
        LayerSpec(parse_scheme("w8a16-fp8-block128"), 512, 256, act_dtype=torch.bfloat16, K_part=448), h200
    )
    assert not v.ok and "K cut on block boundaries" in v.reason
