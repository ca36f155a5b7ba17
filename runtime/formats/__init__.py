"""Format readers: one module per checkpoint family, each a data transformation only.

:func:`find_quant_config` locates a checkpoint's quantization config the way vLLM does;
:func:`reader_for` picks the reader that understands it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..checkpoint.files import read_json
from ..errors import CheckpointError
from .autoround import AutoRoundReader
from .awq import AWQReader
from .base import FormatReader, LayerEntry, TensorIndex
from .bnb import BitsandbytesReader
from .compressed_tensors import CompressedTensorsReader
from .dense import DenseReader
from .experts_int8 import ExpertsInt8Reader
from .fp8 import FbgemmFP8Reader, FP8Reader
from .gptq import GPTQReader
from .modelopt import ModelOptReader
from .mxfp4 import GptOssMXFP4Reader
from .online import METHOD as ONLINE_METHOD
from .online import OnlineReader
from .quark import QuarkReader
from .torchao import TorchAOReader

READERS: dict[str, type[FormatReader]] = {
    "gptq": GPTQReader,
    "awq": AWQReader,
    "compressed-tensors": CompressedTensorsReader,
    "auto-round": AutoRoundReader,
    "bitsandbytes": BitsandbytesReader,
    "fp8": FP8Reader,
    "fbgemm_fp8": FbgemmFP8Reader,
    "modelopt": ModelOptReader,
    "mxfp4": GptOssMXFP4Reader,
    "quark": QuarkReader,
    "torchao": TorchAOReader,
    "experts_int8": ExpertsInt8Reader,
    ONLINE_METHOD: OnlineReader,
}
#: quantization a dense checkpoint can be given at load (``open_checkpoint(path, quantization=...)``)
ONLINE = ("experts_int8",)
ALIASES = {
    "compressed_tensors": "compressed-tensors",
    "intel/auto-round": "auto-round",
    "inc": "auto-round",
    "autoround": "auto-round",
    "gptq_marlin": "gptq",
    "awq_marlin": "awq",
    "modelopt_fp4": "modelopt",
}
#: files next to config.json that some tools write their quantization config into
SIDE_FILES = ("quantize_config.json", "quant_config.json", "quantization_config.json", "hf_quant_config.json")

__all__ = ["READERS", "FormatReader", "LayerEntry", "TensorIndex", "find_quant_config", "reader_for"]


def find_quant_config(directory: Path, config: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """The quantization config and where it came from (config.json keys first, then side files)."""
    if config is not None:
        text = config.get("text_config")
        for where, qc in (
            ("quantization_config", config.get("quantization_config")),
            (
                "text_config.quantization_config",
                text.get("quantization_config") if isinstance(text, dict) else None,
            ),
            ("compression_config", config.get("compression_config")),
        ):
            if qc is not None:
                if not isinstance(qc, dict):
                    raise CheckpointError(f"{directory / 'config.json'}: {where} must be an object")
                qc = dict(qc)
                if where == "compression_config":
                    qc.setdefault("quant_method", "compressed-tensors")
                return qc, f"{directory / 'config.json'} ({where})"
    for name in SIDE_FILES:
        path = directory / name
        if path.exists():
            qc = read_json(path)
            if not isinstance(qc, dict):
                raise CheckpointError(f"{path}: expected a JSON object")
            producer = qc.get("producer")
            if name == "hf_quant_config.json" or (
                isinstance(producer, dict) and producer.get("name") == "modelopt"
            ):
                qc.setdefault("quant_method", "modelopt")
            return qc, str(path)
    return None, str(directory)


def reader_for(qconfig: dict[str, Any] | None, index: TensorIndex, source: str) -> FormatReader:
    """The reader for a quantization config (None: a dense checkpoint)."""
    if qconfig is None:
        return DenseReader({}, index, source)
    method = qconfig.get("quant_method")
    if method is None and {"bits", "group_size"} <= set(qconfig):
        method = "gptq"  # a bare quantize_config.json, as AutoGPTQ writes it
    if method is None:
        raise CheckpointError(
            f"{source}: the quantization config has no quant_method (keys: {sorted(qconfig)})"
        )
    method = str(method).lower()
    method = ALIASES.get(method, method)
    if method not in READERS:
        raise CheckpointError(
            f"{source}: unknown quant_method {method!r}; known: {', '.join(sorted(READERS))}"
        )
    return READERS[method](qconfig, index, source)
