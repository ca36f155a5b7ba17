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
from .gptq import GPTQAdapter, gptq_layer

GPTQ_MINUS_ONE = ("auto_round:auto_gptq", "auto_round:gptq")
GPTQ_RAW = ("auto_round", "auto_round:gptqmodel")
AWQ = ("auto_round:auto_awq", "auto_round:awq")


class AutoRoundReader(FormatReader):
    """``quant_method: auto-round`` (also ``intel/auto-round``, ``inc``)."""

    name = "auto-round"

    def quantized_layers(self) -> dict[str, LayerEntry]:
        packing = str(self.cfg("packing_format", default="auto_round:auto_gptq")).lower()
        if packing not in GPTQ_MINUS_ONE + GPTQ_RAW + AWQ:
            raise CheckpointError(
                f"{self.source}: auto-round packing_format {packing!r} is not supported; known: "
                f"{', '.join(GPTQ_MINUS_ONE + GPTQ_RAW + AWQ)}"
            )
        data_type = str(self.cfg("data_type", default="int"))
        if data_type != "int":
            raise CheckpointError(
                f"{self.source}: auto-round data_type {data_type!r}: only integer weights are "
                "read here (fp and mx types arrive with the FP8/FP4 formats)"
            )
        bits = int(self.cfg("bits", required=True))
        group = int(self.cfg("group_size", required=True))
        sym = bool(self.cfg("sym", default=True))
        extra = self.cfg("extra_config", default=None) or {}
        out: dict[str, LayerEntry] = {}
        for prefix in prefixes_with(self.index, "qweight"):
            over = _override(prefix, extra)
            b = int(over.get("bits", bits))
            if b >= 16:
                raise CheckpointError(
                    f"{self.source}: extra_config leaves {prefix} at {b} bits (unquantized) but "
                    "it stores qweight"
                )
            g = int(over.get("group_size", group))
            s = bool(over.get("sym", sym))
            if packing in AWQ:
                out[prefix] = awq_layer(self.index, prefix, g, not s, self.source)
            else:
                adapter = GPTQAdapter(
                    b,
                    zero_offset=1 if packing in GPTQ_MINUS_ONE else 0,
                    has_g_idx=f"{prefix}.g_idx" in self.index,
                )
                out[prefix] = gptq_layer(self.index, prefix, b, g, s, False, adapter, self.source)
        return out


def _override(prefix: str, extra: dict[str, Any]) -> dict[str, Any]:
    if prefix in extra:
        return dict(extra[prefix] or {})
    for key, val in extra.items():
        try:
            if re.fullmatch(key, prefix):
                return dict(val or {})
        except re.error:
            continue
    return {}
