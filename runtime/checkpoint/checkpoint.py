"""open_checkpoint: a Hugging Face style directory of safetensors, read lazily.

Opening reads config.json, the quantization config, the index and every safetensors header,
nothing else. A layer's tensors are read when that layer is asked for (memory-mapped, one
tensor at a time), converted to canonical tensors in row chunks, and handed to dispatch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError, ShardError
from ..formats import TensorIndex, find_quant_config, reader_for
from ..formats.base import CHUNK_ROWS, LayerEntry
from .files import inside, read_json, regular_file
from .safetensors_file import SafetensorsFile

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: the last name components of the tensors that only a quantized weight has, in every format read
QUANTIZED_LEAVES = frozenset(
    {
        "qweight", "qzeros", "scales", "g_idx", "SCB", "absmax", "quant_map", "nested_absmax",
        "nested_quant_map", "weight_scale", "weight_scale_inv", "weight_scale_2", "weight_zero_point",
        "weight_global_scale", "weight_packed", "weight_shape", "weight_format",
    }
)  # fmt: skip


def is_quantized_name(name: str) -> bool:
    """Whether a stored tensor's name says it is part of a quantized weight."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in QUANTIZED_LEAVES or ".quant_state." in name or leaf.startswith("quant_state")


TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class QuantizedWeight:
    """One quantized layer of a checkpoint; nothing is read until asked."""

    prefix: str
    entry: LayerEntry
    checkpoint: Checkpoint

    @property
    def scheme(self) -> Any:
        return self.entry.scheme

    @property
    def shape(self) -> tuple[int, int]:
        """[out_features, in_features]."""
        return (self.entry.N, self.entry.K)

    def stored(self) -> dict[str, torch.Tensor]:
        """The checkpoint's own tensors of this layer, by role name."""
        return self.checkpoint.read(self.entry)

    def canonical(self) -> CanonicalWeight:
        """The layer in canonical tensors (see ``quantrt.canonical``)."""
        e = self.entry
        try:
            return e.adapter.to_canonical(self.stored(), e.scheme, e.N, e.K, (e.N,))
        except CheckpointError as err:
            raise CheckpointError(f"{self.checkpoint.path}: layer {self.prefix}: {err}") from None

    def dequantize(self) -> torch.Tensor:
        """The fp32 [out_features, in_features] weight, computed a block of rows at a time; a
        format whose tool rounds differently from the canonical form's one multiplier (bitsandbytes
        int8) gives its tool's values through its adapter's ``dequantize_stored``."""
        exact = getattr(self.entry.adapter, "dequantize_stored", None)
        if exact is not None:
            try:
                return exact(self.stored(), self.entry.N, self.entry.K)
            except CheckpointError as err:
                raise CheckpointError(f"{self.checkpoint.path}: layer {self.prefix}: {err}") from None
        return dequantize_by_rows(self.canonical())


def dequantize_by_rows(weight: CanonicalWeight) -> torch.Tensor:
    """Reference dequantization in row chunks, so temporaries stay a fraction of the output."""
    from ..reference import dequantize

    N, K = weight.N, weight.K
    if N <= CHUNK_ROWS or len(weight.output_sizes) > 1:
        return dequantize(weight)
    specs = canonical_specs(weight.scheme, N, K)
    out = torch.empty(N, K, dtype=torch.float32)
    for start in range(0, N, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, N)
        try:
            part = {name: _rows(t, specs[name], start, stop, N) for name, t in weight.tensors.items()}
        except ShardError:
            return dequantize(weight)  # a layout whose blocks straddle this cut: do it whole
        out[start:stop] = dequantize(CanonicalWeight(weight.scheme, stop - start, K, part))
    return out


def _rows(t: torch.Tensor, spec: Any, start: int, stop: int, N: int) -> torch.Tensor:
    if spec.output_dim is None:
        return t
    lo, hi = spec.index_range(spec.output_dim, start, stop, N)
    return t.narrow(spec.output_dim, lo, hi - lo)


class Checkpoint:
    """A quantized (or dense) checkpoint: its format, layers and their schemes."""

    def __init__(
        self,
        path: Path,
        directory: Path,
        config: dict[str, Any] | None,
        files: list[SafetensorsFile],
        weight_map: dict[str, str] | None,
        quantization: Any = None,
    ) -> None:
        self.path, self.directory, self.config = path, directory, config
        self.index = TensorIndex(files, weight_map)
        self.qconfig, self.qconfig_source = find_quant_config(directory, config)
        if quantization is not None:
            self.qconfig, self.qconfig_source = _online(quantization, self.qconfig, self.qconfig_source, path)
        self.reader = reader_for(self.qconfig, self.index, self.qconfig_source)
        self._layers: dict[str, LayerEntry] | None = None
        self._experts: dict[str, Any] | None = None

    @classmethod
    def from_parts(cls, path: Path, index: Any, reader: Any) -> Checkpoint:
        """A checkpoint from a ready index and reader (a GGUF file carries its config inside)."""
        ck = cls.__new__(cls)
        ck.path, ck.directory, ck.config = path, path.parent, None
        ck.index, ck.reader = index, reader
        ck.qconfig, ck.qconfig_source = reader.qconfig, reader.source
        ck._layers = None
        ck._experts = None
        return ck

    @property
    def format(self) -> str:
        return self.reader.name

    @property
    def layers(self) -> dict[str, LayerEntry]:
        """Every linear-shaped layer by prefix (quantized ones carry a scheme; dense ones None)."""
        if self._layers is None:
            layers = self.reader.layers()
            self._check_quantized_tensors_read(layers)
            self._layers = layers
        return self._layers

    @property
    def experts(self) -> dict[str, Any]:
        """The MoE layers, by prefix: each experts module's per-expert weights grouped into one
        :class:`~quantrt.checkpoint.experts.ExpertsEntry` (see :mod:`quantrt.checkpoint.experts`)."""
        if self._experts is None:
            from .experts import find_experts

            self._experts = find_experts(self.layers, str(self.path))
        return self._experts

    def expert_prefixes(self) -> set[str]:
        """Every per-expert layer prefix some MoE layer groups."""
        return {e.prefix for x in self.experts.values() for p in x.projections.values() for e in p.values()}

    def experts_layer(self, key: str, **kw: Any) -> nn.Module:
        """A ready :class:`~quantrt.moe.QuantExperts` for MoE layer ``key`` (a key of :attr:`experts`);
        keywords as :func:`quantrt.checkpoint.experts.build_experts` takes them."""
        from .experts import build_experts

        entry = self.experts.get(key)
        if entry is None:
            near = ", ".join(list(self.experts)[:5]) or "none"
            raise CheckpointError(f"{self.path}: no MoE layer {key!r}; MoE layers: {near}")
        kw.setdefault("act_dtype", self.default_act_dtype)
        return build_experts(self, entry, **kw)

    def _check_quantized_tensors_read(self, layers: dict[str, LayerEntry]) -> None:
        """A tensor whose name says it belongs to a quantized weight (``qweight``, ``scales``,
        ``SCB``, ``absmax`` ...) must be read by a quantized layer: one left over means the config
        is missing or wrong (the layer would silently run dense, or vanish)."""
        read = {n for e in layers.values() if e.quantized for n in e.stored_names()}
        read |= set(self.reader.ignored())
        stray = [n for n in self.index.names() if n not in read and is_quantized_name(n)]
        if not stray:
            return
        dense = [p for p in (n.rsplit(".", 1)[0] for n in stray) if p in layers and not layers[p].quantized]
        why = (
            "no quantization config says how to read them (config.json has none, or it is null)"
            if self.qconfig is None
            else f"the {self.format} quantization config ({self.qconfig_source}) does not cover them"
        )
        more = f"; {dense[0]} would run as a dense layer" if dense else ""
        raise CheckpointError(
            f"{self.path}: {len(stray)} tensors of quantized weights are read by no quantized layer, "
            f"e.g. {', '.join(stray[:3])}: {why}{more}"
        )

    @property
    def default_act_dtype(self) -> torch.dtype:
        name = (self.config or {}).get("torch_dtype") or (self.config or {}).get("dtype") or "bfloat16"
        return TORCH_DTYPES.get(str(name).replace("torch.", ""), torch.bfloat16)

    def layer(self, prefix: str) -> LayerEntry:
        try:
            return self.layers[prefix]
        except KeyError:
            near = [p for p in self.layers if prefix.rsplit(".", 1)[-1] in p][:5]
            raise CheckpointError(
                f"{self.path}: no layer {prefix!r}" + (f"; e.g. {', '.join(near)}" if near else "")
            ) from None

    def weights(self) -> Iterator[tuple[str, QuantizedWeight]]:
        """(prefix, QuantizedWeight) for every quantized layer, in layer order."""
        for prefix, entry in self.layers.items():
            if entry.quantized:
                yield prefix, QuantizedWeight(prefix, entry, self)

    def kv_cache_scales(self) -> dict[str, Any]:
        """Per attention layer, its KV-cache scheme and k/v scales (empty when none are stored)."""
        from .kv_cache import find_kv_scales

        return find_kv_scales(self.index, self.qconfig)

    def read(self, entry: LayerEntry) -> dict[str, torch.Tensor]:
        """A layer's stored tensors by role (one expert's slice of stacked ones), plus its constants."""
        out = {role: self._read(entry, role, name) for role, name in entry.tensors.items()}
        out.update(entry.constants)
        return out

    def _read(self, entry: LayerEntry, role: str, name: str) -> torch.Tensor:
        if role in entry.select:
            return self.index.read_index(name, entry.select[role])
        return self.index.read(name)

    def linear(
        self,
        prefix: str | Sequence[str],
        *,
        device: Any = "cpu",
        act_dtype: torch.dtype | None = None,
        parallel: str | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        shard_names: Sequence[str] | None = None,
        overrides: Any = None,
    ) -> nn.Module:
        """A ready layer: a QuantLinear whose kernel dispatch chose, or nn.Linear for a dense layer.

        A list of prefixes makes one fused layer from their shards (q, k, v or gate, up).
        """
        from ..layers import QuantLinear

        prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
        entries = [self.layer(p) for p in prefixes]
        act = act_dtype or self.default_act_dtype
        first = entries[0]
        from .experts import is_expert_name

        experts = [e.prefix for e in entries if e.kind == "expert" or is_expert_name(e.prefix)]
        if experts:
            raise CheckpointError(
                f"{self.path}: {experts[0]} is an MoE expert weight: experts run together as one MoE layer "
                "(Checkpoint.experts lists them, experts_layer(key) builds one); weights() lists it and "
                "dequantize() works on it"
            )
        if any(e.K != first.K for e in entries):
            found = ", ".join(f"{e.prefix}: K={e.K}" for e in entries)
            raise CheckpointError(f"{self.path}: the shards of a fused layer must share K; found {found}")
        if any(e.scheme != first.scheme for e in entries):
            # slices of different schemes (GGUF Q4_K_M's v_proj in Q6_K): one kernel per run of equal schemes
            from ..layers import SlicedLinear

            runs: list[list[str]] = []
            for e in entries:
                if runs and self.layer(runs[-1][0]).scheme == e.scheme:
                    runs[-1].append(e.prefix)
                else:
                    runs.append([e.prefix])
            parts = [
                self.linear(
                    r if len(r) > 1 else r[0],
                    device=device,
                    act_dtype=act,
                    parallel=parallel,
                    tp_rank=tp_rank,
                    tp_size=tp_size,
                    overrides=overrides,
                )
                for r in runs
            ]
            return SlicedLinear(parts)
        if not first.quantized:
            return self._dense(entries, device, act, parallel, tp_rank, tp_size)
        has_bias = [e.bias is not None for e in entries]
        if any(has_bias) and not all(has_bias):
            raise CheckpointError(f"{self.path}: only some shards of {prefixes} have a bias")
        fused = len(entries) > 1
        layer = QuantLinear(
            first.K,
            sum(e.N for e in entries),
            first.scheme,
            bias=all(has_bias),
            output_sizes=[e.N for e in entries] if fused else None,
            shard_names=shard_names if fused else None,
            parallel=parallel,
            tp_rank=tp_rank,
            tp_size=tp_size,
            act_dtype=act,
            device=device,
            adapter=first.adapter,
            prefix=",".join(prefixes),
        )
        for i, e in enumerate(entries):
            shard = i if fused else None
            for role, t in self.read(e).items():
                try:
                    layer.load(role, t, shard)
                except ShardError as err:
                    where = self.index.where(e.tensors[role]) if role in e.tensors else f"{e.prefix} ({role})"
                    raise ShardError(f"{where}: {err}") from None
            if e.bias is not None:
                bias = self._read(e, "bias", e.bias)
                layer.load("bias", bias, shard)
        try:
            return layer.process_weights_after_loading(overrides)
        except CheckpointError as err:
            raise CheckpointError(f"{self.path}: layer {layer.prefix}: {err}") from None

    def _dense(
        self,
        entries: list[LayerEntry],
        device: Any,
        act: torch.dtype,
        parallel: str | None,
        rank: int,
        world: int,
    ) -> nn.Module:
        ws = [self._read(e, "weight", e.tensors["weight"]) for e in entries]
        bs = [self._read(e, "bias", e.bias) if e.bias else None for e in entries]
        # one stored tensor is used as read: a cat would copy every dense weight once more
        w = ws[0] if len(ws) == 1 else torch.cat(ws, dim=0)
        b = None if any(x is None for x in bs) else bs[0] if len(bs) == 1 else torch.cat(bs)  # type: ignore[arg-type]
        if world > 1:
            if parallel == "column":
                w = torch.cat([x.chunk(world, 0)[rank] for x in ws])
                b = torch.cat([x.chunk(world, 0)[rank] for x in bs]) if b is not None else None  # type: ignore[union-attr]
            elif parallel == "row":
                w = w.chunk(world, 1)[rank]
                b = b if rank == 0 else None
        from ..kernels import registry

        factory = registry().dense_linear.get(torch.device(device).type)
        if factory is not None:  # a backend's dense path (the CPU's native GEMV for 16-bit weights)
            return factory(w.to(device), b.to(device) if b is not None else None, act)
        lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=device, dtype=act)
        with torch.no_grad():
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
        lin.requires_grad_(False)
        return lin

    def summary(self) -> dict[str, Any]:
        """What ``quantrt inspect`` prints: the format and every layer's scheme and sizes."""
        rows = []
        for prefix, e in self.layers.items():
            stored = sum(self.index.info[n].nbytes for n in e.tensors.values())
            dense16 = e.N * e.K * 2
            rows.append(
                {
                    "layer": prefix,
                    "kind": e.kind,
                    "scheme": str(e.scheme) if e.scheme else None,
                    "dtype": None if e.scheme else str(e.dtype).replace("torch.", ""),
                    "out_features": e.N,
                    "in_features": e.K,
                    "bytes": stored,
                    "dense_16bit_bytes": dense16,
                    "ratio": round(stored / dense16, 4) if dense16 else None,
                    "notes": e.notes,
                }
            )
        quant = [r for r in rows if r["scheme"]]
        kv = {
            attn: {
                "scheme": str(v.scheme),
                "k_scale": v.k_scale.tolist(),
                "v_scale": v.v_scale.tolist(),
                "tensors": list(v.names),
            }
            for attn, v in self.kv_cache_scales().items()
        }
        moe = [
            {
                "layer": key,
                "experts": x.num_experts,
                "hidden_size": x.hidden_size,
                "intermediate_size": x.intermediate_size,
                "schemes": {p: str(x.scheme(p)) if x.quantized else None for p in ("gate", "up", "down")},
                "stored": "gate_up" if x.fused else "gate, up",
                "bias": x.has_bias(),
                "notes": x.notes,
            }
            for key, x in self.experts.items()
        ]
        return {
            "path": str(self.path),
            "format": self.format,
            "quantization_config": self.qconfig_source,
            "files": [str(f.path.name) for f in self.index.files],
            "layers": rows,
            "moe_layers": moe,
            "quantized_layers": len(quant),
            "unquantized_layers": len(rows) - len(quant),
            "quantized_bytes": sum(r["bytes"] for r in quant),
            "quantized_dense_16bit_bytes": sum(r["dense_16bit_bytes"] for r in quant),
            "kv_cache": kv,
        }


def _online(
    quantization: Any, qconfig: dict[str, Any] | None, source: str, path: Path
) -> tuple[dict[str, Any], str]:
    """The quantization config of ``quantization=`` (a dense checkpoint quantized at load): one of
    :data:`ONLINE` or an :class:`~quantrt.formats.online.OnlineQuantization`."""
    from ..formats import ONLINE
    from ..formats.online import OnlineQuantization

    if isinstance(quantization, OnlineQuantization):
        doc, what = quantization.qconfig(), f"quantize={quantization.scheme!r}"
    elif quantization in ONLINE:
        doc, what = {"quant_method": quantization}, f"quantization={quantization!r}"
    else:
        raise CheckpointError(f"quantization={quantization!r}: expected one of {', '.join(ONLINE)}")
    if qconfig is not None:
        raise CheckpointError(
            f"{path}: {what} applies to dense checkpoints, but this one is quantized already ({source})"
        )
    return doc, what


def open_checkpoint(path: str | Path, *, quantization: Any = None) -> Checkpoint:
    """Open a checkpoint directory (config.json + *.safetensors, with or without an index) or one
    .safetensors file. Only headers and configs are read. ``quantization``: quantize a dense
    checkpoint at load (``"experts_int8"``: its MoE experts, int8 per channel; an
    :class:`~quantrt.formats.online.OnlineQuantization`: every linear layer to a catalog scheme)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    if not p.is_dir():
        regular_file(p)  # a FIFO or a device is refused before anything reads it
        if p.suffix == ".gguf":
            from ..formats.gguf import open_gguf

            if quantization is not None:
                raise CheckpointError(f"{p}: quantizing at load applies to dense checkpoints, not GGUF")

            index, reader = open_gguf(p)
            return Checkpoint.from_parts(p, index, reader)
        if p.suffix in PICKLE_SUFFIXES:
            raise CheckpointError(_pickle_message(p))
        if p.suffix != ".safetensors":
            raise CheckpointError(f"{p}: expected a directory or a .safetensors file")
        directory, files, weight_map = p.parent, [SafetensorsFile(p)], None
    else:
        directory = p
        files, weight_map = _find_files(p)
    config = None
    cfg_path = directory / "config.json"
    if cfg_path.exists():
        config = read_json(cfg_path)
        if not isinstance(config, dict):
            raise CheckpointError(f"{cfg_path}: expected a JSON object")
    return Checkpoint(p, directory, config, files, weight_map, quantization)


def _find_files(directory: Path) -> tuple[list[SafetensorsFile], dict[str, str] | None]:
    """The folder's safetensors files (headers validated), and the index's weight_map if any."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(
                f"{index}: not a safetensors index: expected a weight_map object of tensor name -> "
                f"file name, found {type(weight_map).__name__}"
            )
        names = sorted(set(weight_map.values()))
        files = [inside(directory, n, f"{index}: weight_map") for n in names]
        missing = [n for n, f in zip(names, files, strict=True) if not f.exists()]
        if missing:
            raise CheckpointError(f"{index}: names files that are not there: {', '.join(missing)}")
        opened = {n: SafetensorsFile(f) for n, f in zip(names, files, strict=True)}
        for tensor, shard in weight_map.items():
            if tensor not in opened[shard].tensors:
                found = [n for n, f in opened.items() if tensor in f.tensors]
                raise CheckpointError(
                    f"{index}: lists {tensor!r} in {shard}, which does not hold it"
                    + (f" (it is in {', '.join(found)})" if found else " (no file holds it)")
                )
        return list(opened.values()), weight_map
    single = directory / "model.safetensors"  # transformers' name; other files may be adapters or extras
    files = [single] if single.exists() else sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = [f for f in directory.iterdir() if f.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise CheckpointError(_pickle_message(pickles[0]))
        raise CheckpointError(f"{directory}: no *.safetensors files")
    return [SafetensorsFile(inside(directory, f.name, str(directory))) for f in files], None


def _pickle_message(p: Path) -> str:
    return (
        f"{p}: a PyTorch pickle file. quantrt never unpickles (a pickle can run code); convert the "
        "checkpoint to safetensors, e.g. transformers' save_pretrained(..., safe_serialization=True)"
    )
