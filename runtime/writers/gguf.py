"""A GGUF file re-quantized into another GGUF file that llama.cpp and gguf-py read.

The source is a GGUF (any type quantrt decodes: F32/F16/BF16 and the llama.cpp block types); every
2-D-or-more ``*.weight`` tensor whose rows are whole blocks of the target type is decoded to fp32
(``reference.gguf.dequantize_blocks``, equal to llama.cpp's dequantizers) and re-encoded by
round to nearest (``reference.gguf.quantize_blocks``: the legacy types byte-equal to llama.cpp's
``quantize_row_*_ref``); a K-quant target falls back as llama.cpp's quantizer does where rows are not whole 256-element
super-blocks (Q4_K -> Q5_0 ...); everything else (norms, routers, types quantrt does not decode,
rows that are not whole blocks) is copied byte for byte, and so is every metadata key (tokenizer, chat
template, hyperparameters) except ``general.file_type``, which names the new type. The file is
written by gguf-py's ``GGUFWriter``, one tensor at a time, so host memory stays one output tensor
plus one chunk of rows in fp32.

Overrides and skips are fnmatch patterns on the tensor name without ``.weight``
(``blk.0.ffn_down``, ``output``, ``token_embd``), as in ``OnlineQuantization``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError
from ..formats.online import OnlineQuantization
from ..formats.patterns import compile_patterns
from ..reference.gguf import BLOCK, dequantize_blocks, quantize_blocks
from ..schemes import SchemeError, parse_scheme

#: tensors kept as stored unless an override names them: MoE routers, positional embeddings and
#: state-space convolutions, which llama.cpp's quantizer also leaves in float
DEFAULT_SKIP = ("*ffn_gate_inp*", "*pos_embd*", "*ssm_conv1d*")
#: rows decoded and re-encoded at a time (bounds the fp32 temporaries)
CHUNK_ROWS = 4096
#: llama.cpp's ``general.file_type`` (LLAMA_FTYPE_MOSTLY_*) for a file whose weights are one type
FILE_TYPES = {
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k": 11,
    "q4_k": 14,
    "q5_k": 16,
    "q6_k": 18,
}
#: quantrt's metadata type names -> gguf-py's GGUFValueType names
VALUE_TYPES = {
    "u8": "UINT8", "i8": "INT8", "u16": "UINT16", "i16": "INT16", "u32": "UINT32", "i32": "INT32",
    "f32": "FLOAT32", "bool": "BOOL", "string": "STRING", "array": "ARRAY", "u64": "UINT64",
    "i64": "INT64", "f64": "FLOAT64",
}  # fmt: skip
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class _Plan:
    name: str
    source: str  # ggml type name as stored
    target: str  # ggml type name written
    shape: tuple[int, ...]  # numpy order (reversed ne)
    targeted: bool  # chosen for re-quantization (False: copied as stored)


def _gguf_type(scheme: str, where: str) -> str:
    try:
        s = parse_scheme(scheme)
    except SchemeError as e:
        raise CheckpointError(f"{where}: {e}") from None
    if s.weight != "gguf":
        raise CheckpointError(
            f"{where}: {s.name} is not a GGUF type; the GGUF writer takes "
            f"{', '.join('gguf-' + t for t in FILE_TYPES)}"
        )
    return s.gguf_type


#: what llama.cpp's quantizer writes instead of a K-quant when a row is not whole 256-element
#: super-blocks (its ``llama_tensor_get_type`` fallbacks)
FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def fitted(target: str | None, row: int) -> str | None:
    """The type a row of ``row`` elements is written in: the target, llama.cpp's fallback for a
    K-quant, or None (kept as it is) when no whole blocks fit."""
    if target is not None and row % BLOCK[target][0]:
        target = FALLBACK.get(target)
    return target if target is not None and row % BLOCK[target][0] == 0 else None


class TypeRules:
    """An OnlineQuantization's scheme, overrides and skips as GGUF types by tensor name (the name
    without ``.weight``): the first matching override wins, then the skips, then the scheme."""

    def __init__(self, spec: OnlineQuantization) -> None:
        self.default = _gguf_type(spec.scheme, "scheme")
        patterns = compile_patterns(spec.overrides, "overrides", glob=True)
        self.overrides = [
            (p, None if v is None else _gguf_type(v, f"override {p.text!r}"))
            for p, v in zip(patterns, spec.overrides.values(), strict=True)
        ]
        self.skips = compile_patterns(spec.skip, "skip", glob=True)

    def target(self, gguf_name: str) -> str | None:
        """The GGUF type (``q8_0`` ...) for this tensor, or None to keep it as it is."""
        base = gguf_name.removesuffix(".weight")
        for pattern, t in self.overrides:
            if pattern.match(base):
                return t
        return None if any(p.match(base) for p in self.skips) else self.default


def _plans(src: Any, spec: OnlineQuantization) -> list[_Plan]:
    rules = TypeRules(spec)
    plans = []
    for name, stored in src.ggml_types.items():
        shape = tuple(reversed(src.dims[name]))
        target = fitted(rules.target(name), shape[-1])
        decodable = stored in FLOAT_TYPES or stored.lower() in BLOCK
        if target is None or not name.endswith(".weight") or len(shape) < 2 or not decodable:
            plans.append(_Plan(name, stored, stored, shape, False))
        else:  # one already of the target type is copied byte for byte (re-encoding could move it)
            plans.append(_Plan(name, stored, target.upper(), shape, True))
    return plans


def gguf_module() -> Any:
    """gguf-py, or the error that says how to get it."""
    try:
        import gguf
    except ImportError:
        raise CheckpointError("writing GGUF needs the gguf package (pip install gguf)") from None
    return gguf


def as_spec(quantize: str | OnlineQuantization) -> OnlineQuantization:
    """``quantize`` as rules; a bare scheme takes the GGUF default skips."""
    if isinstance(quantize, OnlineQuantization):
        return quantize
    return OnlineQuantization(quantize, skip=DEFAULT_SKIP)


@contextlib.contextmanager
def gguf_writer(dst: Path, arch: str) -> Iterator[Any]:
    """A GGUFWriter for the new file ``dst``; on any error the partial file is removed."""
    if dst.exists():
        raise CheckpointError(f"{dst}: the destination exists")
    writer = gguf_module().GGUFWriter(str(dst), arch)
    try:
        yield writer
    except BaseException:
        writer.close()
        dst.unlink(missing_ok=True)
        raise
    writer.close()


def stream_tensors(
    writer: Any,
    tensors: list[tuple[str, tuple[int, ...], str]],
    data: Callable[[int], torch.Tensor],
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Write the header, the metadata already added, the infos of ``tensors`` (name, shape in
    numpy order, ggml type name), then tensor i's bytes from ``data(i)``, one at a time."""
    G = gguf_module().GGMLQuantizationType
    sizes = gguf_module().GGML_QUANT_SIZES
    for name, shape, kind in tensors:
        B, T = sizes[G[kind]]
        row = shape[-1] // B * T
        writer.add_tensor_info(name, (*shape[:-1], row), np.uint8, math.prod(shape[:-1]) * row, G[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i in range(len(tensors)):
        writer.write_tensor_data(data(i).contiguous().view(torch.uint8).numpy().reshape(-1))
        if progress is not None:
            progress(i + 1, len(tensors))


def _decode(rows: torch.Tensor, stored: str) -> torch.Tensor:
    if stored in FLOAT_TYPES:
        return rows.view(FLOAT_TYPES[stored]).float()
    return dequantize_blocks(rows, stored)


def _tensor_bytes(src: Any, plan: _Plan) -> torch.Tensor:
    """The plan's output tensor's bytes."""
    rows = math.prod(plan.shape[:-1])
    raw = src.get(plan.name).view(torch.uint8).reshape(-1)
    if plan.target == plan.source:
        return raw
    raw = raw.reshape(rows, -1)
    B, T = BLOCK[plan.target.lower()]
    out = torch.empty(rows, plan.shape[-1] // B * T, dtype=torch.uint8)
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        w = _decode(raw[start:stop], plan.source)
        if not bool(torch.isfinite(w).all()):
            raise CheckpointError(f"{src.path}: tensor {plan.name!r} rows [{start}, {stop}) are not finite")
        out[start:stop] = quantize_blocks(w, plan.target.lower())
    return out


def _copy_metadata(writer: Any, src: Any, gguf: Any, file_type: int | None) -> None:
    V = gguf.GGUFValueType
    for key, value in src.metadata.items():
        if key == "general.architecture":
            continue  # GGUFWriter writes it from its arch argument
        if key == "general.alignment":
            writer.add_custom_alignment(value)
            continue
        if key == "general.file_type" and file_type is not None:
            value = file_type
        vtype = V[VALUE_TYPES[src.metadata_types[key]]]
        sub = None
        if vtype == V.ARRAY:
            ename = src.array_types[key]
            if ename == "array":
                raise CheckpointError(
                    f"{src.path}: metadata {key!r} is an array of arrays, not copied by gguf-py"
                )
            if not value:
                raise CheckpointError(
                    f"{src.path}: metadata {key!r} is an empty array, which gguf-py cannot write"
                )
            sub = V[VALUE_TYPES[ename]]
            if sub == V.STRING:
                value = [v.encode("utf-8", "surrogateescape") for v in value]
        elif vtype == V.STRING:
            value = value.encode("utf-8", "surrogateescape")
        writer.add_key_value(key, value, vtype, sub_type=sub)
    if file_type is not None and "general.file_type" not in src.metadata:
        writer.add_file_type(file_type)


def write_gguf(
    src: str | Path,
    dst: str | Path,
    quantize: str | OnlineQuantization,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Re-quantize the GGUF ``src`` into the new file ``dst``; returns a summary (tensors per
    written type, tensors copied as stored, bytes)."""
    from ..checkpoint.gguf_file import GGUFFile

    gguf = gguf_module()
    spec, src, dst = as_spec(quantize), Path(src), Path(dst)
    if dst.exists():
        raise CheckpointError(f"{dst}: the destination exists")
    f = GGUFFile(src)
    arch = f.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise CheckpointError(f"{src}: no general.architecture in the metadata; llama.cpp needs one")
    plans = _plans(f, spec)
    converted = [p for p in plans if p.targeted]
    if not converted:
        raise CheckpointError(
            f"{src}: no tensor to re-quantize to {spec.scheme} (every one skipped or not whole blocks)"
        )
    targets = {p.target for p in converted}
    file_type = FILE_TYPES.get(targets.pop().lower()) if len(targets) == 1 else None
    with gguf_writer(dst, arch) as writer:
        _copy_metadata(writer, f, gguf, file_type)
        infos = [(p.name, p.shape, p.target) for p in plans]
        stream_tensors(writer, infos, lambda i: _tensor_bytes(f, plans[i]), progress)
    written: dict[str, int] = {}
    for p in converted:
        written[p.target] = written.get(p.target, 0) + 1
    return {
        "source": str(src),
        "destination": str(dst),
        "format": "gguf",
        "tensors": written,
        "copied_as_stored": sorted(p.name for p in plans if not p.targeted),
        "bytes_written": dst.stat().st_size,
        "source_bytes": src.stat().st_size,
    }
