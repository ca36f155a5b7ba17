"""auto-round / Intel Neural Compressor (``quant_method: auto-round``) exports.

``packing_format`` decides the layout and the zero convention, never ``sym``:
``auto_round:auto_gptq`` / ``auto_round:gptq`` is GPTQ's layout with zero-points stored minus
one; plain ``auto_round`` (and ``auto_round:gptqmodel``) is GPTQ's layout with raw zero-points
and usually no ``g_idx``; ``auto_round:auto_awq`` / ``auto_round:awq`` is AWQ's GEMM layout.
``extra_config`` overrides bits / group_size / sym per layer (a name or a regex); 16 bits or
more leaves a layer unquantized. auto-round's ``format="auto_gptq"`` / ``"auto_awq"`` exports
write plain ``quant_method: gptq`` / ``awq`` and are read by those readers.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import CheckpointError
from .awq import awq_layer
from .base import FormatReader, LayerEntry, prefixes_with
from .gptq import Bits, GPTQAdapter, gptq_layer
from .patterns import Pattern, compile_patterns
from .schema import Bool, Config, GroupSize, Str, int_in

GPTQ_MINUS_ONE = ("auto_round:auto_gptq", "auto_round:gptq")
GPTQ_RAW = ("auto_round", "auto_round:gptqmodel")
AWQ = ("auto_round:auto_awq", "auto_round:awq")
#: an extra_config key that is a layer name rather than a regex
_LAYER_NAME = re.compile(r"[\w.]+")
#: an extra_config entry's bits: 16 or more leaves a layer unquantized
OverrideBits = int_in(1, 64)


class AutoRoundOverride(Config):
    """One ``extra_config`` entry: the keys it may change for the layers it names."""

    bits: OverrideBits = None
    group_size: GroupSize = None
    sym: Bool = None
    data_type: Str | None = None


class AutoRoundConfig(Config):
    """``quant_method: auto-round``: the keys quantrt reads."""

    packing_format: Str | None = None
    data_type: Str | None = None
    bits: Bits = None
    group_size: GroupSize = None
    sym: Bool | None = None
    extra_config: dict[str, AutoRoundOverride | None] | None = None


class AutoRoundReader(FormatReader):
    """``quant_method: auto-round`` (also ``intel/auto-round``, ``inc``)."""

    name = "auto-round"
    schema = AutoRoundConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        packing = (self.cfg("packing_format", default=None) or "auto_round:auto_gptq").lower()
        if packing not in GPTQ_MINUS_ONE + GPTQ_RAW + AWQ:
            raise CheckpointError(
                f"{self.source}: auto-round packing_format {packing!r} is not supported; known: "
                f"{', '.join(GPTQ_MINUS_ONE + GPTQ_RAW + AWQ)}"
            )
        data_type = self.cfg("data_type", default=None) or "int"
        if data_type != "int":
            raise CheckpointError(
                f"{self.source}: auto-round data_type {data_type!r}: only integer weights are "
                "read here (fp and mx types arrive with the FP8/FP4 formats)"
            )
        bits = self.cfg("bits", required=True)
        group = self.cfg("group_size", required=True)
        sym = self.cfg("sym") is not False
        extra = self.cfg("extra_config", default=None) or {}
        regexes = [k for k in extra if not _LAYER_NAME.fullmatch(k)]
        patterns = list(zip(compile_patterns(regexes, self.at("extra_config")), [extra[k] for k in regexes]))
        out: dict[str, LayerEntry] = {}
        for prefix in prefixes_with(self.index, "qweight"):
            over = _override(prefix, extra, patterns)
            b = over.get("bits", bits)
            if b >= 16:
                raise CheckpointError(
                    f"{self.source}: extra_config leaves {prefix} at {b} bits (unquantized) but "
                    "it stores qweight"
                )
            g = over.get("group_size", group)
            s = over.get("sym", sym)
            if packing in AWQ:
                if b != 4:
                    raise CheckpointError(
                        f"{self.source}: {prefix}: packing_format {packing} stores 4-bit weights, "
                        f"the config says bits={b}"
                    )
                out[prefix] = awq_layer(self.index, prefix, g, not s, self.source)
            else:
                adapter = GPTQAdapter(
                    b,
                    zero_offset=1 if packing in GPTQ_MINUS_ONE else 0,
                    has_g_idx=f"{prefix}.g_idx" in self.index,
                )
                out[prefix] = gptq_layer(self.index, prefix, b, g, s, False, adapter, self.source)
        return out


def _override(
    prefix: str, extra: dict[str, Any], patterns: list[tuple[Pattern, dict[str, Any] | None]]
) -> dict[str, Any]:
    """A layer's ``extra_config`` entry: by its exact name, else the first regex key that fully
    matches it (each compiled once, matched in bounded time). Keys that are plain layer names
    (auto-round writes one per layer of a mixed-precision model) are looked up, not matched."""
    if prefix in extra:
        return dict(extra[prefix] or {})
    for pattern, val in patterns:
        if pattern.fullmatch(prefix):
            return dict(val or {})
    return {}
