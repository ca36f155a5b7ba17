"""The GPTQ writer against GPTQ checkpoints auto-round and GPTQModel wrote (tests/fixtures/interop):
each layer read into canonical form and written back gives the tool's tensors byte for byte (v1
zero points, g_idx, fp16 scales; GPTQModel's v2 file is compared after its own zero convention);
and a dense model written as GPTQ by ``quantrt quantize`` loads (quantrt's GPTQ reader) into the
model ``from_pretrained(quantize=...)`` builds, logits equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from writer_testing import assert_loads_like_online, assert_written_back

import quantrt
from quantrt.errors import CheckpointError
from quantrt.writers import gptq, write_quantized

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
V1 = [
    "autoround-gptq-w4g128-sym",
    "autoround-gptq-w4g32-asym",
    "autoround-gptq-w8ch-sym",
    "autoround-gptq-w3g128-asym",
]


@pytest.mark.parametrize("name", V1)
def test_layers_written_back_byte_for_byte(name: str) -> None:
    got = assert_written_back(FIXTURES / name, gptq)
    mine, tool = gptq.quantization_config(got["schemes"], []), got["config"]
    for key in ("bits", "group_size", "desc_act", "sym", "quant_method", "lm_head"):
        assert mine[key] == tool[key], key


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-sym", "w8a16-int-ch-sym"])
def test_written_gptq_loads_as_the_model_quantized_at_load(
    dense_llama: Path, tmp_path: Path, scheme: str
) -> None:
    out = tmp_path / "q"
    write_quantized(dense_llama, out, scheme, fmt="gptq")
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "gptq" and cfg["checkpoint_format"] == "gptq"
    assert_loads_like_online(out, dense_llama, scheme, "gptq")


def test_refusals(dense_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="GPTQ holds"):
        write_quantized(dense_llama, tmp_path / "a", "w8a8-fp8-ch", fmt="gptq")
    with pytest.raises(CheckpointError, match="zero point of 0"):
        w = quantrt.reference.quantize(torch.rand(8, 128) + 1.0, "w4a16-int-g128-asym")  # all positive: z = 0
        gptq.layer_tensors("x", w)
