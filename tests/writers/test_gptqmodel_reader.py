"""GPTQ and AWQ checkpoints quantrt writes, read by GPTQModel (the maintained successor of AutoGPTQ
and AutoAWQ, whose loaders transformers' GPTQ/AWQ integration calls): GPTQModel's own loader and its
pure-torch kernels' dequantization of every layer equal quantrt's dequantization of the same file,
which test_gptq_writer.py / test_awq_writer.py hold to the dense model quantized at load: together,
bf16 -> quantrt's writer -> GPTQModel == quantrt's own quantize-and-dequantize.

GPTQModel pins a newer torch than the CPU CI's, so ci/setup.sh installs it and the few modules it
imports without their dependency pins; the test skips where it is absent. The model is loaded in
fp16 so the stored fp16 scales are not re-rounded (GPTQModel casts them to the load dtype).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from writer_testing import save_tiny_tokenizer, stored_tensors

from quantrt import reference
from quantrt.checkpoint import open_checkpoint
from quantrt.writers import write_quantized

gptqmodel = pytest.importorskip("gptqmodel")


def _written(dense: Path, out: Path, scheme: str, fmt: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``dense`` written by quantrt as ``fmt`` into ``out`` with a tokenizer beside it (GPTQModel's
    loader loads one with the weights): its quantization_config and quantrt's dequantization per layer."""
    write_quantized(dense, out, scheme, fmt=fmt)
    save_tiny_tokenizer(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    ours = {p: reference.dequantize(w.canonical()) for p, w in open_checkpoint(out).weights()}
    assert len(ours) == 14
    return qc, ours


def _load(path: Path, backend: str) -> dict[str, torch.nn.Module]:
    from gptqmodel import BACKEND, GPTQModel

    model = GPTQModel.load(str(path), device="cpu", backend=getattr(BACKEND, backend), dtype=torch.float16)
    return dict(model.model.named_modules())


def _assert_equal(theirs: torch.Tensor, want: torch.Tensor, prefix: str) -> None:
    assert theirs.shape == want.shape, prefix
    # GPTQModel dequantizes in fp16: (q - z) * s is exact in fp32, rounded once, as quantrt's reference
    assert torch.equal(theirs, want.to(theirs.dtype)), (prefix, float((theirs.float() - want).abs().max()))


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-sym", "w4a16-int-g32-sym", "w8a16-int-g128-sym"])
def test_gptqmodel_loads_quantrts_gptq(dense_llama: Path, tmp_path: Path, scheme: str) -> None:
    out = tmp_path / "gptq"
    _, ours = _written(dense_llama, out, scheme, "gptq")
    modules = _load(out, "TORCH")
    for prefix, want in ours.items():
        mod = modules[prefix]
        assert type(mod).__name__ == "TorchLinear", prefix
        _assert_equal(mod.dequantize_weight().T, want, prefix)


def test_gptqmodel_reads_quantrts_asymmetric_gptq(dense_llama: Path, tmp_path: Path) -> None:
    """Asymmetric v1 files: GPTQModel's loader accepts them only from GPTQModel itself (a provenance
    check on ``meta.quantizer``), so each layer goes through its module and its own v1 -> v2
    zero-point conversion, as that loader does."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    out = tmp_path / "gptq"
    qc, ours = _written(dense_llama, out, "w4a16-int-g128-asym", "gptq")
    assert (qc["sym"], qc["checkpoint_format"]) == (False, "gptq")
    tensors = stored_tensors(out)
    for prefix, want in ours.items():
        N, K = want.shape
        mod = TorchLinear(
            bits=4, group_size=qc["group_size"], sym=False, desc_act=False, in_features=K, out_features=N
        )
        sd = {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        assert set(sd) == {"qweight", "qzeros", "scales", "g_idx"}, prefix
        mod.load_state_dict(sd, strict=True)
        convert_gptq_v1_to_v2_format_module(mod, bits=4, pack_dtype=torch.int32)
        _assert_equal(mod.dequantize_weight().T, want, prefix)


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-asym", "w4a16-int-g64-asym"])
def test_gptqmodel_loads_quantrts_awq(dense_llama: Path, tmp_path: Path, scheme: str) -> None:
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm

    out = tmp_path / "awq"
    qc, ours = _written(dense_llama, out, scheme, "awq")
    modules = _load(out, "AWQ_TORCH")
    for prefix, want in ours.items():
        mod = modules[prefix]
        assert type(mod).__name__ == "AwqTorchLinear", prefix
        theirs = dequantize_gemm(
            qweight=mod.qweight,
            qzeros=mod.qzeros,
            scales=mod.scales,
            bits=qc["bits"],
            group_size=qc["group_size"],
        )
        _assert_equal(theirs.T, want, prefix)
