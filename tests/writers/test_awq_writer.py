"""The AWQ writer against AWQ checkpoints auto-round and GPTQModel wrote (tests/fixtures/interop):
each layer read into canonical form and written back gives the tool's tensors byte for byte (AWQ's
nibble interleave along N, zero points as stored, fp16 scales); and a dense model written as AWQ by
``quantrt quantize`` loads into the model ``from_pretrained(quantize=...)`` builds, logits equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from writer_testing import assert_loads_like_online, assert_written_back

import quantrt
from quantrt.errors import CheckpointError
from quantrt.writers import awq, write_quantized

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
TOOLS = [
    "autoround-awq-w4g128-asym",
    "autoround-awq-w4g128-sym",
    "autoround-awq-w4g32-asym",
    "autoround-awq-w4g64-asym",
    "gptqmodel-awq-w4g128-sym",
]


@pytest.mark.parametrize("name", TOOLS)
def test_layers_written_back_byte_for_byte(name: str) -> None:
    got = assert_written_back(FIXTURES / name, awq)
    mine, tool = awq.quantization_config(got["schemes"], []), got["config"]
    for key in ("bits", "group_size", "zero_point", "quant_method"):
        assert mine[key] == tool[key], key
    assert mine["version"] == tool["version"].lower()


def test_interleave_is_the_readers_inverse() -> None:
    from quantrt.formats.awq import unpack_awq

    codes = torch.randint(0, 16, (5, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    words = awq.pack_awq(codes)
    assert words.shape == (5, 3) and torch.equal(unpack_awq(words), codes)
    # nibble 1 of the first word holds column 2 (AutoAWQ's order), not column 1
    assert int((words[0, 0] >> 4) & 0xF) == int(codes[0, 2])


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-asym", "w4a16-int-g64-sym"])
def test_written_awq_loads_as_the_model_quantized_at_load(
    dense_llama: Path, tmp_path: Path, scheme: str
) -> None:
    out = tmp_path / "q"
    write_quantized(dense_llama, out, scheme, fmt="awq")
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "awq" and cfg["zero_point"] == scheme.endswith("asym")
    assert cfg["modules_to_not_convert"] == ["lm_head"]
    assert_loads_like_online(out, dense_llama, scheme, "awq")


def test_refusals(dense_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="AWQ holds 4-bit"):
        write_quantized(dense_llama, tmp_path / "a", "w8a16-int-ch-sym", fmt="awq")
    assert not (tmp_path / "a").exists()
    with pytest.raises(CheckpointError, match="N a multiple of 8"):
        awq.layer_tensors("x", quantrt.reference.quantize(torch.randn(12, 128), "w4a16-int-g64-asym"))
