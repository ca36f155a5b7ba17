"""The MoE oracle: every (token, expert) pair computed on its own, in fp32, from the dequantized
experts. It shares no code with the kernels' paths (no batch, no sort, no loop kernel), so
tests of the grouped kernels and of :class:`~quantrt.moe.QuantExperts` compare against it.
Activations of W8A8 schemes are quantized per the scheme, as :func:`quantrt.reference.linear`
does for linear layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import reference
from .activation import Activation, activation_of
from .canonical import CanonicalExperts


def experts_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: CanonicalExperts | Sequence[CanonicalExperts],
    down: CanonicalExperts,
    act: str | Activation = "silu",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``sum_j w[m, j] * down_e(act(gate_up_e(x[m])))`` with ``e = ids[m, j]``, for each token m.

    ``gate_up``: one projection of [2I] rows (gate then up), or its parts (gate, up) to
    concatenate (all ``E`` experts, by global id). ``expert_map``: global id -> local expert, -1 where
    another rank holds it (those assignments contribute 0).
    """
    parts = [gate_up] if isinstance(gate_up, CanonicalExperts) else list(gate_up)
    fn = activation_of(act)
    M, H = x.shape[0], down.N
    x32 = x.to(torch.float32)
    out = torch.zeros(M, H, dtype=torch.float32)
    ids = topk_ids.long().cpu()
    if expert_map is not None:  # experts held elsewhere contribute nothing; held ones keep their ids
        ids = torch.where(expert_map.long().cpu()[ids] >= 0, ids, -1)
    w = topk_weights.to(torch.float32).cpu()
    for e in sorted({int(v) for v in ids.reshape(-1).tolist() if 0 <= v < down.E}):
        m, j = torch.nonzero(ids == e, as_tuple=True)
        xe = x32[m].cpu()
        h = torch.cat(
            [reference.linear(xe, p.expert(e).to("cpu"), out_dtype=torch.float32) for p in parts], 1
        )
        if gate_up_bias is not None:
            h = h + gate_up_bias[e].to(torch.float32).cpu()
        a = fn(h)
        y = reference.linear(a, down.expert(e).to("cpu"), out_dtype=torch.float32)
        if down_bias is not None:
            y = y + down_bias[e].to(torch.float32).cpu()
        out.index_add_(0, m, y * w[m, j].unsqueeze(1))
    return out.to(out_dtype or x.dtype)
