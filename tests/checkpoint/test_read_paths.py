"""The read paths a large load takes: a tensor split into parts read by a thread pool gives the
file's bytes (a short file is still one clear error), tensors read ahead are the tensors read,
and the one-reduction finiteness check finds a NaN or an infinity wherever it is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantrt.checkpoint import safetensors_file
from quantrt.checkpoint.safetensors_file import SafetensorsFile
from quantrt.errors import CheckpointError
from quantrt.formats.base import TensorIndex, check_finite


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safetensors_file, "PARALLEL_READ_BYTES", 1000)
    monkeypatch.setattr(safetensors_file, "READ_PART", 333)  # parts that end mid-element


def _file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(37, 61, generator=g).bfloat16(),
        "b.weight": torch.randn(5000, generator=g),
        "c.bias": torch.randn(3, generator=g).half(),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_parallel_parts_read_the_files_bytes(tmp_path: Path, small_parts: None) -> None:
    path, tensors = _file(tmp_path)
    f = SafetensorsFile(path)
    for name, t in tensors.items():
        assert torch.equal(f.get(name), t), name
    assert torch.equal(f.get_rows("a.weight", 3, 30), tensors["a.weight"][3:30])


def test_a_truncated_file_is_one_clear_error(tmp_path: Path, small_parts: None) -> None:
    path, _ = _file(tmp_path)
    f = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-7000])  # b.weight's tail is gone after the header was read
    with pytest.raises(CheckpointError, match=r"b\.weight.*read \d+ of 20000 bytes"):
        f.get("b.weight")


def test_prefetched_tensors_are_the_tensors_read(tmp_path: Path) -> None:
    path, tensors = _file(tmp_path)
    index = TensorIndex([SafetensorsFile(path)])
    index.prefetch(["a.weight", "c.bias", "not.there"])
    assert set(index._ahead) == {"a.weight", "c.bias"}
    assert torch.equal(index.read("a.weight"), tensors["a.weight"])
    assert "a.weight" not in index._ahead  # taken, not kept
    index.drop_prefetched()
    assert torch.equal(index.read("c.bias"), tensors["c.bias"])  # read again after the drop


def test_a_bad_value_read_ahead_is_the_same_error(tmp_path: Path) -> None:
    """Tensors read ahead (on the read-ahead threads, several at once) are checked as a direct read
    checks them: a NaN in a dense weight raises when that tensor is asked for, naming it."""
    t = torch.randn(64, 33)
    t[17, 5] = float("nan")
    path = tmp_path / "bad.safetensors"
    save_file({"x.weight": torch.randn(8, 8), "y.weight": t.bfloat16()}, str(path))
    index = TensorIndex([SafetensorsFile(path)])
    index.prefetch(["x.weight", "y.weight"])
    assert index.read("x.weight").shape == (8, 8)
    with pytest.raises(CheckpointError, match=r"bad\.safetensors: y\.weight: 1 of 2112 values are NaN"):
        index.read("y.weight")
    with pytest.raises(CheckpointError, match=r"y\.weight: 1 of 2112"):  # and without the read-ahead
        index.read("y.weight")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_finite_check_finds_every_position(dtype: torch.dtype, bad: float) -> None:
    t = torch.randn(3, 4099).to(dtype)
    check_finite(t, "ok")
    for pos in (0, 4099, 3 * 4099 - 1, 5000):
        u = t.clone()
        u.view(-1)[pos] = bad
        with pytest.raises(CheckpointError, match="x: 1 of 12297 values are NaN or infinite"):
            check_finite(u, "x")
    check_finite(torch.empty(0, 5, dtype=dtype), "empty")


# -- reading onto a device through pinned chunks (the CUDA load path; here on the CPU, where the
# same chunking runs without pinning or a side stream; tests/gpu runs it on a GPU) -----------------


@pytest.mark.parametrize("chunk", [7, 64, 1000, 1 << 20])  # chunks that end mid-element, one chunk
@pytest.mark.parametrize("ring", [1, 2, 3])
def test_staged_reads_are_the_files_tensors(tmp_path: Path, chunk: int, ring: int) -> None:
    from quantrt.checkpoint.staging import DeviceStaging

    path, tensors = _file(tmp_path)
    f = SafetensorsFile(path)
    staging = DeviceStaging("cpu", chunk_bytes=chunk, ring=ring)
    for name, t in tensors.items():
        got = staging.read(f.path, f.data_start, f.tensors[name])
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), name


def test_a_staged_read_of_a_truncated_file_is_one_clear_error(tmp_path: Path) -> None:
    from quantrt.checkpoint.staging import DeviceStaging

    path, _ = _file(tmp_path)
    f = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-7000])
    with pytest.raises(CheckpointError, match=r"b\.weight.*read \d+ of 20000 bytes"):
        DeviceStaging("cpu", chunk_bytes=4096).read(f.path, f.data_start, f.tensors["b.weight"])


def test_staging_takes_the_dense_weights_and_checks_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stage_to``: dense float weights and biases of at least STAGED_BYTES are read through the
    staging (read ahead too), still checked for NaN; integer codes and small tensors are not."""
    from quantrt.checkpoint import staging
    from quantrt.formats import base

    monkeypatch.setattr(base, "STAGED_BYTES", 100)
    staged: list[str] = []
    real = staging.DeviceStaging.read

    def spy(self: staging.DeviceStaging, path: Path, start: int, info: object) -> torch.Tensor:
        staged.append(info.name)  # type: ignore[attr-defined]
        return real(self, path, start, info)  # type: ignore[arg-type]

    monkeypatch.setattr(staging.DeviceStaging, "read", spy)
    g = torch.Generator().manual_seed(1)
    bad = torch.randn(40, 9, generator=g)
    bad[3, 3] = float("inf")
    tensors = {
        "a.weight": torch.randn(31, 17, generator=g).bfloat16(),
        "q.qweight": torch.randint(-(2**31), 2**31 - 1, (64, 8), dtype=torch.int32, generator=g),
        "n.weight": torch.randn(20, generator=g).bfloat16(),  # 40 bytes: under the bound
        "d.bias": torch.randn(300, generator=g).half(),
        "bad.weight": bad,
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    index = TensorIndex([SafetensorsFile(path)])
    index.stage_to("cpu")
    index.prefetch(["a.weight"])
    for name in ("a.weight", "q.qweight", "n.weight", "d.bias"):
        assert torch.equal(index.read(name), tensors[name]), name
    with pytest.raises(CheckpointError, match=r"m\.safetensors: bad\.weight: 1 of 360 values"):
        index.read("bad.weight")
    assert sorted(staged) == ["a.weight", "bad.weight", "d.bias"]
    index.stage_to(None)
    staged.clear()
    assert torch.equal(index.read("a.weight"), tensors["a.weight"]) and not staged
