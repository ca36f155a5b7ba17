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

MoE architectures (qwen2moe, qwen3moe, gpt-oss). transformers' key table reads the expert count
and top-k but not the expert sizes: its model then takes ``moe_intermediate_size`` (and qwen2moe's
``shared_expert_intermediate_size``) from its config class defaults, which fit the released
Qwen1.5-MoE-A2.7B and Qwen3-30B-A3B files and no others. quantrt reads them
(:data:`EXTRA_CONFIG_KEYS`), so its config is transformers' dict plus those keys (the same config
as transformers' wherever the file's sizes are the defaults). For gpt-oss, transformers reads
``gpt-oss.rope.scaling.*`` wrongly (each key's length field instead of its value: rope_type
``[25]``, factor 27.0, and the config fails to build) and looks its sliding window up under a key
llama.cpp does not write (``sliding_window``, not ``attention.sliding_window``); quantrt reads
both. The 3-D expert stacks are not mapped by :func:`hf_tensor_names`: :func:`expert_stack` names
them for the model loader, which builds the MoE layers from them (transformers fuses them into
3-D parameters).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

#: GGUF ``general.architecture`` values quantrt runs ("llama" named "mistral" loads as Mistral)
SUPPORTED = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss")
#: GGUF architectures transformers knows under another name (its GGUF loader renames them)
HF_ARCH_NAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}
#: architectures whose FFN is a mixture of experts (stacked ``blk.N.ffn_*_exps`` tensors)
MOE_ARCHITECTURES = frozenset({"qwen2moe", "qwen3moe", "gpt-oss"})
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
    "num_experts": 1 << 16,
    "num_local_experts": 1 << 16,
    "num_experts_per_tok": 1 << 16,
    "moe_intermediate_size": 1 << 20,
    "shared_expert_intermediate_size": 1 << 20,
}
#: token ids (from ``tokenizer.ggml.*``): integers in 0..2^31-1
_ID_KEYS = ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id")
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
#: per transformers architecture: metadata keys (after ``<arch>.``) transformers' table does not
#: read but the model's shapes depend on -> the config key quantrt sets from them
EXTRA_CONFIG_KEYS: dict[str, dict[str, str]] = {
    "qwen2_moe": {
        "expert_feed_forward_length": "moe_intermediate_size",
        "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
    },
    "qwen3_moe": {"expert_feed_forward_length": "moe_intermediate_size"},
    # gpt-oss: the expert size is also feed_forward_length (llama.cpp writes both); the head size
    # is not hidden / heads (2880 / 64 in gpt-oss-20b) and transformers keeps the default 64;
    # transformers' table names the window "sliding_window" where llama.cpp writes
    # "attention.sliding_window", so it keeps the default 128
    "gpt_oss": {
        "expert_feed_forward_length": "intermediate_size",
        "attention.key_length": "head_dim",
        "attention.sliding_window": "sliding_window",
    },
}
#: per MoE transformers architecture: (its expert-count key, the top-k key)
_MOE_KEYS = {
    "qwen2_moe": ("num_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok"),
}
#: ``<arch>.rope.scaling.<suffix>`` -> (rope_scaling key, bound) as transformers names them
_ROPE_SCALING = {
    "factor": ("factor", 1 << 16),
    "attention_factor": ("attention_factor", 1 << 16),
    "beta_fast": ("beta_fast", 1 << 16),
    "beta_slow": ("beta_slow", 1 << 16),
    "original_context_length": ("original_max_position_embeddings", 1 << 26),
}

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
    return arch, HF_ARCH_NAMES.get(arch, arch)


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
    elif key in _ID_KEYS:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
            raise _fail(path, f"config {key!r}: expected a token id in 0..{(1 << 31) - 1}, found {value!r}")
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
    table = {
        "general": {"architecture": "model_type", "name": "_model_name_or_path"},
        "tokenizer": GGUF_CONFIG_MAPPING["tokenizer"],
    }
    table[hf_arch] = GGUF_CONFIG_MAPPING[hf_arch]
    extra_keys = EXTRA_CONFIG_KEYS.get(hf_arch, {})
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in names}
    for k, v in GGUF_CONFIG_DEFAULTS_MAPPING.get(hf_arch, {}).items():
        config.setdefault(k, v)
    extras: dict[str, tuple[str, Any]] = {}
    for key, value in metadata.items():
        prefix, _, rest = key.replace(arch, hf_arch).partition(".")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if prefix == hf_arch and rest in extra_keys:
            extras[extra_keys[rest]] = (key, _checked(extra_keys[rest], value, path))
            continue
        target = table.get(prefix, {}).get(rest)
        if target is None or target == -1:
            continue
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, hf_arch)
        config[target] = _checked(target, value, path)
    for target, (key, value) in extras.items():
        if target in config and config[target] != value:
            raise _fail(
                path,
                f"metadata {key!r} is {value} but the config's {target!r} is already {config[target]} "
                "(from another key): the file's sizes disagree",
            )
        config[target] = value
    scaling = _rope_scaling(metadata, arch, path) if hf_arch == "gpt_oss" else None
    if scaling is not None:
        config["rope_scaling"] = scaling
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
    if hf_arch in _MOE_KEYS:
        _check_experts(config, arch, hf_arch, path)
    return config


def _check_experts(config: dict[str, Any], arch: str, hf_arch: str, path: str | Path) -> None:
    """An MoE config needs its expert count and top-k from the file (transformers' defaults, 60 or
    128 experts, would size the model wrong), with top-k at most the expert count."""
    n_key, k_key = _MOE_KEYS[hf_arch]
    for key, gguf_key in ((n_key, "expert_count"), (k_key, "expert_used_count")):
        if key not in config:
            raise _fail(
                path, f"metadata lacks '{arch}.{gguf_key}' (the config's {key!r}), which an MoE model needs"
            )
    if config[k_key] > config[n_key]:
        raise _fail(
            path,
            f"metadata '{arch}.expert_used_count' is {config[k_key]}, more than the "
            f"{config[n_key]} experts of '{arch}.expert_count'",
        )


def _rope_scaling(metadata: Mapping[str, Any], arch: str, path: str | Path) -> dict[str, Any] | None:
    """gpt-oss's ``rope_scaling`` from ``<arch>.rope.scaling.*`` (type yarn, factor, original context
    length), as transformers means to build it (it reads each key's length field instead)."""
    prefix = f"{arch}.rope.scaling."
    found = {k[len(prefix) :]: v for k, v in metadata.items() if k.startswith(prefix)}
    if "type" not in found:
        return None
    rope_type = found["type"]
    if rope_type != "yarn":
        raise _fail(
            path, f"metadata '{prefix}type': expected 'yarn' (what gpt-oss uses), found {rope_type!r}"
        )
    out: dict[str, Any] = {"rope_type": "yarn"}
    for suffix, (key, bound) in _ROPE_SCALING.items():
        if suffix not in found:
            continue
        v = found[suffix]
        integer = key == "original_max_position_embeddings"
        ok = not isinstance(v, bool) and (
            (isinstance(v, int) and 0 < v <= bound)
            if integer
            else (isinstance(v, int | float) and math.isfinite(v) and 0 < v <= bound)
        )
        if not ok:
            kind = "an integer" if integer else "a finite number"
            raise _fail(path, f"metadata '{prefix}{suffix}': expected {kind} in (0, {bound}], found {v!r}")
        out[key] = int(v) if integer else float(v)
    return out


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
            # a bare parameter (gpt-oss's ``self_attn.sinks``): llama.cpp stores it as ``<name>.weight``
            stem, dot, suffix = hf, ".", "weight"
        name = table.get_name(stem)
        if name is not None and expert_stack(name) is None:
            out.setdefault(f"{name}{dot}{suffix}", hf)
    return out


_EXPERT_STACK_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps$")


def expert_stack(gguf_stem: str) -> tuple[int, str] | None:
    """(layer index, projection) of a stacked-experts tensor stem: ``blk.L.ffn_gate_exps`` ->
    ``(L, "gate")``, ``ffn_up_exps`` -> ``"up"``, ``ffn_down_exps`` -> ``"down"``, and the fused
    ``ffn_gate_up_exps`` newer llama.cpp converters can write -> ``"gate_up"`` (gate rows first,
    then up rows); None for any other name. The stem is the tensor name minus ``.weight`` (its
    ``.bias``, gpt-oss's [E, N] expert bias, belongs to the same stack)."""
    m = _EXPERT_STACK_RE.match(gguf_stem)
    return (int(m.group(1)), m.group(2)) if m else None


def value_fix(gguf_name: str, arch: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How a stored tensor's values differ from transformers' parameter (None: they don't)."""
    if arch in NORM_PLUS_ONE and gguf_name.endswith("norm.weight"):
        return lambda t: t.float() - 1
    if arch == "qwen2moe" and gguf_name.endswith(".ffn_gate_inp_shexp.weight"):
        # llama.cpp stores the shared-expert gate [H]; transformers' nn.Linear(H, 1) holds [1, H]
        return lambda t: t.reshape(1, -1)
    return None
