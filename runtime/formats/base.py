"""What every format reader shares: the tensor index, the layer entry, and checks that turn
bad checkpoints into one clear error.

A format is two things: a *reader* that recognises its config and names each layer's scheme
and stored tensors (``layers()``), and an *adapter* per scheme that describes those stored
tensors with TensorSpecs (so tensor parallelism can cut them) and converts them to canonical
tensors. Adapters are data transformations only: no kernels, no device logic. An adapter's
TensorSpecs are the canonical ones (``canonical_specs``) restated through :func:`stored_specs`,
so a format states only what it stores differently: names, dtypes, packing, a transpose.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, ClassVar, Protocol

import torch

from ..canonical import CanonicalWeight
from ..checkpoint.safetensors_file import SafetensorsFile, TensorInfo
from ..errors import CheckpointError
from ..reference.intq import all_finite
from ..schemes import Scheme
from ..specs import TensorSpec
from .schema import Config, config_path, validate

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_DTYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float8_e8m0fnu: "fp32",
}  # e8m0 (power-of-two) scales are exact in fp32
#: a scheme's ``scale_dtype`` as the dtype integer and fp8 formats store their scales in
SCALE_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: what scales may be stored as (e8m0: DeepGEMM's power-of-two block scales)
SCALE_DTYPES = (*FLOAT_DTYPES, torch.float8_e8m0fnu)
#: rows converted at a time, so a layer's conversion never holds much more than the layer
CHUNK_ROWS = 256
#: elements checked for NaN at a time, so a check's scratch stays small beside a large tensor
FINITE_CHUNK = 1 << 22
#: unquantized tensors whose values must be finite when read: a layer's weight or bias, a norm
FINITE_SUFFIXES = (".weight", ".bias")


#: the smallest dense tensor :meth:`TensorIndex.stage_to` reads onto its device (smaller ones:
#: norms, small biases, go through host memory, where one more copy costs nothing)
STAGED_BYTES = 1 << 20
#: whole tensors read ahead at most (``TensorIndex.prefetch``)
PREFETCH_TENSORS = 8
_prefetch_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _prefetcher() -> concurrent.futures.ThreadPoolExecutor:
    """The read-ahead threads: the next layer's tensors are read concurrently (pread releases the
    GIL; one thread copies from the page cache at a fraction of what the memory can do)."""
    global _prefetch_pool
    if _prefetch_pool is None:
        _prefetch_pool = concurrent.futures.ThreadPoolExecutor(
            min(4, os.cpu_count() or 1), "quantrt-prefetch"
        )
    return _prefetch_pool


class TensorIndex:
    """Every tensor of a checkpoint by name, across its safetensors files (headers only).

    Reading an unquantized 16/32-bit float ``*.weight`` or ``*.bias`` (a dense layer, a bias, a
    norm), or a tensor named in ``finite``, checks that every value is finite: NaN in a dense
    weight or bias would otherwise pass silently into every output it touches.
    """

    def __init__(self, files: Iterable[SafetensorsFile], owner: Mapping[str, str] | None = None) -> None:
        self.files = list(files)
        self.info: dict[str, TensorInfo] = {}
        self._file: dict[str, SafetensorsFile] = {}
        self.finite: set[str] = set()
        for f in self.files:
            for name, info in f.tensors.items():
                if owner is not None and owner.get(name, f.path.name) != f.path.name:
                    continue
                if name in self.info:
                    raise CheckpointError(
                        f"tensor {name!r} is stored twice: in {self.info[name].file} and {f.path}"
                    )
                self.info[name] = info
                self._file[name] = f

    def __contains__(self, name: str) -> bool:
        return name in self.info

    def names(self) -> list[str]:
        return list(self.info)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info[name].shape

    def dtype(self, name: str) -> torch.dtype:
        return self.info[name].dtype

    def read(self, name: str) -> torch.Tensor:
        if name not in self.info:
            raise CheckpointError(f"missing tensor {name!r}")
        ahead = self._ahead.pop(name, None) if hasattr(self, "_ahead") else None
        return ahead.result() if ahead is not None else self._read_checked(name)

    def stage_to(self, device: torch.device | str | None) -> None:
        """Read the dense 16/32-bit weights and biases of at least :data:`STAGED_BYTES` straight
        onto ``device`` from now on (:class:`DeviceStaging`: pinned chunks, copies overlapping the
        reads); None reads every tensor into host memory again. A loader building its layers on
        a GPU sets it: those tensors only ever go there."""
        from ..checkpoint.staging import DeviceStaging

        self._staging = DeviceStaging(device) if device is not None else None

    def _read_checked(self, name: str) -> torch.Tensor:
        """The whole tensor from its file (onto the staging device where :meth:`stage_to` says),
        its values checked where :meth:`_checked` says (on a read-ahead thread too: a bad value
        raises when the tensor is asked for)."""
        f, info = self._file[name], self.info[name]
        staging = getattr(self, "_staging", None)  # once: a read-ahead thread may outlive stage_to(None)
        if (
            staging is not None
            and info.nbytes >= STAGED_BYTES
            and info.dtype in FLOAT_DTYPES
            and name.endswith(FINITE_SUFFIXES)
        ):
            return self._checked(name, staging.read(f.path, f.data_start, info))
        return self._checked(name, f.get(name))

    def prefetch(self, names: Iterable[str]) -> None:
        """Start reading these whole tensors in the background (a few threads), so the next layer's
        bytes come off the file while this one is converted and copied; ``read`` takes them.
        At most :data:`PREFETCH_TENSORS` wait at a time: the host holds about one layer more."""
        if not hasattr(self, "_ahead"):
            self._ahead: dict[str, concurrent.futures.Future[torch.Tensor]] = {}
        for name in names:
            if name in self.info and name not in self._ahead and len(self._ahead) < PREFETCH_TENSORS:
                self._ahead[name] = _prefetcher().submit(self._read_checked, name)

    def drop_prefetched(self) -> None:
        """Forget tensors read ahead and never asked for (after loading, or on an error)."""
        for f in getattr(self, "_ahead", {}).values():
            f.cancel()
        self._ahead = {}

    def read_index(self, name: str, i: int) -> torch.Tensor:
        """``tensor[i]`` of a stacked tensor (one MoE expert), reading only those bytes."""
        if name not in self.info:
            raise CheckpointError(f"missing tensor {name!r}")
        return self._checked(name, self._file[name].get_rows(name, i, i + 1)[0])

    def _checked(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if t.dtype in FLOAT_DTYPES and (name in self.finite or name.endswith(FINITE_SUFFIXES)):
            check_finite(t, self.where(name))
        return t

    def where(self, name: str) -> str:
        info = self.info.get(name)
        return f"{info.file.name}: {name}" if info else name


class Adapter(Protocol):
    """Stored tensors of one scheme in one format: their specs, and their canonical form."""

    name: str

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]: ...

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight: ...


@dataclass
class LayerEntry:
    """One layer of a checkpoint: its scheme (None when stored dense), shape and stored tensors.

    ``tensors`` maps the adapter's role names (``qweight``, ``scales`` ...) to checkpoint names.
    ``select`` picks one leading index of stacked tensors (an MoE expert) per role;
    ``constants`` are tensors the format keeps outside its tensors (a quant-state JSON field),
    handed to the adapter beside the stored ones. ``kind`` is ``linear``, ``embedding`` or
    ``expert``. ``extras`` names the other stored tensors the reader read for this layer (a
    declared shape, a quant-state blob, a layout flag), so a model loader can tell them from
    tensors nothing reads.
    """

    prefix: str
    scheme: Scheme | None
    N: int
    K: int
    tensors: dict[str, str]
    adapter: Any = None
    kind: str = "linear"
    bias: str | None = None
    dtype: torch.dtype | None = None
    notes: list[str] = field(default_factory=list)
    select: dict[str, int] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    extras: list[str] = field(default_factory=list)

    def stored_names(self) -> list[str]:
        """Every checkpoint tensor this layer is read from (its tensors, bias and extras)."""
        return [*self.tensors.values(), *([self.bias] if self.bias else []), *self.extras]

    @property
    def quantized(self) -> bool:
        return self.scheme is not None


class FormatReader(ABC):
    """Recognises one format's config and lays out the checkpoint's layers.

    ``schema`` declares the config keys the reader reads, with their types and bounds; the
    config is checked against it once, here, so the reader never meets a wrong type.
    """

    name: str = ""
    schema: ClassVar[type[Config] | None] = None

    def __init__(self, qconfig: Mapping[str, Any], index: TensorIndex, source: str) -> None:
        self.qconfig = dict(qconfig)
        self.index = index
        self.source = source  # which file the quantization config came from
        if self.schema is not None:
            validate(self.schema, self.qconfig, source)

    def at(self, *path: str | int) -> str:
        """``<file>: quantization_config.<path>``, how an error names a config key."""
        return config_path(self.source, *path)

    @abstractmethod
    def quantized_layers(self) -> dict[str, LayerEntry]:
        """Every quantized layer, keyed by prefix."""

    def ignored(self) -> dict[str, str]:
        """Stored tensors this format knowingly leaves unread, each with the reason (a model
        loader warns about these instead of refusing them as unexpected)."""
        return {}

    def layers(self) -> dict[str, LayerEntry]:
        """Quantized layers, then every other 2-D float weight as a dense layer."""
        quant = self.quantized_layers()
        claimed = {n for e in quant.values() for n in e.tensors.values()}
        out = dict(quant)
        out.update(dense_layers(self.index, claimed, set(quant)))
        # biases under other names (gpt-oss's ``*_bias``) are checked for NaN when read too
        self.index.finite.update(e.bias for e in out.values() if e.bias)
        return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))

    def cfg(self, *keys: str, default: Any = None, required: bool = False) -> Any:
        """The first of ``keys`` present in the quantization config."""
        for k in keys:
            if k in self.qconfig:
                return self.qconfig[k]
        if required:
            raise CheckpointError(f"{self.source}: the {self.name} quantization config has no {keys[0]!r}")
        return default


def natural_key(name: str) -> list[Any]:
    """Sort ``layers.10`` after ``layers.9``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


EMBEDDING_HINTS = ("embed", "wte", "wpe", "word_embeddings", "tok_embeddings")


def dense_layers(index: TensorIndex, claimed: set[str], quantized: set[str]) -> dict[str, LayerEntry]:
    """Unquantized 2-D float ``*.weight`` tensors: plain 16-bit linears (or embeddings)."""
    out: dict[str, LayerEntry] = {}
    for name in index.names():
        if name in claimed or not name.endswith(".weight"):
            continue
        shape, dtype = index.shape(name), index.dtype(name)
        if len(shape) != 2 or dtype not in FLOAT_DTYPES:
            continue
        prefix = name[: -len(".weight")]
        if prefix in quantized:
            continue
        kind = "embedding" if any(h in prefix.rsplit(".", 1)[-1] for h in EMBEDDING_HINTS) else "linear"
        bias = f"{prefix}.bias" if f"{prefix}.bias" in index else None
        out[prefix] = LayerEntry(prefix, None, shape[0], shape[1], {"weight": name}, None, kind, bias, dtype)
    return out


def prefixes_with(index: TensorIndex, suffix: str) -> list[str]:
    """Prefixes P for which ``P.<suffix>`` is a tensor."""
    tail = "." + suffix
    return [n[: -len(tail)] for n in index.names() if n.endswith(tail)]


def expect(
    index: TensorIndex,
    name: str,
    shape: tuple[int, ...] | None,
    dtypes: tuple[torch.dtype, ...],
    what: str = "",
) -> None:
    """Fail clearly unless ``name`` exists with that shape and one of those dtypes."""
    if name not in index:
        raise CheckpointError(f"missing tensor {name!r}" + (f" ({what})" if what else ""))
    found_shape, found_dtype = index.shape(name), index.dtype(name)
    if found_dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise CheckpointError(
            f"{index.where(name)}: expected dtype {want}, found {str(found_dtype).replace('torch.', '')}"
        )
    if shape is not None and tuple(found_shape) != tuple(shape):
        raise CheckpointError(
            f"{index.where(name)}: expected shape {list(shape)}, found {list(found_shape)}"
            + (f" ({what})" if what else "")
        )


def check_finite(t: torch.Tensor, where: str) -> None:
    """NaN or infinite values (scales, code books, biases, dense weights) are refused where they
    are read. A NaN or an infinity makes the minimum or maximum non-finite, so one reduction
    (no temporaries, one sync on a GPU) clears a finite tensor; only a bad one is counted, a slab
    at a time."""
    if t.dtype not in (*FLOAT_DTYPES, torch.float64):
        return  # integer codes have no NaN; fp8 codes are checked on their bits (check_fp8_codes)
    if all_finite(t):  # one reduction, one sync
        return
    flat = t.reshape(-1)
    starts = range(0, flat.numel(), FINITE_CHUNK)
    bad = sum(int((~torch.isfinite(flat[s : s + FINITE_CHUNK])).sum()) for s in starts)
    raise CheckpointError(f"{where}: {bad} of {t.numel()} values are NaN or infinite")


def check_fp8_codes(t: torch.Tensor, where: str) -> None:
    """fp8 weights holding NaN (e4m3fn's 0x7F/0xFF) or NaN/infinite codes (e5m2's all-ones
    exponent) are refused where they are read: a kernel decoding codes by bit tricks would turn
    them into finite numbers. Checked on the raw bytes, a slab of rows at a time."""
    if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return
    mask, bad_bits = (0x7F, 0x7F) if t.dtype == torch.float8_e4m3fn else (0x7C, 0x7C)
    u8 = t.reshape(t.shape[0] if t.dim() else 1, -1).view(torch.uint8)
    bad = 0
    for s in range(0, u8.shape[0], CHUNK_ROWS):
        bad += int(((u8[s : s + CHUNK_ROWS] & mask) == bad_bits).sum())
    if bad:
        what = "NaN" if t.dtype == torch.float8_e4m3fn else "NaN or infinite"
        raise CheckpointError(f"{where}: {bad} of {t.numel()} fp8 codes are {what}")


def by_rows(
    n: int, fn: Callable[[int, int], torch.Tensor], dim: int = 0, rows: int = CHUNK_ROWS
) -> torch.Tensor:
    """Concatenate ``fn(start, stop)`` over chunks of ``rows``, so a conversion's scratch stays small."""
    parts = [fn(s, min(s + rows, n)) for s in range(0, n, rows)]
    return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0]


# -- stored layouts: the canonical ones, restated -------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One stored tensor, as what differs from the canonical tensor ``source``.

    ``dtype``: the stored dtype (scales in the scheme's scale dtype, codes as int32 words ...).
    ``packing``: integer codes per stored element along ``along`` (``"input"``, K, or
    ``"output"``, N): ``Fraction(32, b)`` for b-bit codes in int32 words, 1 for one code per
    element. The weight's codes (``qweight``, canonically bytes along K) then sit one per element
    along the other dim; a zero-point keeps its groups along K. A per-slice scalar has nothing
    to pack and stays as it is.
    ``shape``: a reshape that keeps the input and output dims where they are, their units scaled
    with it ([N, K/2] bytes as [N, K/32, 16] blocks, [N, 1] scales as [N]).
    ``transposed``: a 2-D tensor stored [K, N]-wise (applied last).
    """

    source: str
    dtype: torch.dtype | None = None
    packing: Fraction | int | None = None
    along: str = "input"
    shape: tuple[int, ...] | None = None
    transposed: bool = False


def stored_specs(
    canonical: Mapping[str, TensorSpec],
    N: int,
    K: int,
    layout: Mapping[str, Stored],
    drop: Iterable[str] = (),
) -> dict[str, TensorSpec]:
    """A format's TensorSpecs, keyed by stored name, from the canonical ones of the same layer.

    An entry whose source the scheme lacks (zero-points of a symmetric scheme, ``g_idx`` without
    act-order, a dynamic scheme's input scale) is left out, so which tensors exist is decided in
    one place, ``canonical_specs``. Every canonical tensor must be stored or named in ``drop``:
    a tensor a format leaves unread is then a visible decision, not an omission.
    """
    unstated = set(canonical) - {st.source for st in layout.values()} - set(drop)
    if unstated:
        raise AssertionError(f"the stored layout does not state canonical tensors {sorted(unstated)}")
    return {
        name: _restated(canonical[st.source], name, st, N, K)
        for name, st in layout.items()
        if st.source in canonical
    }


def _restated(spec: TensorSpec, name: str, st: Stored, N: int, K: int) -> TensorSpec:
    out = replace(spec, name=name, dtype=st.dtype or spec.dtype)
    if st.packing is not None:
        out = _packed(out, Fraction(st.packing), st.along, N, K, weight_codes=st.source == "qweight")
    if st.shape is not None:
        out = _reshaped(out, st.shape)
    if st.transposed:
        out = _transposed(out)
    return out


def _packed(spec: TensorSpec, per: Fraction, along: str, N: int, K: int, weight_codes: bool) -> TensorSpec:
    """``per`` codes per stored element along ``along``; see :class:`Stored`."""
    if spec.output_dim is None and spec.input_dim is None:
        return spec
    if weight_codes:  # one code per weight element: [N, K], before packing along either dim
        spec = replace(spec, shape=(N, K), input_unit=Fraction(1), input_align=1)
    dim, total = (spec.input_dim, K) if along == "input" else (spec.output_dim, N)
    if dim is None:
        raise AssertionError(f"{spec.name}: no {along} dim to pack codes along")
    old_unit = spec.input_unit if along == "input" else spec.output_unit
    old_align = spec.input_align if along == "input" else spec.output_align
    unit = old_unit * per
    shape = list(spec.shape)
    shape[dim] = math.ceil(Fraction(total) / unit)
    align = math.lcm(old_align, unit.numerator)
    if along == "input":
        return replace(spec, shape=tuple(shape), input_unit=unit, input_align=align)
    return replace(spec, shape=tuple(shape), output_unit=unit, output_align=align)


def _reshaped(spec: TensorSpec, shape: tuple[int, ...]) -> TensorSpec:
    if math.prod(shape) != math.prod(spec.shape):
        raise AssertionError(f"{spec.name}: {list(spec.shape)} does not reshape to {list(shape)}")
    units = {}
    for key, dim in (("input_unit", spec.input_dim), ("output_unit", spec.output_dim)):
        if dim is not None and shape[dim] != spec.shape[dim]:
            units[key] = getattr(spec, key) * Fraction(spec.shape[dim], shape[dim])
    return replace(spec, shape=tuple(shape), **units)


def _transposed(spec: TensorSpec) -> TensorSpec:
    if len(spec.shape) != 2:
        return spec
    flip = {0: 1, 1: 0, None: None}
    return replace(
        spec, shape=spec.shape[::-1], input_dim=flip[spec.input_dim], output_dim=flip[spec.output_dim]
    )
