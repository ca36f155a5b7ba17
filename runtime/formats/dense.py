"""A checkpoint without quantization: every 2-D float weight is a plain 16-bit linear."""

from __future__ import annotations

from .base import FormatReader, LayerEntry


class DenseReader(FormatReader):
    """No quantization config: nothing is quantized."""

    name = "dense"

    def quantized_layers(self) -> dict[str, LayerEntry]:
        return {}
