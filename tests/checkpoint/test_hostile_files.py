"""Checkpoints built to hurt: unbounded work from tiny files, files that are not files, paths out
of the folder, tensors that would silently vanish, and safetensors headers the library itself
refuses. Each gives one quantrt error naming the file or tensor, quickly.

The files are written by the real tools (gguf-py's GGUFWriter, safetensors) where a tool can
write them, and by hand where the point is a header no tool writes; the safetensors cases are
checked against the safetensors library's own reader, which must refuse them too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from fixture_edits import ROOT, copy
from safetensors import safe_open
from safetensors.torch import save_file

import quantrt
from quantrt.errors import CheckpointError

GPTQ = ROOT / "gptqmodel-gptq-w4g128-asym-v2"
SHARDED = ROOT / "autoround-gptq-w4g64-sym-sharded"


def refused(path: Path, pattern: str, seconds: float = 10.0) -> CheckpointError:
    """open_checkpoint(path) and its layer list raise one CheckpointError matching ``pattern``,
    within ``seconds`` (a hang or a long loop fails instead of stalling the suite)."""
    box: dict[str, BaseException | None] = {"error": None}

    def run() -> None:
        try:
            quantrt.open_checkpoint(path).layers  # noqa: B018 (the layer list is built lazily)
        except BaseException as e:
            box["error"] = e

    t0 = time.perf_counter()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{path}: still running after {seconds} s"
    err = box["error"]
    assert isinstance(err, CheckpointError), f"expected a CheckpointError, got {err!r}"
    assert re.search(pattern, str(err)), str(err)
    assert time.perf_counter() - t0 < seconds
    return err


# -- 1. unbounded work, files that are not regular files ----------------------------------------


def test_gguf_claiming_2_40_experts_of_nothing(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "experts.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor_info(
        "blk.0.ffn_up_exps.weight",
        (2**40, 4, 0),
        np.dtype(np.float32),
        0,
        raw_dtype=gguf.GGMLQuantizationType.F32,
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert path.stat().st_size < 16 * 1024
    refused(path, r"experts\.gguf: tensor 'blk\.0\.ffn_up_exps\.weight' has dims \[0, 4, 1099511627776\]")


def test_safetensors_experts_of_nothing(tmp_path: Path) -> None:
    """gpt-oss MXFP4 experts stacked [E, N, K/32, 16] with N = 0: no bytes back the 2^40 experts."""
    from safetensors.torch import load_file

    d = copy(tmp_path, "gptoss-mxfp4-handbuilt")
    tensors = load_file(d / "model.safetensors")
    stem = "model.layers.0.mlp.experts.down_proj"
    tensors[f"{stem}_blocks"] = torch.empty(2**40, 0, 2, 16, dtype=torch.uint8)
    tensors[f"{stem}_scales"] = torch.empty(2**40, 0, 2, dtype=torch.uint8)
    del tensors[f"{stem}_bias"]
    save_file(tensors, d / "model.safetensors")
    refused(d, r"down_proj_blocks: \[1099511627776, 0, 2, 16\] holds no elements")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "quantize_config.json"])
def test_side_file_that_is_a_fifo(tmp_path: Path, name: str) -> None:
    d = copy(tmp_path, GPTQ.name)
    (d / name).unlink(missing_ok=True)
    if name == "quantize_config.json":  # read only when config.json has no quantization_config
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("quantization_config")
        (d / "config.json").write_text(json.dumps(cfg))
    os.mkfifo(d / name)
    refused(d, rf"{name}: expected a regular file, found a FIFO")


def test_config_that_is_dev_zero(tmp_path: Path) -> None:
    d = copy(tmp_path, GPTQ.name)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    refused(d, r"config\.json: expected a regular file, found a device")


def test_config_that_is_huge(tmp_path: Path) -> None:
    d = copy(tmp_path, GPTQ.name)
    with (d / "config.json").open("r+b") as f:
        f.truncate(2**34)  # sparse: 16 GiB claimed, nothing written
    refused(d, r"config\.json: 17179869184 bytes; a JSON side file may hold at most")


def test_checkpoint_path_that_is_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.gguf")
    refused(tmp_path / "model.gguf", r"model\.gguf: expected a regular file, found a FIFO")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"model_type": "llama", "model_type": "gpt2"}', r"key 'model_type' appears twice"),
        ("[" * 100_000 + "]" * 100_000, r"JSON nested too deeply|not valid JSON"),
        ('{"vocab_size": ' + "9" * 5000 + "}", r"not valid JSON"),
        ('{"a": "\\ud800', r"not valid JSON"),
    ],
)
def test_config_json_that_json_cannot_hold(tmp_path: Path, text: str, pattern: str) -> None:
    d = copy(tmp_path, GPTQ.name)
    (d / "config.json").write_text(text)
    refused(d, rf"config\.json: {pattern}")


# -- 2. path containment ------------------------------------------------------------------------


def sharded_with(tmp_path: Path, edit: Callable[[Path, dict[str, str]], None]) -> Path:
    d = copy(tmp_path, SHARDED.name)
    index = d / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    edit(d, doc["weight_map"])
    index.write_text(json.dumps(doc))
    return d


def test_index_naming_a_file_outside_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"secret": torch.randn(4)}, outside)

    def edit(d: Path, wm: dict[str, str]) -> None:
        wm["secret"] = "../outside.safetensors"

    d = sharded_with(tmp_path, edit)
    refused(d, r"weight_map: '\.\./outside\.safetensors' resolves to .*outside the checkpoint folder")


def test_index_naming_an_absolute_path(tmp_path: Path) -> None:
    def edit(d: Path, wm: dict[str, str]) -> None:
        wm[next(iter(wm))] = "/etc/hostname"

    refused(sharded_with(tmp_path, edit), r"'/etc/hostname' is an absolute path")


def test_shard_symlinked_out_of_the_folder(tmp_path: Path) -> None:
    d = copy(tmp_path, SHARDED.name)
    shard = sorted(d.glob("model-*.safetensors"))[0]
    away = tmp_path / "elsewhere"
    away.mkdir()
    shutil.move(shard, away / shard.name)
    shard.symlink_to(away / shard.name)
    refused(d, rf"'{shard.name}' resolves to .*elsewhere.*outside the checkpoint folder")


def test_unindexed_file_symlinked_out_of_the_folder(tmp_path: Path) -> None:
    d = copy(tmp_path, GPTQ.name)
    away = tmp_path / "elsewhere.safetensors"
    shutil.move(d / "model.safetensors", away)
    (d / "model.safetensors").symlink_to(away)
    refused(d, r"'model\.safetensors' resolves to .*outside the checkpoint folder")


# -- 3. nothing silently lost -------------------------------------------------------------------


def test_quantized_checkpoint_without_config(tmp_path: Path) -> None:
    d = copy(tmp_path, GPTQ.name)
    (d / "config.json").unlink()
    for side in ("quantize_config.json", "quant_config.json"):
        (d / side).unlink(missing_ok=True)
    refused(
        d,
        r"tensors of quantized weights are read by no quantized layer, e\.g\. .*qweight.*no quantization config",
    )


def test_quantization_config_null(tmp_path: Path) -> None:
    d = copy(tmp_path, GPTQ.name)
    for side in ("quantize_config.json", "quant_config.json"):
        (d / side).unlink(missing_ok=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    refused(d, r"read by no quantized layer.*(qweight|qzeros|scales|g_idx)")


def test_tensor_listed_under_the_wrong_shard(tmp_path: Path) -> None:
    moved: list[str] = []

    def edit(d: Path, wm: dict[str, str]) -> None:
        shards = sorted(set(wm.values()))
        name = next(n for n, s in wm.items() if n.endswith(".qweight") and s == shards[0])
        wm[name] = shards[1]
        moved.append(name)

    d = sharded_with(tmp_path, edit)
    refused(d, rf"lists '{moved[0]}' in .*, which does not hold it \(it is in ")


def test_quantized_weight_stored_as_a_float_keeps_its_scales_in_view(tmp_path: Path) -> None:
    """A GPTQ layer whose qweight was replaced by a float weight: its scales/qzeros are left over,
    which is an error, not a dense layer that ignores them."""
    from safetensors.torch import load_file

    d = copy(tmp_path, GPTQ.name)
    tensors = load_file(d / "model.safetensors")
    victim = next(n for n in tensors if n.endswith(".qweight"))
    prefix = victim[: -len(".qweight")]
    K = tensors[victim].shape[0] * 8
    N = tensors[victim].shape[1]
    del tensors[victim]
    tensors[f"{prefix}.weight"] = torch.randn(N, K, dtype=torch.float16)
    save_file(tensors, d / "model.safetensors")
    err = refused(d, r"read by no quantized layer|has no|missing")
    assert prefix in str(err)


# -- 4. safetensors headers the library refuses --------------------------------------------------


def raw_safetensors(path: Path, header: str, data: bytes) -> Path:
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def f32x2(start: int, end: int) -> str:
    return json.dumps({"dtype": "F32", "shape": [2], "data_offsets": [start, end]})


def two(a: str, b: str, second: str = "b") -> str:
    return f'{{"a": {a}, "{second}": {b}}}'


@pytest.mark.parametrize(
    ("header", "nbytes", "pattern"),
    [
        (two(f32x2(0, 8), f32x2(4, 12)), 12, r"overlap"),
        (two(f32x2(0, 8), f32x2(0, 8)), 8, r"overlap"),
        (two(f32x2(0, 8), f32x2(12, 20)), 20, r"leave a gap"),
        (f'{{"a": {f32x2(0, 8)}}}', 12, r"trailing bytes no tensor owns"),
        (two(f32x2(0, 8), f32x2(8, 16), second="a"), 16, r"key 'a' appears twice"),
    ],
    ids=["overlap", "alias", "gap", "trailing", "duplicate"],
)
def test_safetensors_header_the_library_refuses(
    tmp_path: Path, header: str, nbytes: int, pattern: str
) -> None:
    path = raw_safetensors(tmp_path / "model.safetensors", header, bytes(nbytes))
    with pytest.raises(Exception, match=r"offset|covered|incomplete"):  # the library's own verdict
        with safe_open(str(path), "pt"):
            pass
    refused(path, rf"model\.safetensors: .*{pattern}")


def test_safetensors_written_by_the_library_still_open(tmp_path: Path) -> None:
    """The tiling rule holds for what the library writes, zero-size tensors included."""
    path = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.randn(3, 5), "empty": torch.empty(0, 7), "b": torch.arange(3)}, path)
    ckpt = quantrt.open_checkpoint(path)
    assert set(ckpt.index.names()) == {"a.weight", "empty", "b"}
    assert torch.equal(ckpt.index.read("b"), torch.arange(3))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_tokenizer_file_that_is_a_fifo(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from quantrt.models.tokenizer import load_tokenizer

    d = copy(tmp_path, GPTQ.name)
    os.mkfifo(d / "tokenizer.json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: expected a regular file, found a FIFO"):
        load_tokenizer(d)
