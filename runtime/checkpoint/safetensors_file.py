"""A safetensors file read as untrusted input: the header is validated before anything is read.

The header is parsed here (8-byte little-endian length, then JSON) and every tensor's dtype,
shape and byte range is checked against the file's real size, so a truncated file or a header
claiming more bytes than the file holds is one clear error and nothing of the claimed size is
ever allocated. The checks are the safetensors library's own: no name twice, the byte ranges
sorted by offset tile the data section exactly (no overlap, no alias, no gap, no trailing bytes). Tensor data is then read on demand, one tensor (or rows of one) at a time,
straight from its byte range: nothing maps the whole file, so a checkpoint larger than this
machine's memory opens, and reading one layer costs that layer. Nothing is ever unpickled.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .files import parse_json, regular_file

#: safetensors dtype names -> (torch dtype, bytes per element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
    "F8_E8M0": (torch.float8_e8m0fnu, 1),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
    "U16": (torch.uint16, 2),
    "U32": (torch.uint32, 4),
    "U64": (torch.uint64, 8),
}

MAX_HEADER = 100 * 2**20  # safetensors' own limit


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype, shape and byte range in the data section."""

    name: str
    file: Path
    dtype: torch.dtype
    dtype_name: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


#: reads at least this large are split into READ_PART pieces read by a thread pool: one thread
#: copies from the page cache at a fraction of memory bandwidth, and pread releases the GIL
PARALLEL_READ_BYTES = 64 << 20
READ_PART = 16 << 20
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _read_part(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break  # end of file: the caller reports the short read
        done += n
    return done


def read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``fd`` at ``offset`` (in parallel parts when large); returns bytes read."""
    global _pool
    size = len(view)
    if size < PARALLEL_READ_BYTES:
        return _read_part(fd, view, offset)
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1), "quantrt-read")
    starts = range(0, size, READ_PART)
    parts = [_pool.submit(_read_part, fd, view[s : s + READ_PART], offset + s) for s in starts]
    counts = [p.result() for p in parts]
    short = next((i for i, (s, c) in enumerate(zip(starts, counts)) if c < min(READ_PART, size - s)), None)
    return size if short is None else starts[short] + counts[short]


class TensorFile:
    """A validated file of tensors (safetensors, GGUF) read one byte range at a time.

    Subclasses parse their header into ``tensors`` (byte ranges relative to ``data_start``).
    """

    path: Path
    tensors: dict[str, TensorInfo]
    data_start: int

    def get(self, name: str) -> torch.Tensor:
        """The whole tensor, read from its byte range."""
        info = self._info(name)
        return self._read(info, info.start, info.nbytes).view(info.dtype).reshape(info.shape)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor's first dim, reading only those bytes."""
        info = self._info(name)
        if not info.shape or not 0 <= start <= stop <= info.shape[0]:
            raise CheckpointError(f"{self.path}: rows [{start}, {stop}) of {name!r} {list(info.shape)}")
        row = info.nbytes // info.shape[0] if info.shape[0] else 0
        data = self._read(info, info.start + start * row, (stop - start) * row)
        return data.view(info.dtype).reshape(stop - start, *info.shape[1:])

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        return self.tensors[name]

    def _read(self, info: TensorInfo, offset: int, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = read_into(fd, memoryview(buf.numpy()), self.data_start + offset)
        except OSError as e:
            raise CheckpointError(f"{self.path}: tensor {info.name!r}: cannot read: {e}") from None
        finally:
            os.close(fd)
        if got != nbytes:
            raise CheckpointError(
                f"{self.path}: tensor {info.name!r}: read {got} of {nbytes} bytes (file changed "
                "or truncated while open?)"
            )
        return buf


class SafetensorsFile(TensorFile):
    """One validated safetensors file; tensors are read on demand from their byte ranges."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.tensors, self.metadata, self.data_start = read_header(self.path)


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse and validate a safetensors header against the file's size."""
    size = regular_file(path)
    if size < 8:
        raise CheckpointError(
            f"{path}: truncated: {size} bytes, but a safetensors file starts with an 8-byte header length"
        )
    with path.open("rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > MAX_HEADER or 8 + hlen > size:
            raise CheckpointError(
                f"{path}: the header claims {hlen} bytes but the file holds {size - 8} after "
                "the length field (truncated or not a safetensors file)"
            )
        raw = f.read(hlen)
    header = parse_json(raw, f"{path}: the header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header must be a JSON object, found {type(header).__name__}")
    data_size = size - 8 - hlen
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: __metadata__ must be an object of strings")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(path, name, entry, data_size)
    _check_tiling(path, tensors, data_size)
    return tensors, {str(k): str(v) for k, v in metadata.items()}, 8 + hlen


def _check_tiling(path: Path, tensors: dict[str, TensorInfo], data_size: int) -> None:
    """The byte ranges, sorted, must tile the data section: the safetensors library's own rule, so
    two names cannot alias one tensor's bytes and no bytes hide between or after tensors."""
    spans = sorted(tensors.values(), key=lambda t: (t.start, t.end))
    end = 0
    for prev, t in itertools.pairwise([None, *spans]):
        if t.start != end:
            what = "overlap" if t.start < end else "leave a gap"
            before = f"{prev.name!r} [{prev.start}, {prev.end})" if prev else "the data section's start"
            raise CheckpointError(
                f"{path}: tensor {t.name!r} [{t.start}, {t.end}) and {before} {what}: the tensors' "
                "byte ranges must follow one another exactly"
            )
        end = t.end
    if end != data_size:
        raise CheckpointError(
            f"{path}: the tensors cover {end} bytes of the data section, but it holds {data_size} "
            "(trailing bytes no tensor owns)"
        )


def _tensor_info(path: Path, name: str, entry: Any, data_size: int) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise CheckpointError(f"{where}: expected dtype, shape and data_offsets, found {entry!r}")
    dtype_name = entry["dtype"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise CheckpointError(f"{where}: unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CheckpointError(f"{where}: shape must be a list of non-negative integers, found {shape!r}")
    offs = entry["data_offsets"]
    if not (
        isinstance(offs, list)
        and len(offs) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        and 0 <= offs[0] <= offs[1]
    ):
        raise CheckpointError(
            f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, found {offs!r}"
        )
    dtype, itemsize = DTYPES[dtype_name]
    want = math.prod(shape) * itemsize
    if offs[1] - offs[0] != want:
        raise CheckpointError(
            f"{where}: {dtype_name} {shape} needs {want} bytes, its data_offsets span {offs[1] - offs[0]}"
        )
    if offs[1] > data_size:
        raise CheckpointError(
            f"{where}: claims bytes [{offs[0]}, {offs[1]}) but the file's data section holds "
            f"only {data_size} bytes (truncated file?)"
        )
    return TensorInfo(name, path, dtype, dtype_name, tuple(shape), offs[0], offs[1])
