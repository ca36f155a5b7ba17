"""What the writer tests share: a small dense bf16 Llama checkpoint written by transformers; their
helpers live in writer_testing.py beside this file (importlib mode puts no test directory on
sys.path by itself)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="package")
def dense_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(5)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp("dense")
    model.save_pretrained(path)
    (path / "tokenizer_config.json").write_text("{}")
    return path
