"""A GGUF file (v2/v3, little-endian) read as untrusted input, with SafetensorsFile's interface.

The header (metadata key/values, then one info entry per tensor) is parsed here by a bounded
reader: every count and length is compared with the bytes left in the file *before* anything is
looped over or allocated, so a header claiming 2^60 tensors or a 2^62-byte string fails at once.
Each tensor's type, shape, alignment and byte range is then checked against the file's size.
Tensor data is read on demand from its byte range, as SafetensorsFile does.

Shapes: a quantized tensor (Q4_K ...) is uint8 ``(rows, bytes per row)`` where ``rows`` is the
product of every dim beyond ``ne0`` (llama.cpp's blocks run along ``ne0``, each row independent);
a plain tensor (F32, F16, BF16, F64, I8..I64) has its torch dtype and PyTorch order
``[..., ne1, ne0]``. ``dims`` keeps GGUF's own fastest-first order.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..errors import CheckpointError
from ..schemes import GGUF_TYPES
from .files import regular_file
from .safetensors_file import TensorFile, TensorInfo

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8

#: every ggml type id llama.cpp has assigned, so an unsupported one is refused by name
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    4: "Q4_2",
    5: "Q4_3",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    34: "TQ1_0",
    35: "TQ2_0",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
    39: "MXFP4",
    40: "NVFP4",
    41: "Q1_0",
}

#: plain (unblocked) types -> torch dtype
PLAIN_TYPES: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}

#: block types read as another scheme's canonical tensors (not kept as native GGUF blocks):
#: MXFP4, 32 elements in 17 bytes (an e8m0 exponent byte, then 16 bytes of e2m1 nibbles), read as
#: canonical ``mxfp4`` (see quantrt.formats.gguf)
CONVERTED_TYPES: dict[str, tuple[int, int]] = {"MXFP4": (32, 17)}

#: readable type name -> (elements per block, bytes per block): plain types, quantrt's GGUF schemes
#: and the converted block types
TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    **{name: (1, dt.itemsize) for name, dt in PLAIN_TYPES.items()},
    **{t.upper(): (b, n) for t, (b, n, _) in GGUF_TYPES.items()},
    **CONVERTED_TYPES,
}

#: metadata value types: id -> (name, struct format or None, smallest encoded size in bytes)
VALUE_TYPES: dict[int, tuple[str, str | None, int]] = {
    0: ("u8", "B", 1),
    1: ("i8", "b", 1),
    2: ("u16", "H", 2),
    3: ("i16", "h", 2),
    4: ("u32", "I", 4),
    5: ("i32", "i", 4),
    6: ("f32", "f", 4),
    7: ("bool", "?", 1),
    8: ("string", None, 8),
    9: ("array", None, 12),
    10: ("u64", "Q", 8),
    11: ("i64", "q", 8),
    12: ("f64", "d", 8),
}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")

#: smallest encodings, to bound counts before looping: key (len only) + type + 1-byte value;
#: name (len only) + n_dims + one dim + type + offset
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8


class _Header:
    """A bounded sequential reader: no read, and no count it returns, can exceed the file."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, msg: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {msg}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise self.fail(
                f"{what}: needs {n} bytes at offset {self.pos} but the file has {self.left()} left "
                "(truncated, or not a GGUF file)"
            )
        raw = self.f.read(n)
        if len(raw) != n:
            raise self.fail(f"{what}: read {len(raw)} of {n} bytes at offset {self.pos} (file changed?)")
        self.pos += n
        return raw

    def unpack(self, fmt: str, what: str) -> Any:
        (value,) = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))
        return value

    def count(self, n: int, unit: int, what: str) -> int:
        """``n`` items of at least ``unit`` bytes each must fit in what is left of the file."""
        if n * unit > self.left():
            raise self.fail(
                f"{what} is {n}, but {n} x at least {unit} bytes cannot fit in the {self.left()} bytes "
                f"left at offset {self.pos} (corrupt header)"
            )
        return n

    def strings(self, n: int, what: str) -> list[str]:
        """``n`` strings (an array value): one tight loop, messages built only on error, because
        tokenizer arrays hold hundreds of thousands of them."""
        out: list[str] = []
        read, pos, size = self.f.read, self.pos, self.size
        for j in range(n):
            head = read(8) if pos + 8 <= size else b""
            if len(head) != 8:
                self.pos = pos
                raise self.fail(f"{what}[{j}] length: needs 8 bytes at offset {pos} (truncated file?)")
            m = _U64.unpack(head)[0]
            pos += 8
            raw = read(m) if m <= size - pos else b""
            if len(raw) != m:
                self.pos = pos
                raise self.fail(
                    f"{what}[{j}]: string length {m} cannot fit in the {size - pos} bytes left at "
                    f"offset {pos} (corrupt header)"
                )
            pos += m
            out.append(raw.decode("utf-8", errors="surrogateescape"))
        self.pos = pos
        return out

    def string(self, what: str, strict: bool = True) -> str:
        n = self.unpack("Q", f"{what} length")
        if n > self.left():
            raise self.fail(
                f"{what}: string length {n} cannot fit in the {self.left()} bytes left at offset "
                f"{self.pos} (corrupt header)"
            )
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8", errors="strict" if strict else "surrogateescape")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: not valid UTF-8: {e}") from None


class GGUFFile(TensorFile):
    """One validated GGUF file; tensors are read on demand from their byte ranges."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.version = 0
        self.alignment = DEFAULT_ALIGNMENT
        self.data_start = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, str] = {}
        #: element type of each top-level array value ("array" for arrays of arrays)
        self.array_types: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.ggml_types: dict[str, str] = {}
        self.dims: dict[str, tuple[int, ...]] = {}
        self._parse()

    # -- parsing the header ----------------------------------------------------------------------
    def _parse(self) -> None:
        size = regular_file(self.path)
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read: {e}") from None
        with f:
            h = _Header(f, self.path, size)
            self._preamble(h)
            n_tensors = h.unpack("Q", "tensor count")
            n_kv = h.unpack("Q", "metadata count")
            h.count(n_kv, MIN_KV_BYTES, "the metadata count")
            h.count(n_tensors, MIN_TENSOR_INFO_BYTES, "the tensor count")
            for i in range(n_kv):
                self._kv(h, i)
            self.alignment = self._alignment()
            h.count(n_tensors, MIN_TENSOR_INFO_BYTES, "the tensor count")
            raw = [self._tensor_info(h, i) for i in range(n_tensors)]
            self.data_start = -(-h.pos // self.alignment) * self.alignment
        for name, dims, type_id, offset in raw:
            self._add_tensor(name, dims, type_id, offset, size)
        self._check_overlaps()

    def _preamble(self, h: _Header) -> None:
        magic = h.take(4, "magic")
        if magic != MAGIC:
            raise h.fail(f"bad magic: expected {MAGIC!r}, found {magic!r} (not a GGUF file)")
        raw = h.take(4, "version")
        version = struct.unpack("<I", raw)[0]
        swapped = struct.unpack(">I", raw)[0]
        if version not in (1, *VERSIONS) and swapped in (1, *VERSIONS):
            raise h.fail(
                f"a big-endian GGUF file (version field reads {swapped} big-endian); "
                "only little-endian GGUF is supported"
            )
        if version not in VERSIONS:
            raise h.fail(f"unsupported GGUF version {version}: expected one of {list(VERSIONS)}")
        self.version = version

    def _kv(self, h: _Header, i: int) -> None:
        key = h.string(f"metadata key #{i}")
        if key in self.metadata:
            raise h.fail(f"metadata key {key!r} appears twice")
        vtype = h.unpack("I", f"metadata {key!r} value type")
        if vtype == ARRAY:
            etype = h.unpack("I", f"metadata {key!r} array element type")
            self.metadata[key] = self._array(h, etype, f"metadata {key!r}", 0)
            self.array_types[key] = VALUE_TYPES[etype][0]
        else:
            self.metadata[key] = self._value(h, vtype, f"metadata {key!r}", 0)
        self.metadata_types[key] = VALUE_TYPES[vtype][0]

    def _value(self, h: _Header, vtype: int, what: str, depth: int) -> Any:
        if vtype not in VALUE_TYPES:
            raise h.fail(f"{what}: unknown value type {vtype}; known: 0-12 ({_type_list()})")
        fmt = VALUE_TYPES[vtype][1]
        if fmt is not None:
            return h.unpack(fmt, what)
        if vtype == STRING:
            return h.string(what, strict=False)
        return self._array(h, h.unpack("I", f"{what} array element type"), what, depth)

    def _array(self, h: _Header, etype: int, what: str, depth: int) -> list[Any]:
        if depth >= MAX_ARRAY_DEPTH:
            raise h.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        if etype not in VALUE_TYPES:
            raise h.fail(f"{what}: unknown array element type {etype}; known: 0-12 ({_type_list()})")
        ename, efmt, esize = VALUE_TYPES[etype]
        n = h.count(h.unpack("Q", f"{what} array length"), esize, f"{what}: the array length ({ename})")
        if efmt is not None:
            return list(struct.unpack(f"<{n}{efmt}", h.take(n * esize, what)))
        if etype == STRING:
            return h.strings(n, what)
        return [self._value(h, etype, f"{what}[{j}]", depth + 1) for j in range(n)]

    def _alignment(self) -> int:
        a = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(a, int) or isinstance(a, bool) or a <= 0 or a & (a - 1):
            raise CheckpointError(
                f"{self.path}: metadata 'general.alignment' must be a positive power of two, found {a!r}"
            )
        return a

    def _tensor_info(self, h: _Header, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = h.string(f"tensor #{i} name")
        if name in self.dims:
            raise h.fail(f"tensor {name!r} is listed twice")
        n_dims = h.unpack("I", f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise h.fail(f"tensor {name!r}: n_dims must be 1..{MAX_DIMS}, found {n_dims}")
        dims = struct.unpack(f"<{n_dims}Q", h.take(8 * n_dims, f"tensor {name!r} dims"))
        if math.prod(d for d in dims if d) >= 2**63:  # ggml's own bound (int64 element counts)
            raise h.fail(f"tensor {name!r}: dims {list(dims)} overflow a 64-bit element count")
        type_id = h.unpack("I", f"tensor {name!r} type")
        offset = h.unpack("Q", f"tensor {name!r} offset")
        self.dims[name] = tuple(dims)
        return name, tuple(dims), type_id, offset

    def _add_tensor(self, name: str, dims: tuple[int, ...], type_id: int, offset: int, size: int) -> None:
        where = f"{self.path}: tensor {name!r}"
        tname = GGML_TYPE_NAMES.get(type_id)
        if tname is None:
            raise CheckpointError(f"{where}: unknown ggml type id {type_id}")
        if tname not in TYPE_BLOCKS:
            raise CheckpointError(
                f"{where}: type {tname} is not supported yet; supported: {', '.join(TYPE_BLOCKS)}"
            )
        B, T = TYPE_BLOCKS[tname]
        ne0, rows = dims[0], math.prod(dims[1:])
        if ne0 % B:
            raise CheckpointError(
                f"{where}: {tname} row length ne0={ne0} is not a whole number of {B}-element blocks"
            )
        nbytes = ne0 // B * T * rows
        if offset % self.alignment:
            raise CheckpointError(
                f"{where}: offset {offset} is not a multiple of general.alignment {self.alignment}"
            )
        data_size = max(size - self.data_start, 0)
        if offset + nbytes > data_size:
            raise CheckpointError(
                f"{where}: {tname} {list(dims)} needs bytes [{offset}, {offset + nbytes}) of the data "
                f"section, but it holds only {data_size} bytes (truncated file?)"
            )
        if tname in PLAIN_TYPES:
            dtype, shape = PLAIN_TYPES[tname], tuple(reversed(dims))
        else:
            dtype, shape = torch.uint8, (rows, ne0 // B * T)
        self.tensors[name] = TensorInfo(name, self.path, dtype, tname, shape, offset, offset + nbytes)
        self.ggml_types[name] = tname

    def _check_overlaps(self) -> None:
        spans = sorted(self.tensors.values(), key=lambda t: (t.start, t.end))
        for a, b in itertools.pairwise(spans):
            if b.start < a.end and b.nbytes and a.nbytes:
                raise CheckpointError(
                    f"{self.path}: tensors {a.name!r} [{a.start}, {a.end}) and {b.name!r} "
                    f"[{b.start}, {b.end}) overlap in the data section"
                )


def _type_list() -> str:
    return ", ".join(f"{k} {v[0]}" for k, v in VALUE_TYPES.items())
