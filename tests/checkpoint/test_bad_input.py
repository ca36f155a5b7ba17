"""A checkpoint is untrusted: each defect, planted in a copy of a tool-written file, is one clear
error naming the file, the tensor or key, and the expected vs found value."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixture_edits import DOWN, copy, edit_config, edit_tensors, load_everything
from safetensors.torch import load_file

from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError


def test_unknown_and_missing_quant_method(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_config(d, lambda q: q.update(quant_method="qlora-magic"))
    with pytest.raises(
        CheckpointError,
        match=r"config.json \(quantization_config\): unknown quant_method "
        r"'qlora-magic'; known: auto-round, awq, bitsandbytes",
    ):
        open_checkpoint(d)
    edit_config(d, lambda q: q.pop("quant_method"))
    with pytest.raises(CheckpointError, match="the quantization config has no quant_method"):
        open_checkpoint(d)
    edit_config(d, lambda q: q.update(quant_method="fp8"))
    with pytest.raises(CheckpointError, match="the fp8 quantization config has no 'activation_scheme'"):
        load_everything(d)


def test_missing_tensor(tmp_path: Path) -> None:
    d = copy(tmp_path, "autoround-gptq-w4g128-sym")
    edit_tensors(d, lambda t: t.pop(f"{DOWN}.scales"))
    with pytest.raises(CheckpointError, match=f"missing tensor '{DOWN}.scales'"):
        load_everything(d)


def test_wrong_dtype_and_shape(tmp_path: Path) -> None:
    d = copy(tmp_path, "autoround-gptq-w4g128-sym")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.qzeros": t[f"{DOWN}.qzeros"].long()}))
    with pytest.raises(
        CheckpointError, match=f"model.safetensors: {DOWN}.qzeros: expected dtype int32, found int64"
    ):
        load_everything(d)
    d = copy(tmp_path / "b", "autoround-gptq-w4g128-sym")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.scales": torch.cat([t[f"{DOWN}.scales"]] * 2)}))
    with pytest.raises(CheckpointError, match=rf"{DOWN}.scales: expected shape \[2, 128\], found \[4, 128\]"):
        load_everything(d)


def test_group_size_not_dividing_k(tmp_path: Path) -> None:
    d = copy(tmp_path, "autoround-gptq-w4g64-sym-sharded")
    edit_config(d, lambda q: q.update(group_size=96))
    (d / "quantization_config.json").unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="group_size 96 does not divide K=128"):
        load_everything(d)


def test_bits_the_format_does_not_allow(tmp_path: Path) -> None:
    d = copy(tmp_path, "gptqmodel-gptq-w4g128-asym-v2")
    edit_config(d, lambda q: q.update(bits=5))
    with pytest.raises(CheckpointError, match=r"bits must be one of \(2, 3, 4, 8\), found 5"):
        load_everything(d)
    d = copy(tmp_path / "awq", "autoround-awq-w4g128-asym")
    edit_config(d, lambda q: q.update(bits=8))
    with pytest.raises(CheckpointError, match="AWQ stores 4-bit weights, the config says bits=8"):
        load_everything(d)


def test_g_idx_out_of_range(tmp_path: Path) -> None:
    d = copy(tmp_path, "gptqmodel-gptq-w4g128-sym-actorder")

    def poison(t: dict[str, torch.Tensor]) -> None:
        g = t[f"{DOWN}.g_idx"].clone()
        g[5] = 99
        t[f"{DOWN}.g_idx"] = g

    edit_tensors(d, poison)
    with pytest.raises(
        CheckpointError, match=rf"layer {DOWN}: g_idx: group ids must lie in \[0, 1\], found \[0, 99\]"
    ):
        load_everything(d)


def test_config_says_sym_while_zero_points_exist(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-asym")

    def make_sym(q: dict) -> None:
        for g in q["config_groups"].values():
            g["weights"]["symmetric"] = True

    edit_config(d, make_sym)
    with pytest.raises(
        CheckpointError, match=r"weight_zero_point: the config says symmetric, but zero-points are stored"
    ):
        load_everything(d)
    d = copy(tmp_path / "g", "gptqmodel-gptq-w4g128-asym-v2")
    edit_config(d, lambda q: q.update(sym=True))
    with pytest.raises(CheckpointError, match="qzeros: the config says sym, so every zero-point is 8"):
        load_everything(d)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_infinite_scales(tmp_path: Path, value: float) -> None:
    d = copy(tmp_path, "ct-pack-w8a16-ch-sym")

    def poison(t: dict[str, torch.Tensor]) -> None:
        s = t[f"{DOWN}.weight_scale"].clone()
        s[3] = value
        t[f"{DOWN}.weight_scale"] = s

    edit_tensors(d, poison)
    with pytest.raises(
        CheckpointError, match=rf"layer {DOWN}: weight_scale: 1 of 128 values are NaN or infinite"
    ):
        load_everything(d)


def test_nan_fp8_weight_codes(tmp_path: Path) -> None:
    """e4m3fn has no infinity, and its NaN codes (0x7F, 0xFF) have no place in a weight: kernels
    that decode codes by bit tricks would read them as +-480."""
    d = copy(tmp_path, "ct-fp8-w-channel-a-dyntoken")

    def poison(t: dict[str, torch.Tensor]) -> None:
        w = t[f"{DOWN}.weight"].clone()
        assert w.dtype == torch.float8_e4m3fn
        w.view(torch.uint8)[2, 5] = 0x7F
        w.view(torch.uint8)[7, 1] = 0xFF
        t[f"{DOWN}.weight"] = w

    edit_tensors(d, poison)
    n = load_file(d / "model.safetensors")[f"{DOWN}.weight"].numel()
    with pytest.raises(CheckpointError, match=rf"layer {DOWN}: weight: 2 of {n} fp8 codes are NaN"):
        load_everything(d)


def test_truncated_fixture(tmp_path: Path) -> None:
    d = copy(tmp_path, "bnb-int8")
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="but the file's data section holds only"):
        open_checkpoint(d)


def test_awq_gemv_is_an_unsupported_variant(tmp_path: Path) -> None:
    d = copy(tmp_path, "autoround-awq-w4g128-asym")
    edit_config(d, lambda q: q.update(version="gemv"))
    with pytest.raises(CheckpointError, match="AWQ version 'gemv' is an unsupported variant"):
        load_everything(d)


def test_ignored_layer_with_quantized_tensors(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_config(d, lambda q: q.update(ignore=["lm_head", f"re:{DOWN}"]))
    with pytest.raises(CheckpointError, match=f"{DOWN} is in 'ignore' but stores quantized tensors"):
        load_everything(d)


def test_fp8_scale_of_the_wrong_rank(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-fp8-w-channel-a-dyntoken")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"].repeat(1, 2)}))
    with pytest.raises(
        CheckpointError, match=rf"{DOWN}.weight_scale: expected a per-tensor scale .* found \[128, 2\]"
    ):
        load_everything(d)
    d = copy(tmp_path / "t", "ct-fp8-w-channel-a-dyntoken")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"][:1, 0]}))
    with pytest.raises(
        CheckpointError, match="the config says strategy 'channel' but weight_scale's shape is tensor-wise"
    ):
        load_everything(d)


def test_block_scales_that_do_not_cover_the_weight(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-fp8-w-block96x64-a16")
    edit_tensors(
        d, lambda t: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"][:, :2].contiguous()})
    )
    with pytest.raises(
        CheckpointError,
        match=r"block scales \[2, 2\] do not cover the weight \[128, 256\] in 96x64 "
        r"blocks \(expected \[2, 4\]\)",
    ):
        load_everything(d)


def test_nvfp4_with_odd_k(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-nvfp4-w4a16")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.weight_shape": torch.tensor([128, 255])}))
    with pytest.raises(CheckpointError, match=f"{DOWN}.weight_shape: NVFP4 with odd K=255"):
        load_everything(d)
