"""The transformers config of a checkpoint: its config.json, or for a GGUF file the config rebuilt
from the file's metadata (llama.cpp writes no config.json; :mod:`quantrt.formats.gguf_arch`
holds the key table). The quantization config is taken out: quantrt has read it already, and
transformers must not act on it a second time.
"""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointError


def config_dict(ckpt: Any) -> dict[str, Any]:
    """The model config of a checkpoint as a plain dict (no quantization config)."""
    if ckpt.format == "gguf":
        from ..formats.gguf_arch import hf_config_dict

        file = ckpt.index.file
        return hf_config_dict(file.metadata, list(file.tensors), file.path)
    if ckpt.config is None:
        raise CheckpointError(
            f"{ckpt.directory}: no config.json, so the model's architecture is unknown; a model needs the "
            "config.json transformers wrote beside the weights"
        )
    d = {k: v for k, v in ckpt.config.items() if k not in ("quantization_config", "compression_config")}
    text = d.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        d["text_config"] = {k: v for k, v in text.items() if k != "quantization_config"}
    return d


def model_config(ckpt: Any) -> Any:
    """A ``transformers.PretrainedConfig`` for the checkpoint."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    d = config_dict(ckpt)
    where = f"{ckpt.path}" if ckpt.format == "gguf" else f"{ckpt.directory / 'config.json'}"
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(f"{where}: expected a string model_type, found {model_type!r}")
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not an architecture this transformers knows"
        )
    rest = {k: v for k, v in d.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(model_type, **rest)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{where}: transformers refuses this {model_type} config: {e}") from None
