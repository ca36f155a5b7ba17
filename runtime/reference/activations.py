"""Activation quantization as the scheme's kernels see it: quantize, then dequantize to fp32.

Scales are multipliers found in fp32: ``s = amax / qmax`` (127 for int8, 448 for fp8 e4m3) per
token, per tensor, or per token and group of ``act_group`` channels (a ragged last group has its
own scale); ``s = 1`` where amax is 0, so all-zero rows stay zero. int8 codes are
``round-half-even(x / s)`` clamped to [-128, 127]; fp8 codes are the cast of ``x / s`` after
saturating it to ±448 (static scales can be exceeded). nvfp4 is delegated to :mod:`.fp4`.
"""

from __future__ import annotations

import torch

from ..canonical import CanonicalWeight
from ..errors import ReferenceInputError
from ..schemes import Scheme
from .fp8 import fp8_max, to_fp8

_QMAX = {"int8": 127.0, "fp8_e4m3": fp8_max(torch.float8_e4m3fn)}


def _safe_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def _fake(x: torch.Tensor, s: torch.Tensor, act: str) -> torch.Tensor:
    if act == "int8":
        return torch.round(x / s).clamp(-128, 127) * s
    return to_fp8(x / s, torch.float8_e4m3fn).to(torch.float32) * s


def _per_group(x: torch.Tensor, group: int, act: str) -> torch.Tensor:
    M, K = x.shape
    ng = -(-K // group)
    padded = torch.nn.functional.pad(x, (0, ng * group - K)).view(M, ng, group)
    s = _safe_scale(padded.abs().amax(dim=2, keepdim=True), _QMAX[act])
    return _fake(padded, s, act).view(M, ng * group)[:, :K]


def fake_quantize(x: torch.Tensor, weight: CanonicalWeight) -> torch.Tensor:
    """Activations [M, K] quantized and dequantized exactly as ``weight.scheme`` says (fp32 out).

    Weight-only schemes return the activations unchanged (as fp32).
    """
    scheme = weight.scheme
    if x.dim() != 2 or x.shape[1] != weight.K:
        raise ReferenceInputError(f"activations for {scheme} must be [M, {weight.K}], found {list(x.shape)}")
    x = x.to(torch.float32)
    act = scheme.act
    if act is None or x.numel() == 0:
        return x
    if act == "nvfp4":
        from .fp4 import fake_quantize_nvfp4_activations

        gs = weight.get("input_global_scale")
        if gs is None:
            raise ReferenceInputError(f"{scheme}: nvfp4 activations need the input_global_scale tensor")
        return fake_quantize_nvfp4_activations(x, gs)
    if act not in _QMAX:
        raise ReferenceInputError(f"{scheme}: unknown activation type {act!r}")
    gran = scheme.act_granularity
    if gran == "token_group":
        assert scheme.act_group is not None
        return _per_group(x, scheme.act_group, act)
    if gran == "token":
        s = _safe_scale(x.abs().amax(dim=1, keepdim=True), _QMAX[act])
    elif scheme.act_dynamic:
        s = _safe_scale(x.abs().amax(), _QMAX[act])
    else:
        s = weight.get("input_scale")
        if s is None:
            raise ReferenceInputError(
                f"{scheme}: static activations need the input_scale tensor (make it from calib)"
            )
        s = s.to(torch.float32).amax()  # per-slice scales not yet reduced at load: their max, as vLLM
    return _fake(x, s, act)


def static_input_scales(scheme: Scheme, calib: torch.Tensor | None, K: int) -> dict[str, torch.Tensor]:
    """The static per-tensor activation scale ``{"input_scale": fp32 [1]} = amax(calib) / qmax``."""
    if scheme.act is None or scheme.act_dynamic:
        raise ReferenceInputError(f"{scheme} has no static activation scale")
    if scheme.act not in _QMAX:
        raise ReferenceInputError(
            f"{scheme}: static scales are defined for int8 and fp8 activations, not {scheme.act}"
        )
    if calib is None:
        raise ReferenceInputError(
            f"{scheme} has static activation scales: pass calib activations [M, {K}] to set input_scale"
        )
    if calib.dim() < 1 or calib.shape[-1] != K or calib.numel() == 0:
        raise ReferenceInputError(
            f"{scheme}: calib activations must be [..., {K}], found {list(calib.shape)}"
        )
    c = calib.detach().to(torch.float32)
    if not bool(torch.isfinite(c).all()):
        raise ReferenceInputError(f"{scheme}: calib activations hold NaN or infinite values")
    s = _safe_scale(c.abs().amax(), _QMAX[scheme.act])
    return {"input_scale": s.reshape(1)}
