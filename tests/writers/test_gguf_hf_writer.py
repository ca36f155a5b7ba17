"""A dense Hugging Face checkpoint written as GGUF (``quantrt quantize folder out.gguf``), read back
by transformers' GGUF loader and gguf-py: the same logits as quantrt quantizing the folder at load
to the same GGUF type (transformers un-permutes Llama's q/k rows, so a wrong permutation shows), the
same tokenization as the folder's own tokenizer, quantrt's GGUF reader agreeing with transformers'.
llama.cpp running such a file: docs/models.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from writer_testing import TOKENIZER_TEXT, save_tiny_tokenizer

import quantrt
from quantrt.errors import CheckpointError
from quantrt.formats.online import OnlineQuantization
from quantrt.writers.gguf_hf import write_gguf_from_hf

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(request.param)
    vocab = save_tiny_tokenizer(path) + 4  # embedding rows past the tokenizer
    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)  # fmt: skip
    # head_dim = hidden / heads: transformers' GGUF table reads no key_length (quantrt writes it)
    cfg = transformers.AutoConfig.for_model(request.param, **common)
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return path


def test_transformers_reads_the_model_quantrt_quantizes_at_load(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUANTRT_KERNEL", "reference")  # fp32 dequantize-then-matmul, as transformers
    out = tmp_path / "m.gguf"
    summary = write_gguf_from_hf(folder, out, OnlineQuantization("gguf-q8_0", skip=("token_embd",)))
    assert summary["tensors"]["Q8_0"] == 15 and summary["tensors"]["BF16"] == 1
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=out.name, dtype=torch.float32
    )
    load = dict(device="cpu", dtype=torch.float32, progress=False)
    at_load = quantrt.from_pretrained(folder, quantize=OnlineQuantization("gguf-q8_0", skip=()), **load)
    from_file = quantrt.from_pretrained(out, **load)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(ids).logits
        assert torch.allclose(at_load(ids).logits, want, rtol=1e-5, atol=1e-5)
        assert torch.allclose(from_file(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_tokenizer_and_metadata(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    write_gguf_from_hf(folder, out, "gguf-q4_0")
    ours = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in [*TOKENIZER_TEXT, "unseen words: Zürich, 42"]:
        assert ours(text)["input_ids"] == hf(text)["input_ids"], text
    fields = gguf.GGUFReader(str(out)).fields
    cfg = json.loads((folder / "config.json").read_text())
    arch = "llama" if cfg["model_type"] == "llama" else "qwen3"
    assert fields["general.architecture"].contents() == arch
    assert fields[f"{arch}.block_count"].contents() == 2
    assert fields[f"{arch}.attention.head_count_kv"].contents() == 2
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False  # HF's tokenizer adds none
    assert len(fields["tokenizer.ggml.tokens"].contents()) == cfg["vocab_size"]
    assert fields["general.file_type"].contents() == 2  # MOSTLY_Q4_0
    # rows of 128 (hidden) are no whole Q4_K super-block: llama.cpp's fallback Q5_0; rows of 256 stay Q4_K
    write_gguf_from_hf(folder, tmp_path / "k.gguf", "gguf-q4_k")
    tensors = gguf.GGUFReader(str(tmp_path / "k.gguf")).tensors
    assert {t.name: t.tensor_type.name for t in tensors} == {
        t.name: "F32" if len(t.shape) == 1 else ("Q4_K" if t.shape[0] % 256 == 0 else "Q5_0") for t in tensors
    }
    assert {t.tensor_type.name for t in tensors} == {"F32", "Q4_K", "Q5_0"}


def test_refusals_and_cli(folder: Path, tmp_path: Path) -> None:
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    with pytest.raises(CheckpointError, match="convert_hf_to_gguf"):
        write_gguf_from_hf(gemma, tmp_path / "g.gguf", "gguf-q8_0")
    with pytest.raises(CheckpointError, match="not a GGUF type"):
        write_gguf_from_hf(folder, tmp_path / "x.gguf", "w4a16-int-g128-sym")
    assert not (tmp_path / "x.gguf").exists()
    out = tmp_path / "cli.gguf"
    cmd = [
        sys.executable,
        "-m",
        "quantrt",
        "quantize",
        str(folder),
        str(out),
        "--scheme",
        "gguf-q8_0",
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["format"] == "gguf" and out.exists()
