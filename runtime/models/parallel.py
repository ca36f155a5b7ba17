"""Tensor parallelism for a whole model, described as data.

Which layer is cut how comes from transformers' own plan for the architecture
(``config.base_model_tp_plan`` and the model class's ``_tp_plan``): ``colwise`` layers hold
N/tp outputs, ``rowwise`` ones K/tp inputs and are followed by a sum over the ranks, the output
projection (``colwise_gather_output``) is gathered. Each rank builds the model from a *local*
config (heads and MLP width divided by tp), so the architecture's own code runs unchanged on its
part: attention reshapes by the local head count, and the MLP by the local width.

When there are fewer key/value heads than ranks (and tp is a multiple of them) each kv head is
replicated on tp/kv ranks, as vLLM does: rank r's query heads all read kv head r*kv//tp.
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class TensorParallel:
    """This process's place: rank of world, and the torch.distributed group the collectives use
    (None: the default group)."""

    rank: int = 0
    world: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ConfigError(f"tensor parallelism: rank {self.rank} is not in [0, {self.world})")

    @classmethod
    def from_process_group(cls, group: Any = None) -> TensorParallel:
        """Rank and world size of ``group`` (torch.distributed must be initialised)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "tp > 1 needs torch.distributed initialised (torch.distributed.init_process_group), "
                "or pass tp=TensorParallel(rank, world, group)"
            )
        return cls(dist.get_rank(group), dist.get_world_size(group), group)


@dataclass(frozen=True)
class LayerCut:
    """How one linear layer is cut: QuantLinear's parallel/tp_rank/tp_size, and the collective
    after it (``sum`` for row-parallel, ``gather`` for a gathered column-parallel layer)."""

    parallel: str | None
    tp_rank: int = 0
    tp_size: int = 1
    collective: str | None = None


NONE = LayerCut(None)


def _need(value: Any, what: str, world: int) -> int:
    if not isinstance(value, int) or value <= 0 or value % world:
        raise ConfigError(
            f"tensor parallelism over {world} ranks: {what} = {value!r} does not divide by {world}"
        )
    return value // world


def kv_replicas(config: Any, world: int) -> int:
    """How many ranks share one key/value head (1 when the kv heads divide by tp)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    _need(heads, "num_attention_heads", world)
    if kv % world == 0:
        return 1
    if world % kv:
        raise ConfigError(
            f"tensor parallelism over {world} ranks: num_key_value_heads = {kv} neither divides by {world} "
            f"nor divides {world} (a kv head can be replicated only on a whole number of ranks)"
        )
    return world // kv


def local_config(config: Any, tp: TensorParallel) -> Any:
    """The config of this rank's part: head counts and MLP width divided by tp (head_dim kept)."""
    if tp.world == 1:
        return config
    local = copy.deepcopy(config)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    replicas = kv_replicas(config, tp.world)
    if getattr(config, "head_dim", None) is None:
        local.head_dim = config.hidden_size // heads
    local.num_attention_heads = heads // tp.world
    local.num_key_value_heads = 1 if replicas > 1 else kv // tp.world
    local.intermediate_size = _need(config.intermediate_size, "intermediate_size", tp.world)
    return local


def plan(model: Any, config: Any, tp: TensorParallel) -> dict[str, LayerCut]:
    """Module name -> LayerCut for every linear module the architecture's plan cuts."""
    if tp.world == 1:
        return {}
    base = getattr(model, "base_model_prefix", "model")
    rules = {f"{base}.{k}": v for k, v in (getattr(config, "base_model_tp_plan", None) or {}).items()}
    rules.update(getattr(type(model), "_tp_plan", None) or {})
    if not rules:
        raise ConfigError(
            f"tensor parallelism: {type(model).__name__} has no tensor-parallel plan in transformers"
        )
    replicas = kv_replicas(config, tp.world)
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    out: dict[str, LayerCut] = {}
    for name, module in model.named_modules():
        style = next((v for k, v in rules.items() if fnmatch.fnmatchcase(name, k)), None)
        if style is None or not hasattr(module, "in_features"):
            continue
        if style == "colwise":
            if replicas > 1 and name.rsplit(".", 1)[-1] in ("k_proj", "v_proj"):
                out[name] = LayerCut("column", tp.rank * kv // tp.world, kv)
            else:
                out[name] = LayerCut("column", tp.rank, tp.world)
        elif style == "rowwise":
            out[name] = LayerCut("row", tp.rank, tp.world, "sum")
        elif style == "colwise_gather_output" and name.rsplit(".", 1)[-1] == "lm_head":
            out[name] = LayerCut("column", tp.rank, tp.world, "gather")
        elif style.startswith("replicated"):
            continue
        else:
            raise ConfigError(
                f"tensor parallelism: {type(model).__name__} cuts {name} as {style!r}, which quantrt does not "
                "do yet (it does colwise, rowwise and a gathered output projection)"
            )
    return out
