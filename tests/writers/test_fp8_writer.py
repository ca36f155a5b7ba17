"""The block-fp8 writer (``quant_method: fp8``) against transformers' own files (tests/fixtures/interop
hf-fp8-block128-dyn): each layer read into canonical form and written back gives its tensors byte
for byte and its config's keys; a dense model written by ``quantrt quantize --format fp8`` loads
into the model ``from_pretrained(quantize="w8a8-fp8-block128")`` builds, logits equal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from writer_testing import assert_loads_like_online, assert_written_back

from quantrt.errors import CheckpointError
from quantrt.writers import fp8, write_quantized

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "interop" / "hf-fp8-block128-dyn"


def test_layers_written_back_byte_for_byte() -> None:
    got = assert_written_back(FIXTURE, fp8)
    schemes, tool, ckpt = got["schemes"], got["config"], got["checkpoint"]
    dense = [p for p, e in ckpt.layers.items() if not e.quantized and e.kind == "linear"]
    mine = fp8.quantization_config(schemes, dense)
    for key in ("activation_scheme", "quant_method", "weight_block_size"):
        assert mine[key] == tool[key], key
    # transformers left k/v (N=64, under one block) dense without listing them; quantrt lists every
    # dense linear layer, so a reader never has to guess
    assert set(tool["modules_to_not_convert"]) <= set(mine["modules_to_not_convert"]) == set(dense)


def test_written_fp8_loads_as_the_model_quantized_at_load(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    dense = tmp_path / "dense"
    model.save_pretrained(dense)
    with pytest.raises(CheckpointError, match="block fp8"):
        write_quantized(dense, tmp_path / "no", "w8a8-fp8-ch", fmt="fp8")
    write_quantized(dense, tmp_path / "q", "w8a8-fp8-block128", fmt="fp8")
    assert_loads_like_online(tmp_path / "q", dense, "w8a8-fp8-block128", "fp8")
