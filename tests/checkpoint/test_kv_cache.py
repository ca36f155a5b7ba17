"""KV-cache scales are found under every tool's names and normalised per attention layer.

The names here are the ones each tool writes (see runtime/checkpoint/kv_cache.py); files the
tools themselves wrote are checked in test_interop_fp.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError
from quantrt.schemes import KVCacheScheme


def make(tmp_path: Path, tensors: dict[str, torch.Tensor], qconfig: dict | None) -> Path:
    tensors = {**tensors, "model.layers.0.mlp.up_proj.weight": torch.randn(8, 4).half()}
    save_file(tensors, tmp_path / "model.safetensors")
    cfg = {"quantization_config": qconfig} if qconfig else {}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    "names,qconfig,scheme",
    [
        (
            ("model.layers.0.self_attn.k_scale", "model.layers.0.self_attn.v_scale"),
            {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "kv_cache_scheme": {"num_bits": 8, "type": "float"},
            },
            "kv-fp8",
        ),
        (
            ("model.layers.0.self_attn.k_proj.k_scale", "model.layers.0.self_attn.v_proj.v_scale"),
            {"quant_method": "fp8", "activation_scheme": "dynamic", "kv_cache_quant_algo": "FP8"},
            "kv-fp8",
        ),
        (
            ("model.layers.0.self_attn.k_proj.output_scale", "model.layers.0.self_attn.v_proj.output_scale"),
            {"quant_method": "fp8", "activation_scheme": "static"},
            "kv-fp8",
        ),
        (
            ("model.layers.0.self_attn.qkv_proj.k_scale", "model.layers.0.self_attn.qkv_proj.v_scale"),
            None,
            "kv-fp8",
        ),
    ],
)
def test_names_normalise_to_the_attention_layer(
    tmp_path: Path, names: tuple[str, str], qconfig: dict | None, scheme: str
) -> None:
    ck = open_checkpoint(
        make(tmp_path, {names[0]: torch.tensor([0.5]), names[1]: torch.tensor(0.25)}, qconfig)
    )
    kv = ck.kv_cache_scales()
    assert list(kv) == ["model.layers.0.self_attn"]
    got = kv["model.layers.0.self_attn"]
    assert got.scheme.name == scheme and got.k_scale.tolist() == [0.5] and got.v_scale.tolist() == [0.25]
    assert got.names == names


def test_legacy_single_scale_and_per_head(tmp_path: Path) -> None:
    ck = open_checkpoint(make(tmp_path, {"model.layers.1.self_attn.kv_scale": torch.tensor([2.0])}, None))
    kv = ck.kv_cache_scales()["model.layers.1.self_attn"]
    assert kv.k_scale.tolist() == kv.v_scale.tolist() == [2.0]
    heads = {
        "model.layers.0.self_attn.k_scale": torch.rand(4, 1, 1) + 0.1,
        "model.layers.0.self_attn.v_scale": torch.rand(4, 1, 1) + 0.1,
    }
    q = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head"},
    }
    (tmp_path / "h").mkdir()
    kv = open_checkpoint(make(tmp_path / "h", heads, q))
    assert kv.kv_cache_scales()["model.layers.0.self_attn"].scheme == KVCacheScheme("fp8_e4m3", "head")


def test_bad_kv_scales(tmp_path: Path) -> None:
    ck = open_checkpoint(
        make(
            tmp_path,
            {
                "model.layers.0.self_attn.k_scale": torch.tensor([float("nan")]),
                "model.layers.0.self_attn.v_scale": torch.tensor([1.0]),
            },
            None,
        )
    )
    with pytest.raises(CheckpointError, match="k_scale: KV-cache scales must be positive and finite"):
        ck.kv_cache_scales()
    (tmp_path / "b").mkdir()
    ck = open_checkpoint(
        make(tmp_path / "b", {"model.layers.0.self_attn.k_scale": torch.tensor([1.0])}, None)
    )
    with pytest.raises(CheckpointError, match="a k scale is stored but no v scale"):
        ck.kv_cache_scales()
