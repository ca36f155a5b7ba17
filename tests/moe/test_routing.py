"""quantrt's Router against transformers' own routers, on random logits: the same experts and
the same weights for Mixtral, Qwen3-MoE, DeepSeek-V2 (greedy and group-limited), DeepSeek-V3
(sigmoid, correction bias, top-2 group scores) and gpt-oss."""

from __future__ import annotations

import pytest
import torch

from quantrt.moe import Router, route

transformers = pytest.importorskip("transformers")


def canon(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (expert, weight) pairs sorted by expert, so the order top-k returns them in
    does not matter."""
    ids = ids.long()
    order = ids.argsort(dim=-1)
    return ids.gather(1, order), weights.float().gather(1, order)


def same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    gi, gw = canon(*got)
    wi, ww = canon(*want)
    assert torch.equal(gi, wi)
    torch.testing.assert_close(gw, ww, rtol=1e-6, atol=1e-7)


def hidden(m: int, h: int, seed: int) -> torch.Tensor:
    return torch.randn(m, h, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_mixtral(top_k: int) -> None:
    from transformers.models.mixtral.modeling_mixtral import MixtralConfig, MixtralTopKRouter

    cfg = MixtralConfig(hidden_size=32, num_local_experts=7, num_experts_per_tok=top_k)
    r = MixtralTopKRouter(cfg)
    torch.nn.init.normal_(r.weight)
    x = hidden(19, 32, top_k)
    logits, w, ids = r(x)
    same(route(logits, Router(top_k)), (w, ids))


@pytest.mark.parametrize("norm", [True, False])
def test_qwen3_moe(norm: bool) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeConfig, Qwen3MoeTopKRouter

    cfg = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm)
    r = Qwen3MoeTopKRouter(cfg)
    torch.nn.init.normal_(r.weight)
    logits, w, ids = r(hidden(11, 32, 1))
    same(route(logits, Router(4, renormalize=norm)), (w, ids))


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2(method: str) -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Config, DeepseekV2TopkRouter

    cfg = DeepseekV2Config(
        hidden_size=32, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method=method, routed_scaling_factor=1.7,
    )  # fmt: skip
    r = DeepseekV2TopkRouter(cfg)
    torch.nn.init.normal_(r.weight)
    logits, w, ids = r(hidden(13, 32, 2))
    groups = (4, 2) if method == "group_limited_greedy" else (1, 1)
    router = Router(
        3, renormalize=False, num_groups=groups[0], topk_groups=groups[1], routed_scaling_factor=1.7
    )
    same(route(logits, router), (w, ids))


@pytest.mark.parametrize("norm", [True, False])
def test_deepseek_v3(norm: bool) -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Config, DeepseekV3TopkRouter

    cfg = DeepseekV3Config(
        hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
        norm_topk_prob=norm, routed_scaling_factor=2.5,
    )  # fmt: skip
    r = DeepseekV3TopkRouter(cfg)
    torch.nn.init.normal_(r.weight)
    # a non-negative correction keeps every corrected score positive, where transformers' zero mask
    # and DeepSeek's -inf mask choose alike (see quantrt.moe.routing)
    bias = torch.rand(16, generator=torch.Generator().manual_seed(3)) * 0.1
    r.e_score_correction_bias.copy_(bias)
    x = hidden(9, 32, 3)
    got = r(x)
    logits, want = got[0], got[1:]
    w, ids = want if want[0].is_floating_point() else want[::-1]
    router = Router(
        4, scoring="sigmoid", renormalize=norm, num_groups=4, topk_groups=2, group_score="top2",
        routed_scaling_factor=2.5,
    )  # fmt: skip
    same(route(logits, router, bias), (w, ids))


def test_gpt_oss() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssConfig, GptOssTopKRouter

    cfg = GptOssConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=4)
    r = GptOssTopKRouter(cfg)
    torch.nn.init.normal_(r.weight)
    torch.nn.init.normal_(r.bias)
    logits, w, ids = r(hidden(10, 32, 4))
    same(route(logits, Router(4, softmax_after_topk=True)), (w, ids))


def test_bad_routers_say_why() -> None:
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        Router(0)
    with pytest.raises(ValueError, match="scoring"):
        Router(2, scoring="relu")
    with pytest.raises(ValueError, match="topk_groups=3"):
        Router(2, num_groups=2, topk_groups=3)
    with pytest.raises(ValueError, match="exceeds the 4 experts"):
        route(torch.randn(3, 4), Router(5))
    with pytest.raises(ValueError, match="do not split into 3 groups"):
        route(torch.randn(3, 8), Router(2, num_groups=3, topk_groups=1))
