"""A dense Hugging Face checkpoint written as a GGUF that llama.cpp runs.

For Llama/Mistral and Qwen2/Qwen3 checkpoints with a byte-level BPE ``tokenizer.json`` (Llama 3,
Qwen, Mistral-Nemo style): the hyper-parameters go under ``<arch>.*`` as llama.cpp's converter
writes them, the tokenizer as gguf-py's ``BpeVocab`` and ``SpecialVocab`` read it (tokens, types,
merges, special ids, chat template), tensor names through gguf-py's name table, and Llama's q/k
rows in llama.cpp's rotary order (the reverse of what transformers' GGUF loader undoes). Each
``*.weight`` matrix whose rows are whole blocks is quantized to its GGUF type by round to nearest
(``reference.gguf.quantize_blocks``; a K-quant falls back as llama.cpp's quantizer does where rows
are not whole super-blocks), others keep their stored float type; norms are F32. One
tensor at a time, through ``GGUFWriter``. Other architectures and SentencePiece tokenizers are
llama.cpp's ``convert_hf_to_gguf.py``'s job and are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.files import read_json
from ..errors import CheckpointError
from ..formats.online import OnlineQuantization
from ..reference.gguf import BLOCK, quantize_blocks
from .gguf import FILE_TYPES, TypeRules, as_spec, fitted, gguf_module, gguf_writer, stream_tensors

#: transformers ``model_type`` -> GGUF architecture, and its llama.cpp pre-tokenizer name
ARCHITECTURES = {"llama": ("llama", "llama-bpe"), "mistral": ("llama", "llama-bpe"),
                 "qwen2": ("qwen2", "qwen2"), "qwen3": ("qwen3", "qwen2")}  # fmt: skip
#: GGUF float types for tensors kept unquantized, by stored dtype
KEPT_TYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
FLOAT_OUT = {v: k for k, v in KEPT_TYPES.items()}


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k rows from transformers' rotary half-split order to llama.cpp's interleaved pairs."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hparams(writer: Any, cfg: dict[str, Any], src: Path) -> dict[str, int]:
    def need(key: str) -> Any:
        if key not in cfg:
            raise CheckpointError(f"{src / 'config.json'}: {key} is missing")
        return cfg[key]

    H, L, nh = int(need("hidden_size")), int(need("num_hidden_layers")), int(need("num_attention_heads"))
    nkv = int(cfg.get("num_key_value_heads") or nh)
    head_dim = int(cfg.get("head_dim") or H // nh)
    writer.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(H)
    writer.add_block_count(L)
    writer.add_feed_forward_length(int(need("intermediate_size")))
    writer.add_head_count(nh)
    writer.add_head_count_kv(nkv)
    writer.add_rope_dimension_count(head_dim)
    if head_dim * nh != H:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(need("vocab_size")))
    return {"layers": L, "heads": nh, "kv_heads": nkv, "vocab": int(cfg["vocab_size"])}


def _tokenizer(writer: Any, gguf: Any, src: Path, pre: str, vocab_size: int) -> None:
    try:
        vocab = gguf.vocab.BpeVocab(src)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{src}: a byte-level BPE tokenizer.json is needed to write a GGUF ({e}); SentencePiece "
            "tokenizers: llama.cpp's convert_hf_to_gguf.py"
        ) from None
    tokens, types = [], []
    for text, _, kind in vocab.all_tokens():
        tokens.append(text)
        types.append(kind)
    if len(tokens) > vocab_size:
        raise CheckpointError(
            f"{src}: the tokenizer has {len(tokens)} tokens, the model's vocab_size is {vocab_size}"
        )
    for i in range(len(tokens), vocab_size):  # embedding rows past the tokenizer, as the converter pads
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(src, load_merges=True, n_vocab=len(tokens))
    if "bos" not in special.add_special_token:  # llama.cpp's default is to add one: say what HF does
        special.add_special_token["bos"] = _hf_adds_bos(src)
    special.add_to_gguf(writer, quiet=True)


def _hf_adds_bos(src: Path) -> bool:
    """Whether transformers' tokenizer of the folder starts an encoded text with BOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    ids = tok("a")["input_ids"]
    return tok.bos_token_id is not None and bool(ids) and ids[0] == tok.bos_token_id


def write_gguf_from_hf(
    src: str | Path,
    dst: str | Path,
    quantize: str | OnlineQuantization,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Write the dense checkpoint folder ``src`` as the GGUF file ``dst``, weights quantized to a
    GGUF type; returns a summary (tensors per type, bytes)."""
    from ..checkpoint import open_checkpoint

    gguf = gguf_module()
    spec, src, dst = as_spec(quantize), Path(src), Path(dst)
    if dst.exists():
        raise CheckpointError(f"{dst}: the destination exists")
    cfg = read_json(src / "config.json")
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"{src}: model_type {model_type!r}: quantrt writes GGUF for {', '.join(ARCHITECTURES)}; "
            "others: llama.cpp's convert_hf_to_gguf.py"
        )
    arch, pre = ARCHITECTURES[model_type]
    rules = TypeRules(spec)
    index = open_checkpoint(src).index
    with gguf_writer(dst, arch) as writer:
        writer.add_name(str(cfg.get("_name_or_path") or src.name))
        h = _hparams(writer, cfg, src)
        _tokenizer(writer, gguf, src, pre, h["vocab"])
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], h["layers"])
        plans: list[tuple[str, str, str]] = []  # (stored name, gguf name, ggml type)
        for name in index.names():
            if name.endswith("rotary_emb.inv_freq"):
                continue  # recomputed from the hyper-parameters
            new = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise CheckpointError(f"{src}: tensor {name!r} has no GGUF name for {arch}; not written")
            shape, dtype = index.shape(name), index.dtype(name)
            target = fitted(rules.target(new), shape[-1])
            if len(shape) == 1:
                kind = "F32"
            elif target is None or not new.endswith(".weight"):
                kind = KEPT_TYPES.get(dtype, "F32")
            else:
                kind = target.upper()
            plans.append((name, new, kind))
        targets = {k for _, _, k in plans if k.lower() in FILE_TYPES}
        writer.add_file_type(FILE_TYPES[targets.pop().lower()] if len(targets) == 1 else 1)

        def data(i: int) -> torch.Tensor:
            name, _, kind = plans[i]
            t = index.read(name)
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                t = _permute(t, h["heads"] if name.endswith("q_proj.weight") else h["kv_heads"])
            if kind.lower() in BLOCK:
                return quantize_blocks(t.float(), kind.lower())
            return t.float() if kind == "F32" else t.to(FLOAT_OUT[kind])

        stream_tensors(writer, [(new, index.shape(name), kind) for name, new, kind in plans], data, progress)
    written: dict[str, int] = {}
    for _, _, kind in plans:
        written[kind] = written.get(kind, 0) + 1
    return {
        "source": str(src),
        "destination": str(dst),
        "format": "gguf",
        "architecture": arch,
        "tensors": written,
        "bytes_written": dst.stat().st_size,
    }
