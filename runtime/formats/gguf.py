"""GGUF checkpoints (llama.cpp): one .gguf file, no JSON config; each tensor names its own type.

Names. A file of an architecture quantrt runs (``general.architecture`` in
:data:`HF_ARCHITECTURES`) shows Hugging Face prefixes (``blk.0.attn_q`` -> ``model.layers.0.self_attn.q_proj``, ``token_embd`` ->
``model.embed_tokens``, ``output`` -> ``lm_head``); any other architecture, and any tensor outside
that map, keeps its GGUF name minus ``.weight``. 1-D tensors (norms) are not layers.

Schemes. Every 2-D tensor is a layer whose scheme comes from its own ggml type (``gguf-q4_k``
...), because llama.cpp's mixes put several types in one file (Q4_K_M stores v_proj and
down_proj as Q6_K). F16/BF16/F32 tensors are dense layers of that dtype. A 3-D tensor stacks MoE
experts (``blk.N.ffn_up_exps``): each expert is listed as ``<stem>.<e>`` (kind ``expert``) and
reads only its own rows.

MXFP4 (ggml type 39) is read as quantrt's ``w4a16-mxfp4`` scheme, not kept in GGUF blocks: each
32-element block is 17 bytes, an e8m0 exponent ``E`` then 16 bytes whose low nibbles are elements
0..15 and high nibbles 16..31, and llama.cpp decodes it as ``kvalues[code] * 2^(E-128)`` with the
doubled e2m1 table, which is exactly ``e2m1(code) * 2^(E-127)``, canonical mxfp4's value. The
conversion (:class:`GGUFMXFP4Adapter`) moves the exponent bytes into ``scales`` [N, K/32] and the
nibbles into canonical order (two codes per byte, low nibble = even k), with code 8 (-0) written
as code 0 (+0), so dequantization equals ``gguf.quants.dequantize`` bit for bit. Exponent byte
255 is refused: GGUF's decoder reads it as the finite 2^127, canonical mxfp4 as NaN, and
llama.cpp never writes it.

Row order. llama.cpp's converter permutes the rows of a llama model's Q and K projections for
its rope kernel; transformers undoes it when it reads GGUF, and so does quantrt, in
:class:`GGUFIndex`: reading ``blk.N.attn_q``/``attn_k`` (weight or bias) through the index returns
rows in Hugging Face order. GGUF blocks run along K, so permuting whole rows of a quantized
tensor is exact. Doing it where the full stored tensor is read means tensor-parallel slicing,
fused QKV loading, dense layers and dequantization all see Hugging Face rows with no
format-specific step of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..checkpoint.gguf_file import PLAIN_TYPES, GGUFFile
from ..errors import CheckpointError
from ..reference.gguf import BLOCK, finite_blocks
from ..schemes import Scheme, parse_scheme
from ..specs import TensorSpec
from .base import (
    CHUNK_ROWS,
    FLOAT_DTYPES,
    FormatReader,
    LayerEntry,
    Stored,
    TensorIndex,
    by_rows,
    natural_key,
    stored_specs,
)

#: architectures whose tensors take Hugging Face prefixes (the ones quantrt runs as models)
HF_ARCHITECTURES = frozenset(
    {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss"}
)
#: architectures whose attn_q/attn_k rows llama.cpp's converter permuted (as transformers undoes)
ROPE_PERMUTED = frozenset({"llama"})

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_qkv": "self_attn.qkv_proj",
}
#: the MoE blocks' 2-D tensors: the router (transformers 5's ``...TopKRouter``, whose ``weight``
#: is the GGUF ``ffn_gate_inp``) and qwen2moe's shared expert; the 3-D expert stacks keep their
#: GGUF stems (``blk.N.ffn_up_exps.<e>``), since transformers fuses them into 3-D parameters
_QWEN_MOE_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
#: per architecture, block tensors whose Hugging Face module differs from BLOCK_NAMES'
ARCH_BLOCK_NAMES = {
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
    "qwen2moe": _QWEN_MOE_NAMES,
    "qwen3moe": {"ffn_gate_inp": "mlp.gate"},
    "gpt-oss": {"ffn_gate_inp": "mlp.router"},
}
#: GGUF block types read as another canonical scheme: type name -> scheme
CONVERTED_SCHEMES = {"MXFP4": "w4a16-mxfp4"}
#: GGUF's standard embedding tensor names (any architecture)
EMBEDDING_NAMES = frozenset({"token_embd", "position_embd", "token_types"})

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([A-Za-z0-9_]+)$")
_ROPE_RE = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k)\.(weight|bias)$")


def hf_prefix(stem: str, architecture: str | None) -> str:
    """The layer prefix of a GGUF tensor stem (its name minus ``.weight``)."""
    if architecture not in HF_ARCHITECTURES:
        return stem
    if stem in GLOBAL_NAMES:
        return GLOBAL_NAMES[stem]
    m = _BLOCK_RE.match(stem)
    if m:
        names = ARCH_BLOCK_NAMES.get(architecture, {})
        name = names.get(m.group(2)) or BLOCK_NAMES.get(m.group(2))
        if name:
            return f"model.layers.{m.group(1)}.{name}"
    return stem


def rope_row_order(rows: int, heads: int) -> torch.Tensor:
    """Indices ``p`` with ``hf_rows = stored_rows[p]``: per head, llama.cpp stores the rows of
    its two rope halves interleaved ([d, 2]); Hugging Face keeps them as halves ([2, d])."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a stored Q or K tensor (weight bytes, dense weight or bias) in Hugging Face order."""
    return t.index_select(0, rope_row_order(t.shape[0], heads))


def _head_count(meta: Mapping[str, Any], key: str, layer: int, path: Path, tensor: str) -> int | None:
    v = meta.get(key)
    if isinstance(v, list):
        if layer >= len(v):
            raise CheckpointError(f"{path}: metadata {key!r} has {len(v)} entries, {tensor} needs #{layer}")
        v = v[layer]
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"{path}: metadata {key!r} must be a positive integer, found {v!r}")
    return v


def architecture(file: GGUFFile) -> str | None:
    arch = file.metadata.get("general.architecture")
    if arch is not None and not isinstance(arch, str):
        raise CheckpointError(
            f"{file.path}: metadata 'general.architecture' must be a string, found {arch!r}"
        )
    return arch


def rope_heads(file: GGUFFile) -> dict[str, int]:
    """Tensor name -> heads, for every tensor whose rows llama.cpp rope-permuted."""
    arch = architecture(file)
    if arch not in ROPE_PERMUTED:
        return {}
    out: dict[str, int] = {}
    for name, dims in file.dims.items():
        m = _ROPE_RE.match(name)
        if not m:
            continue
        layer, which = int(m.group(1)), m.group(2)
        q_heads = _head_count(file.metadata, f"{arch}.attention.head_count", layer, file.path, name)
        if q_heads is None:
            raise CheckpointError(
                f"{file.path}: metadata '{arch}.attention.head_count' is missing; it is needed to undo "
                f"llama.cpp's rope permutation of {name!r}"
            )
        kv = _head_count(file.metadata, f"{arch}.attention.head_count_kv", layer, file.path, name)
        heads = q_heads if which == "attn_q" else (kv or q_heads)
        rows = dims[1] if len(dims) == 2 else dims[0] if len(dims) == 1 else -1
        if rows < 0 or rows % (2 * heads):
            raise CheckpointError(
                f"{file.path}: tensor {name!r} {list(dims)}: expected a row count that is a multiple of "
                f"2 x {heads} heads (to undo llama.cpp's rope permutation), found {rows if rows >= 0 else dims}"
            )
        out[name] = heads
    return out


class GGUFIndex(TensorIndex):
    """The tensors of one GGUF file; q/k rows of rope-permuted architectures read in HF order."""

    def __init__(self, file: GGUFFile) -> None:
        super().__init__([file])
        self.file = file
        self.metadata = file.metadata
        self.row_heads = rope_heads(file)

    def prefetch(self, names: Iterable[str]) -> None:
        """No read-ahead: GGUF tensors are read through the file's own paths (blocks, converted types)."""

    def read(self, name: str) -> torch.Tensor:
        """The tensor as a layer uses it: Hugging Face row order (the whole tensor, before any
        tensor-parallel slicing, so every rank's slice is a slice of the un-permuted rows)."""
        t = super().read(name)
        heads = self.row_heads.get(name)
        return unpermute_rows(t, heads) if heads else t

    def read_index(self, name: str, i: int) -> torch.Tensor:
        """Expert ``i`` of a stacked tensor, reading only its bytes: for a block-quantized one,
        rows [i*N, (i+1)*N) of its (experts*N, bytes per row) storage."""
        info = self.info.get(name)
        dims = self.file.dims.get(name, ())
        if info is None or len(dims) < 3 or self.file.ggml_types[name] in PLAIN_TYPES:
            return super().read_index(name, i)
        E = dims[-1]
        if not 0 <= i < E:
            raise CheckpointError(f"{self.where(name)}: expert index {i} is outside [0, {E})")
        per = info.shape[0] // E
        return self.file.get_rows(name, i * per, (i + 1) * per)

    def read_stored(self, name: str) -> torch.Tensor:
        """The tensor exactly as the file stores it."""
        return super().read(name)


class GGUFAdapter:
    """llama.cpp blocks <-> canonical ``gguf``: the same bytes, [N, K/B*T], checked."""

    name = "gguf"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        _gguf_type(scheme)  # refuses a scheme that is not gguf-<type>
        return canonical_specs(scheme, N, K, num_slices)  # the canonical layout is llama.cpp's blocks

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        t = _gguf_type(scheme)
        B, T = BLOCK[t]
        q = tensors["qweight"]
        want = (N, K // B * T)
        if q.dtype != torch.uint8 or tuple(q.shape) != want or K % B:
            raise CheckpointError(
                f"qweight: {t} for N={N}, K={K} must be uint8 {list(want)} ({K // B} blocks of {T} bytes "
                f"per row), found {str(q.dtype).replace('torch.', '')} {list(q.shape)}"
            )
        ok = finite_blocks(q, t)
        if not bool(ok.all()):
            bad = int((~ok).sum())
            first = int((~ok).flatten().nonzero()[0])
            nb = K // B
            raise CheckpointError(
                f"qweight: {bad} {t} block(s) have a NaN or infinite f16 scale, first at row "
                f"{first // nb}, block {first % nb}"
            )
        return CanonicalWeight(scheme, N, K, {"qweight": q.contiguous()}, output_sizes)


class GGUFMXFP4Adapter:
    """GGUF MXFP4 blocks -> canonical ``mxfp4`` (see the module docstring).

    Stored: ``qweight`` uint8 [N, K/32*17], each row K/32 blocks of (e8m0 byte, 16 nibble bytes).
    ``where`` names the file and tensor in errors (the checkpoint adds its path and layer); in a
    fused layer (several ``output_sizes``) an error also names the slice of the bad row.
    """

    name = "gguf-mxfp4"
    BLOCK_ELEMS, BLOCK_BYTES = 32, 17

    def __init__(self, where: str = "qweight") -> None:
        self.where = where

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        _mxfp4_scheme(scheme)
        layout = {"qweight": Stored("qweight", packing=Fraction(self.BLOCK_ELEMS, self.BLOCK_BYTES))}
        # the e8m0 scales sit inside the blocks: one stored tensor holds both canonical ones
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout, drop=("scales",))

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        _mxfp4_scheme(scheme)
        B, T = self.BLOCK_ELEMS, self.BLOCK_BYTES
        q = tensors["qweight"]
        want = (N, K // B * T)
        if q.dtype != torch.uint8 or tuple(q.shape) != want or K % B:
            raise CheckpointError(
                f"{self.where}: MXFP4 for N={N}, K={K} must be uint8 {list(want)} ({K // B} blocks of {T} "
                f"bytes per row), found {str(q.dtype).replace('torch.', '')} {list(q.shape)}"
            )
        nb = K // B
        bad, first = 0, -1
        for s in range(0, N, CHUNK_ROWS):  # checked a slab of rows at a time, as it is converted
            nan = q[s : s + CHUNK_ROWS].reshape(-1, nb, T)[..., 0] == 255
            n = int(nan.sum())
            if n and first < 0:
                first = s * nb + int(nan.flatten().nonzero()[0])
            bad += n
        if bad:
            r, b = divmod(first, nb)
            row = f"row {r}"
            if len(output_sizes) > 1:  # a fused layer: say which slice the row belongs to
                k = next(i for i in range(len(output_sizes)) if r < sum(output_sizes[: i + 1]))
                row += f" (row {r - sum(output_sizes[:k])} of slice {k})"
            raise CheckpointError(
                f"{self.where}: {bad} MXFP4 block(s) have exponent byte 255, first at {row}, block {b} "
                f"(elements {b * B}..{b * B + B - 1}): expected an e8m0 exponent 0..254, found 255 "
                "(GGUF's decoder reads 255 as 2^127, canonical mxfp4 as NaN; llama.cpp never writes it)"
            )

        def codes(s: int, e: int) -> torch.Tensor:
            qs = q[s:e].reshape(e - s, nb, T)[..., 1:]
            c = torch.cat([qs & 0xF, qs >> 4], dim=-1)  # [rows, nb, 32]: element order
            c = torch.where(c == 8, 0, c)  # -0 -> +0: llama.cpp's table holds +0 for both
            return (c[..., 0::2] | (c[..., 1::2] << 4)).reshape(e - s, K // 2)

        qweight = by_rows(N, codes)
        scales = by_rows(N, lambda s, e: q[s:e].reshape(e - s, nb, T)[..., 0].contiguous())
        return CanonicalWeight(scheme, N, K, {"qweight": qweight, "scales": scales}, output_sizes)


def _mxfp4_scheme(scheme: Scheme) -> None:
    if scheme.family != "mxfp4":
        raise CheckpointError(f"the GGUF MXFP4 adapter needs an mxfp4 scheme, found {scheme}")


def _gguf_type(scheme: Scheme) -> str:
    if scheme.weight != "gguf" or scheme.gguf_type not in BLOCK:
        raise CheckpointError(f"the gguf adapter needs a gguf-<type> scheme, found {scheme}")
    return scheme.gguf_type


ADAPTER = GGUFAdapter()


class GGUFReader(FormatReader):
    """Layers of a GGUF file: HF prefixes for llama-family files, each tensor's own scheme.

    ``qconfig`` is the file's metadata; ``index`` must be a :class:`GGUFIndex` (it holds the ggml
    types and dims, and reads q/k rows in Hugging Face order).
    """

    name = "gguf"

    def __init__(self, qconfig: Mapping[str, Any], index: TensorIndex, source: str) -> None:
        if not isinstance(index, GGUFIndex):
            raise CheckpointError(
                f"{source}: the gguf reader needs a GGUFIndex over one .gguf file (see "
                f"quantrt.formats.gguf.open_gguf), found {type(index).__name__}"
            )
        super().__init__(qconfig, index, source)
        self.file = index.file
        self.row_heads = index.row_heads
        self.architecture = architecture(index.file)

    def quantized_layers(self) -> dict[str, LayerEntry]:
        return {p: e for p, e in self.layers().items() if e.quantized}

    def layers(self) -> dict[str, LayerEntry]:
        """Every 2-D float or block-quantized ``*.weight`` tensor by prefix, and each expert of a
        3-D stacked one (``<stem>.<e>``, kind ``expert``, reading only that expert's rows)."""
        f = self.file
        out: dict[str, LayerEntry] = {}
        for name, dims in f.dims.items():
            if not name.endswith(".weight") or len(dims) not in (2, 3):
                continue
            tname, info = f.ggml_types[name], f.tensors[name]
            if (
                tname.lower() not in BLOCK
                and tname not in CONVERTED_SCHEMES
                and info.dtype not in FLOAT_DTYPES
            ):
                continue
            stem = name[: -len(".weight")]
            if 0 in dims:  # a count no byte backs: 2^40 experts of nothing would be 2^40 layers
                raise CheckpointError(
                    f"{f.path}: tensor {name!r} has dims {list(dims)}: a weight needs at least one "
                    "element per dim"
                )
            if len(dims) == 2:
                self._add(out, hf_prefix(stem, self.architecture), stem, name, None)
            else:
                for e in range(dims[2]):
                    self._add(out, f"{stem}.{e}", stem, name, e)
        return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))

    def _add(self, out: dict[str, LayerEntry], prefix: str, stem: str, name: str, expert: int | None) -> None:
        f = self.file
        if prefix in out:
            raise CheckpointError(
                f"{f.path}: tensors {out[prefix].tensors} and {name!r} both map to {prefix}"
            )
        K, N = f.dims[name][0], f.dims[name][1]
        tname = f.ggml_types[name]
        kind = "expert" if expert is not None else "embedding" if stem in EMBEDDING_NAMES else "linear"
        heads = self.row_heads
        notes = []
        if name in heads:
            notes.append(
                f"rows un-permuted from llama.cpp's rope order ({heads[name]} heads), as transformers does"
            )
        bias = self._bias(stem, N, f.dims[name][2:])
        select = {} if expert is None else {"bias": expert} if bias else {}
        if tname.lower() in BLOCK:
            role, scheme, adapter, dtype = "qweight", parse_scheme(f"gguf-{tname.lower()}"), ADAPTER, None
        elif tname in CONVERTED_SCHEMES:
            where = f"{f.path.name}: tensor {name!r}" + (f" (expert {expert})" if expert is not None else "")
            role, scheme, dtype = "qweight", parse_scheme(CONVERTED_SCHEMES[tname]), None
            adapter = GGUFMXFP4Adapter(where)
            notes.append(
                "GGUF MXFP4 blocks read as canonical mxfp4 (nibbles reordered, e8m0 scales split out)"
            )
        else:
            role, scheme, adapter, dtype = "weight", None, None, f.tensors[name].dtype
        if expert is not None:
            select[role] = expert
        out[prefix] = LayerEntry(
            prefix, scheme, N, K, {role: name}, adapter, kind, bias, dtype, notes, select=select
        )

    def _bias(self, stem: str, N: int, experts: tuple[int, ...]) -> str | None:
        """``<stem>.bias``: [N], or [E, N] (PyTorch order) beside stacked experts."""
        name = f"{stem}.bias"
        if name not in self.file.tensors:
            return None
        info = self.file.tensors[name]
        want = (*experts, N)
        if info.dtype not in FLOAT_DTYPES or tuple(info.shape) != want:
            raise CheckpointError(
                f"{self.file.path}: tensor {name!r}: expected a float bias of shape {list(want)}, found "
                f"{self.file.ggml_types[name]} {list(info.shape)}"
            )
        return name


def open_gguf(path: str | Path) -> tuple[GGUFIndex, GGUFReader]:
    """The index and reader of one .gguf file (headers only; nothing else is read)."""
    index = GGUFIndex(GGUFFile(path))
    return index, GGUFReader(index.metadata, index, str(path))
