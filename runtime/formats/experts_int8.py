"""``quant_method: experts_int8``: a dense checkpoint whose MoE experts are quantized at load.

vLLM's ``experts_int8``: every expert projection (``<base>.experts.<e>.<proj>`` stored as a 16/32-bit
``weight``) is quantized to int8 per output channel, symmetric, round-to-nearest, as it is
loaded (``w8a16-int-ch-sym``); everything else stays dense. The stored tensor is the dense
weight, so tensor parallelism cuts it like a dense layer and each rank quantizes its own part
(a row-parallel part takes its scales over its own columns, as vLLM's online quantization does).
Peak memory stays one expert's dense weight. Also selected by ``from_pretrained(path,
quantization="experts_int8")`` on any dense checkpoint.
"""

from __future__ import annotations

import re

import torch

from ..canonical import CanonicalWeight
from ..schemes import Scheme, parse_scheme
from ..specs import TensorSpec
from .base import FLOAT_DTYPES, FormatReader, LayerEntry, dense_layers
from .schema import Config

SCHEME = "w8a16-int-ch-sym"
_EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)$")


class OnlineInt8Adapter:
    """A dense [N, K] ``weight`` in, canonical int8 per-channel tensors out."""

    name = "experts_int8"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        return {"weight": TensorSpec("weight", (N, K), torch.float32, input_dim=1, output_dim=0)}

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        from ..reference import quantize

        return quantize(tensors["weight"], scheme, output_sizes=output_sizes)


class ExpertsInt8Config(Config):
    quant_method: str


class ExpertsInt8Reader(FormatReader):
    """Dense layers, and every expert projection quantized to int8 per channel at load."""

    name = "experts_int8"
    schema = ExpertsInt8Config

    def quantized_layers(self) -> dict[str, LayerEntry]:
        scheme, adapter = parse_scheme(SCHEME), OnlineInt8Adapter()
        out = {}
        for prefix, entry in dense_layers(self.index, set(), set()).items():
            if _EXPERT.search(prefix) and self.index.dtype(entry.tensors["weight"]) in FLOAT_DTYPES:
                self.index.finite.add(entry.tensors["weight"])
                out[prefix] = LayerEntry(
                    prefix,
                    scheme,
                    entry.N,
                    entry.K,
                    dict(entry.tensors),
                    adapter,
                    bias=entry.bias,
                    notes=["quantized at load: int8 per channel, symmetric, round-to-nearest"],
                )
        return out
