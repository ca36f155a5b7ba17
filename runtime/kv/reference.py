"""The attention oracle: fp32 softmax attention over given keys and values, with every option the
cache's kernels take (GQA, causal positions, sliding window, logit soft-capping, sinks, a mask).

Tests feed it the dequantized cache (what the kernels must match closely) and the unquantized keys
and values (what a scheme's error is measured against).
"""

from __future__ import annotations

import torch


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    q_pos: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, Tq, D], k and v [B, H, T, D] -> fp32 [B, Hq, Tq, D].

    ``q_pos`` [B, Tq]: each query's position (default: the last Tq of the T keys); query ``i``
    attends keys ``t <= q_pos[i]``, ``t > q_pos[i] - window`` and ``mask[b, i, t]``.
    """
    B, Hq, Tq = q.shape[:3]
    H, T = k.shape[1], k.shape[2]
    g = Hq // H
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    s = torch.einsum("bhqd,bhtd->bhqt", q.float(), kf) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if q_pos is None:
        q_pos = (torch.arange(Tq, device=q.device) + T - Tq).expand(B, Tq)
    t = torch.arange(T, device=q.device)
    ok = t[None, None, :] <= q_pos[:, :, None]
    if window:
        ok = ok & (t[None, None, :] > q_pos[:, :, None] - window)
    if mask is not None:
        ok = ok & mask.to(torch.bool)
    s = s.masked_fill(~ok[:, None], -torch.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.float().view(1, Hq, 1, 1).expand(B, Hq, Tq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return torch.einsum("bhqt,bhtd->bhqd", p, vf)
