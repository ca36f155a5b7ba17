"""The safetensors reader treats files as untrusted: every bad header is one clear error."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantrt.checkpoint import open_checkpoint
from quantrt.checkpoint.safetensors_file import SafetensorsFile
from quantrt.errors import CheckpointError


def write_raw(path: Path, header: dict, data: bytes = b"", length: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


def test_reads_what_safetensors_wrote(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(7, 5, generator=g).half(),
        "b": torch.randint(-9, 9, (4, 3), generator=g).int(),
        "c": torch.randn(3, generator=g).to(torch.float8_e4m3fn),
        "d": torch.randn(6, 2).bfloat16(),
    }
    save_file(tensors, tmp_path / "x.safetensors")
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for name, t in tensors.items():
        got = f.get(name)
        assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8))
    assert torch.equal(f.get_rows("a", 2, 5), tensors["a"][2:5])


def test_truncated_file(tmp_path: Path) -> None:
    save_file({"w": torch.randn(64, 64)}, tmp_path / "model.safetensors")
    p = tmp_path / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: tensor 'w': claims bytes \[0, 16384\) but the "
        r"file's data section holds only 16284 bytes",
    ):
        open_checkpoint(tmp_path)
    p.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="truncated: 2 bytes"):
        open_checkpoint(p)


def test_header_claiming_more_than_the_file_holds(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    write_raw(p, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, length=2**40)
    t0 = time.perf_counter()
    with pytest.raises(
        CheckpointError, match=r"the header claims 1099511627776 bytes but the file holds \d+"
    ):
        open_checkpoint(tmp_path)
    assert time.perf_counter() - t0 < 1.0  # nothing of the claimed size was read or allocated
    huge = {"w": {"dtype": "F32", "shape": [2**20, 2**20], "data_offsets": [0, 2**42]}}
    write_raw(p, huge)
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'w': claims bytes \[0, 4398046511104\) but the file's data "
        r"section holds only 0 bytes",
    ):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "entry,message",
    [
        (
            {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
            r"F32 \[3\] needs 12 bytes, its data_offsets span 8",
        ),
        ({"dtype": "Q4", "shape": [3], "data_offsets": [0, 3]}, "unknown dtype 'Q4'"),
        (
            {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
            "shape must be a list of non-negative integers",
        ),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "data_offsets must be"),
        ({"dtype": "F32"}, "expected dtype, shape and data_offsets"),
    ],
)
def test_bad_tensor_entries(tmp_path: Path, entry: dict, message: str) -> None:
    write_raw(tmp_path / "model.safetensors", {"w": entry}, b"\0" * 16)
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(tmp_path)


def test_header_not_json(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(CheckpointError, match="the header: not valid JSON"):
        open_checkpoint(tmp_path)


def test_pickle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02not really")
    with pytest.raises(CheckpointError, match="never unpickles"):
        open_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="never unpickles"):
        open_checkpoint(tmp_path / "pytorch_model.bin")


def test_index_naming_missing_files(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        )
    )
    with pytest.raises(
        CheckpointError, match=r"names files that are not there: model-00002-of-00002\.safetensors"
    ):
        open_checkpoint(tmp_path)


def test_no_such_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file or directory"):
        open_checkpoint(tmp_path / "nope")
