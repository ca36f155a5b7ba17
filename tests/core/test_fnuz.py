"""MI300's e4m3fnuz flavour: OCP e4m3 codes re-read as fnuz hold half the value, code for code what
torch's own float8_e4m3fnuz conversion gives; static activations saturate where e4m3's do."""

from __future__ import annotations

import pytest
import torch

from quantrt.torchops import fp8_as_fnuz, quantize_fp8


def test_every_code_equals_torch_conversion_of_half_the_value() -> None:
    ocp = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ours = fp8_as_fnuz(ocp)
    want = (ocp.float() / 2).to(torch.float8_e4m3fnuz)
    assert ours.dtype == torch.float8_e4m3fnuz
    assert torch.equal(ours.view(torch.uint8), want.view(torch.uint8))
    finite = ~ocp.float().isnan()
    assert torch.equal(ours.float()[finite] * 2, ocp.float()[finite])  # exact: one exponent step
    assert ours.view(torch.uint8)[0x80] == 0  # e4m3's -0 is fnuz's NaN: stored as +0


def test_refuses_other_types() -> None:
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_as_fnuz(torch.zeros(3, dtype=torch.float8_e5m2))


def test_static_saturation_matches_the_ocp_grid() -> None:
    """A static scale doubled for fnuz: values past the calibrated range clamp at 224 (e4m3's 448
    halved), not at fnuz's own 240, so the dequantized activations equal the OCP reference's."""
    x = torch.tensor([[0.3, -5.0, 100.0, -1000.0]])
    s = torch.tensor(0.5)
    ocp = quantize_fp8(x, torch.float8_e4m3fn, s).float() * s
    fnuz = quantize_fp8(x, torch.float8_e4m3fnuz, s * 2, 448.0 / 2).float() * (s * 2)
    assert torch.equal(ocp, fnuz)
    assert not torch.equal(quantize_fp8(x, torch.float8_e4m3fnuz, s * 2).float() * (s * 2), ocp)
