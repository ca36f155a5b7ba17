"""Tensor values a checkpoint cannot mean, planted in copies of tool-written files: each is one
CheckpointError (or, where a layer is being built, ShardError) naming the tensor and what was
found; nothing passes silently, and no value is changed by a cast before it is checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fixture_edits import DOWN, ROOT, copy, edit_tensors, load_everything
from safetensors.torch import load_file

from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError, ShardError


def poke(name: str, index: tuple[int, ...], value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def fn(t: dict[str, torch.Tensor]) -> None:
        x = t[name].clone()
        x[index] = value
        t[name] = x

    return fn


# -- g_idx: range-checked in its stored dtype, and int64 accepted everywhere ----------------------


def int64_g_idx(d: Path, name: str, bad: int | None = None) -> None:
    def fn(t: dict[str, torch.Tensor]) -> None:
        g = t[name].long()
        if bad is not None:
            g[5] = bad
        t[name] = g

    edit_tensors(d, fn)


@pytest.mark.parametrize(
    ("variant", "name", "ng"),
    [
        ("gptqmodel-gptq-w4g128-sym-actorder", f"{DOWN}.g_idx", 2),
        ("ct018-pack-w4a16-g128-sym-actorder-group", f"{DOWN}.weight_g_idx", 2),
    ],
)
def test_an_int64_g_idx_past_int32_is_refused_not_wrapped(
    tmp_path: Path, variant: str, name: str, ng: int
) -> None:
    """2^32 + 1 cast to int32 first would read as group 1, a valid group."""
    d = copy(tmp_path, variant)
    int64_g_idx(d, name, 2**32 + 1)
    role = name.rsplit(".", 1)[-1]
    with pytest.raises(
        CheckpointError,
        match=rf"layer {DOWN}: {role}: group ids must lie in \[0, {ng - 1}\], found \[0, 4294967297\]",
    ):
        load_everything(d)
    with pytest.raises(
        ShardError, match=rf"{name}: expected int64 values that fit int32 .* found \[0, 4294967297\]"
    ):
        open_checkpoint(d).linear(DOWN, act_dtype=torch.float32)


@pytest.mark.parametrize(
    ("variant", "name"),
    [
        ("gptqmodel-gptq-w4g128-sym-actorder", f"{DOWN}.g_idx"),
        ("ct018-pack-w4a16-g128-sym-actorder-group", f"{DOWN}.weight_g_idx"),
    ],
)
def test_a_valid_int64_g_idx_loads_as_the_int32_one(tmp_path: Path, variant: str, name: str) -> None:
    """The reader accepts an int64 g_idx; so does the layer (range-checked, then converted)."""
    d = copy(tmp_path, variant)
    int64_g_idx(d, name)
    x = torch.randn(3, open_checkpoint(d).layer(DOWN).K, generator=torch.Generator().manual_seed(0))
    want = open_checkpoint(ROOT / variant).linear(DOWN, act_dtype=torch.float32)(x)
    got = open_checkpoint(d).linear(DOWN, act_dtype=torch.float32)(x)
    assert torch.equal(got, want)
    assert torch.equal(
        dict(open_checkpoint(d).weights())[DOWN].dequantize(),
        dict(open_checkpoint(ROOT / variant).weights())[DOWN].dequantize(),
    )


# -- NaN and infinity: code books, biases, dense weights -------------------------------------------


@pytest.mark.parametrize(
    ("variant", "name", "n"),
    [
        ("bnb4-nf4", f"{DOWN}.weight.quant_map", 16),
        ("bnb4-fp4-dq", f"{DOWN}.weight.quant_map", 16),
        ("bnb4-nf4-dq", f"{DOWN}.weight.nested_quant_map", 256),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_code_book_entry_is_refused(
    tmp_path: Path, variant: str, name: str, n: int, value: float
) -> None:
    d = copy(tmp_path, variant)
    edit_tensors(d, poke(name, (3,), value))
    role = name[len(DOWN) + 1 :]
    with pytest.raises(CheckpointError, match=rf"layer {DOWN}: {role}: 1 of {n} values are NaN or infinite"):
        load_everything(d)


def test_a_nan_bias_is_refused_dense_or_quantized(tmp_path: Path) -> None:
    d = copy(tmp_path, "gptoss-mxfp4-handbuilt")
    k = "model.layers.0.self_attn.k_proj"
    edit_tensors(d, poke(f"{k}.bias", (2,), float("nan")))
    n = load_file(d / "model.safetensors")[f"{k}.bias"].numel()
    with pytest.raises(
        CheckpointError, match=rf"model.safetensors: {k}.bias: 1 of {n} values are NaN or infinite"
    ):
        open_checkpoint(d).linear(k)
    d = copy(tmp_path / "q", "gptqmodel-gptq-w4g128-sym-actorder")
    edit_tensors(
        d, lambda t: t.update({f"{DOWN}.bias": torch.full((128,), float("nan"), dtype=torch.float16)})
    )
    with pytest.raises(CheckpointError, match=rf"model.safetensors: {DOWN}.bias: 128 of 128 values are NaN"):
        open_checkpoint(d).linear(DOWN, act_dtype=torch.float32)


def test_an_expert_bias_is_checked_when_read(tmp_path: Path) -> None:
    """gpt-oss names its expert biases ``*_bias``; they are checked like ``*.bias``."""
    d = copy(tmp_path, "gptoss-mxfp4-handbuilt")
    name = "model.layers.0.mlp.experts.down_proj_bias"
    edit_tensors(d, poke(name, (1, 0), float("inf")))
    ck = open_checkpoint(d)
    entry = next(e for e in ck.layers.values() if e.bias == name and e.select["bias"] == 1)
    ck.index.read_index(name, 0)  # expert 0's bias is finite
    with pytest.raises(
        CheckpointError, match=rf"model.safetensors: {name}: 1 of \d+ values are NaN or infinite"
    ):
        ck.index.read_index(name, entry.select["bias"])


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_a_non_finite_dense_weight_is_refused(tmp_path: Path, value: float) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_tensors(d, poke("lm_head.weight", (4, 7), value))
    ck = open_checkpoint(d)
    assert not ck.layers["lm_head"].quantized
    n = load_file(d / "model.safetensors")["lm_head.weight"].numel()
    with pytest.raises(CheckpointError, match=rf"model.safetensors: lm_head.weight: 1 of {n} values are NaN"):
        ck.linear("lm_head")
    with pytest.raises(CheckpointError, match=r"lm_head\.weight: 1 of"):
        ck.index.read("lm_head.weight")


def test_a_nan_norm_weight_is_refused_when_read(tmp_path: Path) -> None:
    d = copy(tmp_path, "bnb-int8")
    edit_tensors(d, poke("model.norm.weight", (0,), float("nan")))
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: model.norm.weight: 1 of \d+ values are NaN"
    ):
        open_checkpoint(d).index.read("model.norm.weight")


# -- documents inside tensors: bitsandbytes quant state, torchao metadata ---------------------------


def edit_quant_state(d: Path, fn: Callable[[dict], None]) -> str:
    name = next(n for n in load_file(d / "model.safetensors") if n.startswith(f"{DOWN}.weight.quant_state."))

    def edit(t: dict[str, torch.Tensor]) -> None:
        qs = json.loads(bytes(t[name].tolist()).decode())
        fn(qs)
        t[name] = torch.tensor(list(json.dumps(qs).encode()), dtype=torch.uint8)

    edit_tensors(d, edit)
    return name


@pytest.mark.parametrize(
    ("variant", "key", "value", "expected"),
    [
        ("bnb4-nf4", "blocksize", "64", "a positive integer"),
        ("bnb4-nf4", "blocksize", 64.5, "a positive integer"),
        ("bnb4-nf4", "blocksize", 0, "a positive integer"),
        ("bnb4-nf4", "shape", [True, 256], "a list of two positive integers"),
        ("bnb4-nf4", "shape", "128x256", "a list of two positive integers"),
        ("bnb4-nf4", "quant_type", None, "a string"),
        ("bnb4-nf4-dq", "nested_offset", "0.05", "a finite number"),
        ("bnb4-nf4-dq", "nested_offset", None, "a finite number"),
        ("bnb4-nf4-dq", "nested_blocksize", [256], "a positive integer"),
    ],
)
def test_a_wrong_quant_state_value_is_one_clear_error(
    tmp_path: Path, variant: str, key: str, value: Any, expected: str
) -> None:
    d = copy(tmp_path, variant)
    name = edit_quant_state(d, lambda qs: qs.update({key: value}))
    with pytest.raises(CheckpointError) as err:
        load_everything(d)
    assert str(err.value) == f"model.safetensors: {name}: {key}: expected {expected}, found {value!r}"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("block_size",), [1, "32"], "an integer"),
        (("block_size",), "1x32", "a list"),
        (("target_dtype",), "int4", "an object"),
        (("target_dtype", "_data"), 4, "a string"),
    ],
)
def test_wrong_torchao_metadata_is_one_clear_error(
    tmp_path: Path, path: tuple[str, ...], value: Any, expected: str
) -> None:
    d = copy(tmp_path, "torchao-intx-int4-g32")
    key = f"{DOWN}.weight"

    def metadata(meta: dict[str, str]) -> dict[str, str]:
        doc = json.loads(meta[key])
        node = doc["_data"]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        return {**meta, key: json.dumps(doc)}

    edit_tensors(d, lambda t: None, metadata)
    where = "_data." + ".".join(path) + ("[1]" if value == [1, "32"] else "")
    found = "'32'" if value == [1, "32"] else repr(value)
    with pytest.raises(CheckpointError) as err:
        load_everything(d)
    assert (
        str(err.value) == f"model.safetensors: metadata of {key}: {where}: expected {expected}, found {found}"
    )


def test_a_declared_shape_must_be_positive(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_tensors(d, lambda t: t.update({f"{DOWN}.weight_shape": torch.tensor([128, 0])}))
    with pytest.raises(
        CheckpointError, match=rf"{DOWN}.weight_shape: expected two positive sizes \[N, K\], found \[128, 0\]"
    ):
        load_everything(d)
