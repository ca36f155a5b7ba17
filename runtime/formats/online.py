"""A dense checkpoint quantized at load: ``from_pretrained(path, quantize="w4a16-int-g128-asym")``.

Users start from bf16 checkpoints; vLLM and SGLang quantize them as they load. Here every linear
layer of a dense checkpoint (MoE experts included) is quantized to a catalog scheme by round to
nearest as it is read (``quantrt.reference.quantize``, the same codes a checkpoint written by
quantrt would hold), one layer at a time, on the device the layer runs on: the stored 16-bit weight
is the layer's only loading tensor, so peak memory is the quantized model plus one dense layer and
the quantizer's temporaries. Per-layer overrides and the layers kept dense are fnmatch patterns on
the layer name (``model.layers.0.mlp.down_proj``): the first matching override wins, then the skip
list (by default the output head and MoE routers, as vLLM keeps them), then the default scheme.
Embeddings stay dense. Tensor parallelism cuts the dense weight like a dense layer and each rank
quantizes its own part (a row-parallel part takes its scales over its own columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field

from ..canonical import CanonicalWeight
from ..errors import CheckpointError
from ..schemes import Scheme, SchemeError, parse_scheme
from ..specs import TensorSpec
from .base import FLOAT_DTYPES, FormatReader, LayerEntry, check_finite, dense_layers
from .patterns import compile_patterns
from .schema import Config

METHOD = "quantrt_online"
#: layers kept dense unless an override names them: the output head (its error reaches every
#: logit) and MoE routers (a few KB that pick the experts)
DEFAULT_SKIP = ("lm_head", "*.lm_head", "*.gate", "*.router", "*.mlp.gate", "*.block_sparse_moe.gate")
#: most overrides and skip patterns one call may carry
MAX_RULES = 1000
#: rows quantized at a time where rows are independent, so the quantizer's fp32 temporaries stay a
#: fraction of one layer (peak memory: the model plus about one dense layer)
CHUNK_ROWS = 1024


@dataclass(frozen=True)
class OnlineQuantization:
    """What a dense checkpoint is quantized to at load: ``scheme`` for every linear layer, unless
    an ``overrides`` pattern names another (None: keep it dense) or a ``skip`` pattern matches."""

    scheme: str
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    skip: tuple[str, ...] = DEFAULT_SKIP
    #: "mse": integer schemes pick each group's range by least squared error (reference.intq)
    search: str | None = None

    def qconfig(self) -> dict[str, Any]:
        """As a quantization config (the reader validates it as it would one read from a file)."""
        return {
            "quant_method": METHOD,
            "scheme": self.scheme,
            "overrides": dict(self.overrides),
            "skip": list(self.skip),
            "search": self.search,
        }


def online_quantization(spec: str | OnlineQuantization) -> OnlineQuantization:
    """``quantize=`` as given: a scheme name or an :class:`OnlineQuantization`."""
    if isinstance(spec, OnlineQuantization):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise CheckpointError(
            f"quantize={spec!r}: expected a scheme name (quantrt explain --scheme all lists them)"
        )
    return OnlineQuantization(spec.strip())


class OnlineAdapter:
    """A dense [N, K] ``weight`` (kept in its stored dtype) in, the scheme's canonical tensors out."""

    name = "online"

    def __init__(self, dtype: torch.dtype, search: str | None = None) -> None:
        self.dtype, self.search = dtype, search

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        return {"weight": TensorSpec("weight", (N, K), self.dtype, input_dim=1, output_dim=0)}

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        from ..reference import quantize

        w = tensors["weight"]
        check_finite(w, "weight")  # here, on the layer's device: a GPU checks at its own speed
        searchable = (
            scheme.family == "int" and scheme.granularity in ("group", "channel") and not scheme.act_order
        )
        search = self.search if searchable else None  # other schemes: plain round to nearest
        if not _row_independent(scheme) or N <= CHUNK_ROWS:
            return quantize(w, scheme, output_sizes=output_sizes, search=search)
        parts = [
            quantize(w[r : r + CHUNK_ROWS], scheme, search=search).tensors for r in range(0, N, CHUNK_ROWS)
        ]
        return CanonicalWeight(
            scheme, N, K, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, output_sizes
        )


def _row_independent(s: Scheme) -> bool:
    """Schemes whose every canonical tensor has one row per weight row (integer and fp8 per group
    or channel, GGUF blocks), so row chunks quantize to the same codes as the whole."""
    return (
        (s.weight == "int" and s.granularity in ("group", "channel") and not s.act_order)
        or (s.weight in ("fp8_e4m3", "fp8_e5m2") and s.granularity == "channel")
        or s.weight == "gguf"
    )


class OnlineConfig(Config):
    quant_method: str
    scheme: str
    overrides: dict[str, str | None] = Field(default_factory=dict)
    skip: list[str] = Field(default_factory=list)
    search: Literal["mse"] | None = None


def _scheme(text: str, where: str) -> Scheme:
    try:
        s = parse_scheme(text)
    except SchemeError as err:
        raise CheckpointError(f"{where}: {err}") from None
    if s.act is not None and not s.act_dynamic:
        raise CheckpointError(
            f"{where}: {s.name} needs calibrated activation scales, which quantizing at load cannot "
            "make; take its dynamic variant"
        )
    return s


class OnlineReader(FormatReader):
    """Every dense linear layer quantized to the configured scheme at load."""

    name = METHOD
    schema = OnlineConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        cfg = OnlineConfig.model_validate(self.qconfig)  # validated in __init__: no error here
        default = _scheme(cfg.scheme, self.at("scheme"))
        if len(cfg.overrides) + len(cfg.skip) > MAX_RULES:
            raise CheckpointError(f"{self.source}: more than {MAX_RULES} override and skip patterns")
        overrides = [
            (p, None if text is None else _scheme(text, self.at("overrides", p.text)))
            for p, text in zip(
                compile_patterns(cfg.overrides, self.at("overrides"), glob=True),
                cfg.overrides.values(),
                strict=True,
            )
        ]
        skip = compile_patterns(cfg.skip, self.at("skip"), glob=True)
        out: dict[str, LayerEntry] = {}
        for prefix, entry in dense_layers(self.index, set(), set()).items():
            weight = entry.tensors["weight"]
            if entry.kind != "linear" or self.index.dtype(weight) not in FLOAT_DTYPES:
                continue
            rule = next(((p.text, s) for p, s in overrides if p.match(prefix)), None)
            if rule is not None:
                scheme, why = rule[1], f"override {rule[0]!r}"
            elif any(p.match(prefix) for p in skip):
                continue
            else:
                scheme, why = default, "the default"
            if scheme is None:
                continue
            out[prefix] = LayerEntry(
                prefix,
                scheme,
                entry.N,
                entry.K,
                dict(entry.tensors),
                OnlineAdapter(self.index.dtype(weight), cfg.search),
                bias=entry.bias,
                notes=[f"quantized at load to {scheme.name} ({why}), round to nearest"],
            )
        return out
