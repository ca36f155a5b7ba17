"""Pure-torch references: the test oracle for every kernel and the last runtime fallback.

For every scheme family there is a module with ``quantize`` (round-to-nearest, dense fp32
[N, K] -> canonical tensors) and ``dequantize`` (canonical -> fp32 [N, K]). Activation
quantization follows the scheme exactly (:mod:`.activations`). ``linear`` is
dequantize-then-matmul in fp32: what every kernel is compared against.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ..canonical import CanonicalWeight
from ..errors import ReferenceInputError
from ..schemes import Scheme, parse_scheme


def family_module(scheme: Scheme) -> ModuleType:
    """The reference module that owns a scheme family's numerics."""
    fam = scheme.family
    if fam == "int":
        from . import intq as mod
    elif fam == "fp8":
        from . import fp8 as mod
    elif fam in ("nvfp4", "mxfp4"):
        from . import fp4 as mod
    elif fam == "bnb4":
        from . import bnb as mod
    elif fam == "gguf":
        from . import gguf as mod
    else:  # pragma: no cover
        raise AssertionError(fam)
    return mod


def quantize(
    w: torch.Tensor,
    scheme: Scheme | str,
    *,
    calib: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    search: str | None = None,
) -> CanonicalWeight:
    """Round-to-nearest quantization of a dense [N, K] weight into canonical tensors.

    ``calib``: activations [M, K] to set static activation scales (required by static schemes).
    ``g_idx``: act-order group index per input channel (made from column norms when omitted).
    ``output_sizes``: slice widths of a fused layer (per-slice tensor scales).
    ``search="mse"``: integer schemes with group or channel scales pick each group's range by least
    squared error first (``quantrt.reference.intq``).
    """
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D [N, K] weight, found shape {list(w.shape)}")
    N, K = w.shape
    sizes = tuple(output_sizes) or (N,)
    w = w.detach().to(torch.float32)
    extra = {}
    if search is not None:
        if scheme.family != "int":
            raise ReferenceInputError(f"quantize {scheme}: search={search!r} covers integer schemes only")
        extra["search"] = search
    tensors = family_module(scheme).quantize(w, scheme, g_idx=g_idx, output_sizes=sizes, calib=calib, **extra)
    if scheme.act is not None and not scheme.act_dynamic:
        from .activations import static_input_scales

        tensors.update(static_input_scales(scheme, calib, K))
    return CanonicalWeight(scheme, N, K, tensors, sizes)


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """The fp32 [N, K] weight the canonical tensors stand for."""
    return family_module(weight.scheme).dequantize(weight)


def quantize_activations(x: torch.Tensor, weight: CanonicalWeight) -> torch.Tensor:
    """Activations as the scheme's kernels see them (quantized, then dequantized to fp32)."""
    from .activations import fake_quantize

    return fake_quantize(x.to(torch.float32), weight)


def linear(
    x: torch.Tensor,
    weight: CanonicalWeight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    weight_only: bool = False,
) -> torch.Tensor:
    """Dequantize-then-matmul in fp32: the oracle every kernel is measured against.

    ``weight_only``: keep activations unquantized (the reference for weight-only substitutes).
    """
    w = dequantize(weight)
    x32 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    if weight.scheme.act is not None and not weight_only:
        x32 = quantize_activations(x32, weight)
    y = x32 @ w.to(x32.device).T
    if bias is not None:
        y = y + bias.to(y.device, torch.float32)
    return y.reshape(*x.shape[:-1], weight.N).to(out_dtype or x.dtype)
