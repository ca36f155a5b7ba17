"""Reading back what a writer test compares (shared by the writer tests)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors import safe_open

import quantrt
from quantrt.checkpoint import open_checkpoint

#: what the tiny test tokenizer is trained on
TOKENIZER_TEXT = [
    "The capital of France is Paris.",
    "def fibonacci(n): return n",
    "Quantization saves memory.",
]


def save_tiny_tokenizer(path: Path) -> int:
    """A small byte-level BPE tokenizer (tokenizers, saved by transformers) in ``path``, for readers
    that load one with the weights; returns its vocabulary size."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TOKENIZER_TEXT * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    return len(fast)


def stored_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, by name."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def assert_written_back(folder: Path, writer: ModuleType) -> dict[str, Any]:
    """Every quantized layer of a tool's checkpoint, read into canonical form and written back by
    ``writer``, equals the tool's stored tensors byte for byte (biases aside); returns the layers'
    schemes and the tool's quantization_config."""
    ckpt = open_checkpoint(folder)
    stored = stored_tensors(folder)
    schemes = {}
    for prefix, w in ckpt.weights():
        mine = writer.layer_tensors(prefix, w.canonical())
        assert set(mine) == {k for k in stored if k.startswith(prefix + ".") and not k.endswith(".bias")}
        for key, t in mine.items():
            want = stored[key]
            assert (t.dtype, t.shape) == (want.dtype, want.shape), key
            assert torch.equal(t.flatten().view(torch.uint8), want.flatten().view(torch.uint8)), key
        schemes[prefix] = w.scheme
    assert schemes
    tool = json.loads((folder / "config.json").read_text())["quantization_config"]
    return {"schemes": schemes, "config": tool, "checkpoint": ckpt}


def assert_loads_like_online(written: Path, dense: Path, scheme: str, fmt: str, vocab: int = 97) -> None:
    """A checkpoint quantrt wrote loads (through the format's reader) to logits equal to the dense
    one quantized at load to the same scheme."""
    load = dict(device="cpu", dtype=torch.float32, progress=False)
    model = quantrt.from_pretrained(written, **load)
    online = quantrt.from_pretrained(dense, quantize=scheme, **load)
    assert model.quantrt.format == fmt
    ids = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, online(ids).logits)
