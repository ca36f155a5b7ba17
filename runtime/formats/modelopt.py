"""NVIDIA ModelOpt exports (``hf_quant_config.json``, or ``quantization_config`` with
``quant_method: modelopt``): FP8 and NVFP4.

FP8 stores ``weight`` fp8 [N, K], ``weight_scale`` fp32 (one per tensor; per channel [N] for
FP8_PER_CHANNEL_PER_TOKEN) and a static ``input_scale``. NVFP4 stores ``weight`` uint8 [N, K/2]
(low nibble first), ``weight_scale`` e4m3 [N, K/16], ``weight_scale_2`` (the global, a
*multiplier*) and ``input_scale`` (the activations' global multiplier). ``exclude_modules`` /
``ignore`` are fnmatch wildcards.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError
from ..schemes import Scheme, parse_scheme
from .base import FormatReader, LayerEntry, expect
from .compressed_tensors import QuantizationArgs
from .fp4 import NVFP4Adapter, fp4_shape
from .fp8 import FP8Adapter, fp8_layer, fp8_prefixes, fp8_scheme
from .patterns import Pattern, compile_patterns
from .schema import Config, Str, StrList

ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "W4A16_NVFP4")


class ModelOptQuantization(Config):
    """The keys quantrt reads of a ModelOpt config (``hf_quant_config.json``'s ``quantization``)."""

    quant_algo: Str | None = None
    kv_cache_quant_algo: Str | None = None
    exclude_modules: StrList | None = None
    ignore: StrList | None = None


class ModelOptConfig(ModelOptQuantization):
    """A ModelOpt config: flat (``quantization_config`` in config.json) or nested."""

    quantization: ModelOptQuantization | None = None
    kv_cache_scheme: QuantizationArgs | None = None


class ModelOptReader(FormatReader):
    name = "modelopt"
    schema = ModelOptConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        nested = bool(self.qconfig.get("quantization"))
        q = dict(self.qconfig.get("quantization") or self.qconfig)
        algo = str(q.get("quant_algo") or "").upper()
        if algo not in ALGOS:
            raise CheckpointError(
                f"{self.source}: ModelOpt quant_algo {algo or None!r} is not supported; known: "
                f"{', '.join(ALGOS)}"
            )
        key = "exclude_modules" if q.get("exclude_modules") else "ignore"
        where = self.at("quantization", key) if nested else self.at(key)
        exclude = compile_patterns(q.get(key) or [], where, glob=True)
        out: dict[str, LayerEntry] = {}
        if algo.startswith("FP8"):
            mode = "static" if algo == "FP8" else "token"
            for prefix in fp8_prefixes(self.index):
                self._not_excluded(prefix, exclude)

                def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype, mode: str = mode) -> Scheme:
                    return fp8_scheme(wd, gran, act=mode, scale_dtype=sd, where=self.source)

                out[prefix] = fp8_layer(
                    self.index, prefix, scheme_of, FP8Adapter(channel_shape="N"), self.source
                )
            return out
        scheme = parse_scheme("w4a16-nvfp4" if algo == "W4A16_NVFP4" else "w4a4-nvfp4")
        for name in self.index.names():
            if not name.endswith(".weight_scale_2"):
                continue
            prefix = name[: -len(".weight_scale_2")]
            self._not_excluded(prefix, exclude)
            N, K = fp4_shape(self.index, prefix, "weight", "weight_scale", 16)
            adapter = NVFP4Adapter("weight", "weight_scale", "weight_scale_2", "input_scale", divisor=False)
            specs = adapter.tensor_specs(scheme, N, K)
            for role, spec in specs.items():
                full = f"{prefix}.{role}"
                expect(
                    self.index,
                    full,
                    None if spec.per_slice else spec.shape,
                    (spec.dtype,),
                    f"{scheme} {N}x{K}",
                )
                if spec.per_slice and self.index.shape(full) not in ((), (1,)):
                    raise CheckpointError(
                        f"{self.index.where(full)}: expected one value, found shape "
                        f"{list(self.index.shape(full))}"
                    )
            bias = f"{prefix}.bias" if f"{prefix}.bias" in self.index else None
            out[prefix] = LayerEntry(
                prefix, scheme, N, K, {r: f"{prefix}.{r}" for r in specs}, adapter, bias=bias
            )
        return out

    def _not_excluded(self, prefix: str, exclude: list[Pattern]) -> None:
        for pattern in exclude:
            if pattern.match(prefix) or pattern.text in prefix.split("."):
                raise CheckpointError(
                    f"{self.source}: {prefix} matches exclude pattern {pattern.text!r} but stores "
                    "quantized tensors"
                )
