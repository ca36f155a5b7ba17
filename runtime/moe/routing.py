"""Top-k routing: which experts each token goes to, and with what weight.

One :class:`Router` covers the routers of the MoE families quantrt loads:

- Mixtral, Qwen2/3-MoE: softmax over all experts, top-k, renormalised (``renormalize``; Qwen's
  ``norm_topk_prob``).
- DeepSeek-V2: softmax, group-limited greedy (``num_groups`` groups scored by their best expert,
  the top ``topk_groups`` groups kept), top-k, times ``routed_scaling_factor``.
- DeepSeek-V3: sigmoid scores, a per-expert ``correction_bias`` added for the choice only, groups
  scored by the sum of their two best (``group_score="top2"``), top-k, renormalised, scaled.
- gpt-oss: top-k on the logits, then softmax over the chosen k (``softmax_after_topk``).

Experts of dropped groups are masked with -inf before the top-k, as DeepSeek's own code and vLLM do
(transformers masks with 0, which differs only when corrected scores are negative). Ties are
broken as ``torch.topk`` breaks them. Weights are fp32, ids int32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCORINGS = ("softmax", "sigmoid")
GROUP_SCORES = ("max", "top2")


@dataclass(frozen=True)
class Router:
    """How logits [M, E] become ``top_k`` (weight, expert) pairs per token."""

    top_k: int
    scoring: str = "softmax"
    renormalize: bool = True
    num_groups: int = 1
    topk_groups: int = 1
    group_score: str = "max"
    routed_scaling_factor: float = 1.0
    softmax_after_topk: bool = False

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, found {self.top_k}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring {self.scoring!r}: expected one of {', '.join(SCORINGS)}")
        if self.group_score not in GROUP_SCORES:
            raise ValueError(f"group_score {self.group_score!r}: expected one of {', '.join(GROUP_SCORES)}")
        if self.num_groups < 1 or not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(f"topk_groups={self.topk_groups} must lie in [1, num_groups={self.num_groups}]")

    def __call__(
        self, logits: torch.Tensor, correction_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return route(logits, self, correction_bias)


def route(
    logits: torch.Tensor, router: Router, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_weights fp32 [M, k], topk_ids int32 [M, k])`` for router logits [M, E]."""
    if logits.dim() != 2:
        raise ValueError(f"expected router logits [M, E], found {list(logits.shape)}")
    M, E = logits.shape
    k = router.top_k
    if k > E:
        raise ValueError(f"top_k={k} exceeds the {E} experts")
    logits = logits.to(torch.float32)
    if router.softmax_after_topk:
        vals, ids = torch.topk(logits, k, dim=-1)
        return torch.softmax(vals, dim=-1), ids.to(torch.int32)
    scores = torch.softmax(logits, dim=-1) if router.scoring == "softmax" else torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.to(torch.float32)
    if router.num_groups > 1:
        G = router.num_groups
        if E % G:
            raise ValueError(f"{E} experts do not split into {G} groups")
        grouped = choice.view(M, G, E // G)
        if router.group_score == "max":
            gscore = grouped.max(dim=-1).values
        else:
            gscore = grouped.topk(min(2, E // G), dim=-1).values.sum(dim=-1)
        keep = torch.topk(gscore, router.topk_groups, dim=-1).indices
        mask = torch.zeros(M, G, dtype=torch.bool, device=logits.device).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(E // G, dim=1), float("-inf"))
    ids = torch.topk(choice, k, dim=-1).indices
    weights = scores.gather(1, ids)
    if router.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if router.routed_scaling_factor != 1.0:
        weights = weights * router.routed_scaling_factor
    return weights, ids.to(torch.int32)
