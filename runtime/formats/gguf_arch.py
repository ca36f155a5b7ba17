"""What a GGUF file means as a transformers model: its config, its tensor names, its value fixes.

llama.cpp writes no config.json: the architecture's hyper-parameters sit in the metadata under
``<arch>.<key>``. transformers' own GGUF path rebuilds a config from them with one key table
(``transformers.integrations.ggml.GGUF_CONFIG_MAPPING``) and maps tensor names with gguf-py's
name table; quantrt uses those same tables, so a model quantrt builds has exactly the config and
names transformers would give it, but reads the metadata through quantrt's bounded GGUF parser
and checks every value it takes (type, range) before a model is sized from it.

Only the architectures in :data:`SUPPORTED` are accepted: each is covered by a test against
transformers' own loader. Others are refused by name, even where transformers' table has them,
because an architecture needs more than names (norm conventions, fused layers) to run right.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

#: GGUF ``general.architecture`` values quantrt runs ("llama" named "mistral" loads as Mistral)
SUPPORTED = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
#: architectures whose norms llama.cpp stores as ``1 + w`` (Gemma's RMSNorm scales by ``1 + w``)
NORM_PLUS_ONE = frozenset({"gemma2", "gemma3"})

#: config keys read as positive integers, with the largest value accepted
_INT_BOUNDS = {
    "max_position_embeddings": 1 << 26,
    "num_hidden_layers": 4096,
    "intermediate_size": 1 << 20,
    "hidden_size": 1 << 18,
    "head_dim": 1 << 14,
    "num_attention_heads": 1 << 14,
    "num_key_value_heads": 1 << 14,
    "sliding_window": 1 << 26,
    "vocab_size": 1 << 24,
}
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")

#: stored tensors a model does not hold as a parameter, and why reading none of them is right
HARMLESS_EXTRAS: dict[str, str] = {
    "rope_freqs.weight": "llama 3 rope frequency factors: applied to the rotary embedding's inv_freq",
}


def _fail(path: str | Path, msg: str) -> CheckpointError:
    return CheckpointError(f"{path}: {msg}")


def model_architecture(metadata: Mapping[str, Any], path: str | Path) -> tuple[str, str]:
    """(the file's ``general.architecture``, the transformers name it loads as)."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _fail(path, f"metadata 'general.architecture' must be a non-empty string, found {arch!r}")
    if arch not in SUPPORTED:
        raise _fail(
            path,
            f"GGUF architecture {arch!r} is not supported for running as a model; supported: "
            f"{', '.join(SUPPORTED)} (its layers can still be read one by one with quantrt.open)",
        )
    # transformers' test is ``"mistral" in [general.name]``: the name must be exactly "mistral"
    if arch == "llama" and metadata.get("general.name") == "mistral":
        return arch, "mistral"
    return arch, arch


def _checked(key: str, value: Any, path: str | Path) -> Any:
    if key in _INT_BOUNDS:
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            if len(set(value)) != 1:
                raise _fail(
                    path, f"config {key!r} varies per layer ({value[:8]}...), which quantrt cannot run"
                )
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _INT_BOUNDS[key]:
            raise _fail(
                path, f"config {key!r}: expected an integer in 1..{_INT_BOUNDS[key]}, found {value!r}"
            )
    elif key in _FLOAT_KEYS:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise _fail(path, f"config {key!r}: expected a positive finite number, found {value!r}")
    return value


def hf_config_dict(
    metadata: Mapping[str, Any], tensor_names: Iterable[str], path: str | Path
) -> dict[str, Any]:
    """The config dict transformers' GGUF loader builds for this file (``load_gguf_checkpoint``'s
    ``config``), from the same key table, with every sizing value type- and range-checked."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch, hf_arch = model_architecture(metadata, path)
    names = set(tensor_names)
    table = {"general": {"architecture": "model_type", "name": "_model_name_or_path"}}
    table[hf_arch] = GGUF_CONFIG_MAPPING[hf_arch]
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in names}
    for k, v in GGUF_CONFIG_DEFAULTS_MAPPING.get(hf_arch, {}).items():
        config.setdefault(k, v)
    for key, value in metadata.items():
        prefix, _, rest = key.replace(arch, hf_arch, 1).partition(".")
        target = table.get(prefix, {}).get(rest)
        if target is None or target == -1:
            continue
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, hf_arch)
        config[target] = _checked(target, value, path)
    if config.get("model_type") == "gemma3":
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise _fail(path, "no vocab_size: neither '<arch>.vocab_size' nor a tokenizer.ggml.tokens list")
        config["vocab_size"] = _checked("vocab_size", len(tokens), path)
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise _fail(path, f"metadata lacks {', '.join(f'{arch}.* for {k}' for k in missing)}")
    heads, kv = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    if heads % kv:
        raise _fail(path, f"{heads} attention heads are not a multiple of {kv} key/value heads")
    return config


def hf_tensor_names(model: torch.nn.Module, arch: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, from gguf-py's name table for ``arch`` (the
    table transformers' ``get_gguf_hf_weights_map`` reads; built once here, where transformers
    rebuilds it for every submodule)."""
    import gguf

    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        raise CheckpointError(f"gguf-py {gguf.__version__} has no tensor name table for {arch!r}")
    table = gguf.get_tensor_name_map(by_name[arch], model.config.num_hidden_layers)
    out: dict[str, str] = {}
    for hf in model.state_dict(keep_vars=True):
        stem, dot, suffix = hf.rpartition(".")
        if suffix not in ("weight", "bias"):
            stem, dot, suffix = hf, "", ""
        name = table.get_name(stem)
        if name is not None:
            out.setdefault(f"{name}{dot}{suffix}", hf)
    return out


def value_fix(gguf_name: str, arch: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How a stored tensor's values differ from transformers' parameter (None: they don't)."""
    if arch in NORM_PLUS_ONE and gguf_name.endswith("norm.weight"):
        return lambda t: t.float() - 1
    return None
