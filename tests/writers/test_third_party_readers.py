"""Checkpoints quantrt writes, read back by the third-party tool that defines the format: a dense
bf16 model -> ``quantrt quantize`` -> compressed-tensors 0.20's own decompressor, per layer, equals
quantrt's own dequantization of the same file (``quantrt.reference.dequantize``).

The other formats' readers are checked elsewhere: GGUF by gguf-py and transformers' GGUF loader
(test_gguf_writer.py), GPTQ and AWQ by GPTQModel's loader and kernels (test_gptqmodel_reader.py),
block fp8 by transformers' FP8 loader (below); GPTQ, AWQ and block fp8 also byte for byte against
files the tools themselves wrote (test_gptq_writer.py, test_awq_writer.py, test_fp8_writer.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from writer_testing import stored_tensors

from quantrt import reference
from quantrt.checkpoint import open_checkpoint
from quantrt.writers import write_quantized

ct = pytest.importorskip("compressed_tensors")

SCHEMES = [
    "w4a16-int-g128-asym",
    "w4a16-int-g32-sym",
    "w8a16-int-ch-sym",
    "w8a16-fp8-ch",
    "w8a8-fp8-tensor",
    "w8a8-fp8-block128",
]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compressed_tensors_decompressor_reads_quantrts_file(
    dense_llama: Path, tmp_path: Path, scheme: str
) -> None:
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    out = tmp_path / "q"
    write_quantized(dense_llama, out, scheme, fmt="compressed-tensors")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    tensors = stored_tensors(out)
    ours = {p: reference.dequantize(w.canonical()) for p, w in open_checkpoint(out).weights()}
    assert len(ours) == 14
    seen = 0
    for group in qc["config_groups"].values():
        sch = QuantizationScheme.model_validate(group)
        fmt = group.get("format") or qc["format"]
        for prefix, want in ours.items():
            if f"{prefix}.weight_scale" not in tensors:
                continue
            sd = {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
            theirs = BaseCompressor.get_value_from_registry(fmt).decompress(sd, sch)["weight"]
            assert theirs.shape == want.shape, prefix
            # the tool dequantizes in the scale dtype; quantrt's fp32 reference rounded to it once
            assert torch.equal(theirs, want.to(theirs.dtype)), (
                prefix,
                float((theirs.float() - want).abs().max()),
            )
            seen += 1
    assert seen == 14


def test_transformers_fp8_loader_reads_quantrts_block_fp8(dense_llama: Path, tmp_path: Path) -> None:
    """``--format fp8`` (``quant_method: fp8``, 128x128 weight blocks): transformers' FP8 loader,
    which dequantizes where it finds no GPU, gives every layer's weight exactly quantrt's
    dequantization (fp32 load: nothing rounded after the block scale)."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "fp8"
    write_quantized(dense_llama, out, "w8a8-fp8-block128", fmt="fp8")
    ours = {p: reference.dequantize(w.canonical()) for p, w in open_checkpoint(out).weights()}
    assert len(ours) == 14
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    modules = dict(model.named_modules())
    for prefix, want in ours.items():
        theirs = modules[prefix].weight
        assert theirs.dtype == torch.float32 and torch.equal(theirs, want), prefix
