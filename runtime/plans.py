"""Plans without weights: what dispatch would choose for a scheme and shape on some hardware.

``explain`` answers for one layer; ``plan_catalog`` for every catalog scheme on one device,
which is what the golden plan files record per preset.
"""

from __future__ import annotations

from typing import Any

import torch

from .capability import Capabilities
from .dispatch import Selection, planning_capabilities, select
from .env import Overrides
from .schemes import Scheme, catalog, parse_scheme
from .specs import LayerSpec

NO_NATIVE = "no native kernel yet"


def layer_spec(
    scheme: Scheme | str,
    K: int,
    N: int,
    *,
    act_dtype: torch.dtype = torch.bfloat16,
    tp_size: int = 1,
    parallel: str | None = None,
    bias: bool = False,
    num_experts: int = 1,
    output_sizes: tuple[int, ...] = (),
) -> LayerSpec:
    """The LayerSpec of a layer (a grouped one of ``num_experts`` experts when above 1, fused from
    ``output_sizes`` when given), optionally as one tensor-parallel rank."""
    s = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    K_part = K // tp_size if parallel == "row" else K
    N_part = N // tp_size if parallel == "column" else N
    sizes = tuple(n // tp_size for n in output_sizes) if parallel == "column" else tuple(output_sizes)
    return LayerSpec(
        s,
        K,
        N,
        K_part,
        N_part,
        act_dtype=act_dtype,
        bias=bias,
        parallel=parallel,
        tp_size=tp_size,
        op="grouped" if num_experts > 1 else "linear",
        num_experts=num_experts,
        output_sizes=sizes,
    )


def experts_specs(
    entry: Any, *, act_dtype: torch.dtype = torch.bfloat16, tp_size: int = 1
) -> dict[str, LayerSpec]:
    """The grouped LayerSpec of each projection :class:`~quantrt.moe.QuantExperts` builds for a
    checkpoint's MoE layer: gate and up fused into one [2I] projection when their schemes agree,
    column-parallel under tensor parallelism, down row-parallel."""
    E, H, Inter = entry.num_experts, entry.hidden_size, entry.intermediate_size
    col = "column" if tp_size > 1 else None
    row = "row" if tp_size > 1 else None
    common = dict(act_dtype=act_dtype, tp_size=tp_size, bias=entry.has_bias(), num_experts=E)
    out: dict[str, LayerSpec] = {}
    if entry.scheme("gate") == entry.scheme("up"):
        out["gate_up"] = layer_spec(
            entry.scheme("gate"), H, 2 * Inter, parallel=col, output_sizes=(Inter, Inter), **common
        )
    else:
        for proj in ("gate", "up"):
            out[proj] = layer_spec(entry.scheme(proj), H, Inter, parallel=col, **common)
    out["down"] = layer_spec(entry.scheme("down"), Inter, H, parallel=row, **common)
    return out


def explain(
    scheme: Scheme | str,
    K: int,
    N: int,
    *,
    device: Any = None,
    caps: Capabilities | None = None,
    act_dtype: torch.dtype = torch.bfloat16,
    overrides: Overrides | None = None,
    **kw: Any,
) -> Selection:
    """The dispatch plan for one layer, with every candidate's verdict (nothing is loaded)."""
    ov = overrides or Overrides.from_env()
    caps = caps or planning_capabilities(ov)
    dev = device if device is not None else caps.default_device.torch_device
    return select(layer_spec(scheme, K, N, act_dtype=act_dtype, **kw), dev, caps, ov)


def plan_catalog(
    caps: Capabilities,
    device: Any = None,
    K: int = 4096,
    N: int = 4096,
    act_dtype: torch.dtype = torch.bfloat16,
) -> dict[str, str]:
    """scheme -> chosen kernel for every catalog scheme ("no native kernel yet" for the reference)."""
    ov = Overrides(capabilities=caps.origin, fallback="allow")
    dev = device if device is not None else caps.default_device.torch_device
    out: dict[str, str] = {}
    for s in catalog():
        sel = select(layer_spec(s, K, N, act_dtype=act_dtype), dev, caps, ov)
        name = sel.kernel.name
        if sel.kernel.backend == "reference":
            name = NO_NATIVE
        elif sel.label != "native":
            name = f"{name} ({sel.label})"
        out[s.name] = name
    return out
