"""The block-fp8 writer (``quant_method: fp8``) against transformers' own files (tests/fixtures/interop
hf-fp8-block128-dyn): each layer read into canonical form and written back gives its tensors byte
for byte and its config's keys; a dense model written by ``quantrt quantize --format fp8`` loads
into the model ``from_pretrained(quantize="w8a8-fp8-block128")`` builds, logits equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from writer_testing import stored_tensors

import quantrt
from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError
from quantrt.writers import fp8, write_quantized

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "interop" / "hf-fp8-block128-dyn"


def test_layers_written_back_byte_for_byte() -> None:
    ckpt = open_checkpoint(FIXTURE)
    stored = stored_tensors(FIXTURE)
    schemes = {}
    for prefix, w in ckpt.weights():
        mine = fp8.layer_tensors(prefix, w.canonical())
        assert set(mine) == {k for k in stored if k.startswith(prefix + ".")}
        for key, t in mine.items():
            want = stored[key]
            assert (t.dtype, t.shape) == (want.dtype, want.shape), key
            assert torch.equal(t.flatten().view(torch.uint8), want.flatten().view(torch.uint8)), key
        schemes[prefix] = w.scheme
    assert schemes
    tool = json.loads((FIXTURE / "config.json").read_text())["quantization_config"]
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
    load = dict(device="cpu", dtype=torch.float32, progress=False)
    written = quantrt.from_pretrained(tmp_path / "q", **load)
    online = quantrt.from_pretrained(dense, quantize="w8a8-fp8-block128", **load)
    assert written.quantrt.format == "fp8"
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(written(ids).logits, online(ids).logits)
