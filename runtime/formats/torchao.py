"""torchao checkpoints saved to safetensors (transformers' TorchAoConfig, torchao >= 0.14).

torchao flattens each quantized tensor subclass into plain tensors named ``<P>._weight_<part>``
and records the subclass in the file's metadata under ``<P>.weight`` (``_type``, ``_data``,
``_tensor_data_names``). quantrt reads:

- ``Float8Tensor`` (Float8DynamicActivationFloat8WeightConfig, per row): ``_weight_qdata`` fp8
  [N, K], ``_weight_scale`` fp32 [N, 1] -> ``w8a8-fp8-ch`` (dynamic per-token activations) or
  weight-only when the config quantizes no activations;
- ``IntxUnpackedToInt8Tensor`` (int4 weight-only, one value per int8): ``_weight_qdata`` int8
  [N, K], ``_weight_scale`` [N, K/G], ``_weight_zero_point`` int8 [N, K/G], w = (q - zp) * s.

``Int4TilePackedTo4dTensor`` (tinygemm) stores float zero-points (w = (q - 8)*s + z), which no
integer zero-point scheme represents, and is refused with that reason. Pickle files (torchao's
older ``torch.save`` path) are refused too: quantrt never unpickles.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from pydantic import Field

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..packing import pack_codes
from ..schemes import Scheme, parse_scheme
from ..specs import TensorSpec
from .base import (
    FLOAT_DTYPES,
    SCALE_DTYPE_NAMES,
    SCALE_TORCH_DTYPES,
    FormatReader,
    LayerEntry,
    Stored,
    by_rows,
    check_finite,
    expect,
    stored_specs,
)
from .fp8 import FP8Adapter, fp8_layer, fp8_scheme
from .schema import Config, Int, Str, validate


class Typed(Config):
    """torchao's serialised object: ``{"_type": ..., "_data": ...}``."""

    type_: Str | None = Field(None, alias="_type")


class TorchAOConfig(Config):
    """``quant_method: torchao`` (transformers' TorchAoConfig): the keys quantrt reads."""

    quant_type: dict[str, Typed] | None = None


class TypedName(Config):
    """A serialised dtype or enum: ``{"_type": "torch.dtype", "_data": "int4"}``."""

    data: Str | None = Field(None, alias="_data")


class IntxData(Config):
    """The ``_data`` of an IntxUnpackedToInt8Tensor's metadata: the keys quantrt reads."""

    target_dtype: TypedName | None = None
    block_size: list[Int] | None = None


class IntxUnpackedAdapter:
    """torchao IntxUnpackedToInt8Tensor (int4 held in int8) <-> canonical int tensors."""

    name = "torchao intx"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        layout = {
            "_weight_qdata": Stored("qweight", torch.int8, packing=1),
            "_weight_scale": Stored("scales", SCALE_TORCH_DTYPES[scheme.scale_dtype]),
            "_weight_zero_point": Stored("zeros", torch.int8),
        }
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        q, s, z = tensors["_weight_qdata"], tensors["_weight_scale"], tensors["_weight_zero_point"]
        check_finite(s, "_weight_scale")
        b = scheme.bits
        lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
        for t, name in ((q, "_weight_qdata"), (z, "_weight_zero_point")):
            if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
                raise CheckpointError(
                    f"{name}: int{b} values must lie in [{lo}, {hi}], found [{int(t.min())}, {int(t.max())}]"
                )
        off = 1 << (b - 1)
        codes = by_rows(N, lambda a, e: pack_codes((q[a:e].to(torch.int16) + off).to(torch.uint8), b))
        out = {
            "qweight": codes,
            "scales": s.float().contiguous(),
            "zeros": (z.to(torch.int16) + off).contiguous(),
        }
        return CanonicalWeight(scheme, N, K, out, output_sizes)


class TorchAOReader(FormatReader):
    name = "torchao"
    schema = TorchAOConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        qt = self.cfg("quant_type", required=True)
        if not isinstance(qt, dict) or set(qt) - {"default"}:
            raise CheckpointError(
                f"{self.source}: torchao quant_type must be {{'default': <config>}}, found keys "
                f"{sorted(qt) if isinstance(qt, dict) else qt!r}"
            )
        config_type = (qt.get("default") or {}).get("_type") or ""
        meta = {k: v for f in self.index.files for k, v in getattr(f, "metadata", {}).items()}
        out: dict[str, LayerEntry] = {}
        for name in self.index.names():
            if not name.endswith("._weight_qdata"):
                continue
            prefix = name[: -len("._weight_qdata")]
            kind = _subclass(meta, prefix, self.source)
            out[prefix] = self._layer(prefix, kind, config_type)
        return out

    def _layer(self, prefix: str, kind: dict[str, Any], config_type: str) -> LayerEntry:
        idx, here = self.index, f"{self.source}: layer {prefix}"
        t = kind.get("_type")
        bias = f"{prefix}.bias" if f"{prefix}.bias" in idx else None
        if t == "Float8Tensor":
            act = "token" if "ActivationFloat8" in config_type else None

            def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype) -> Scheme:
                return fp8_scheme(wd, gran, act=act, scale_dtype=sd, where=here)

            entry = fp8_layer(
                idx, prefix, scheme_of, FP8Adapter(scale="_weight_scale", weight="_weight_qdata"), here
            )
            entry.bias = bias
            return entry
        if t == "IntxUnpackedToInt8Tensor":
            data = kind.get("_data") or {}
            stored = idx.info[f"{prefix}._weight_qdata"].file.name
            validate(IntxData, data, f"{stored}: metadata of {prefix}.weight", root="_data")
            target = str((data.get("target_dtype") or {}).get("_data", ""))
            bits = {"int2": 2, "int3": 3, "int4": 4, "int8": 8}.get(target)
            if bits is None or data.get("activation_quantization"):
                raise CheckpointError(
                    f"{here}: IntxUnpackedToInt8Tensor with target {target!r} and activation "
                    f"quantization {data.get('activation_quantization')!r} is not supported"
                )
            w = f"{prefix}._weight_qdata"
            expect(idx, w, None, (torch.int8,))
            N, K = idx.shape(w)
            block = data.get("block_size")
            if not (
                isinstance(block, list)
                and len(block) == 2
                and block[0] == 1
                and block[1] > 0
                and K % block[1] == 0
            ):
                raise CheckpointError(
                    f"{here}: block_size must be [1, G] with G dividing K={K}, found {block!r}"
                )
            G = int(block[1])
            scale = f"{prefix}._weight_scale"
            expect(idx, scale, (N, K // G), FLOAT_DTYPES)
            expect(idx, f"{prefix}._weight_zero_point", (N, K // G), (torch.int8,))
            sd = SCALE_DTYPE_NAMES[idx.dtype(scale)]
            gran = f"g{G}" if G < K else "ch"
            scheme = parse_scheme(f"w{bits}a16-int-{gran}-asym" + ("" if sd == "fp16" else f"-s{sd}"))
            tensors = {r: f"{prefix}.{r}" for r in ("_weight_qdata", "_weight_scale", "_weight_zero_point")}
            return LayerEntry(prefix, scheme, N, K, tensors, IntxUnpackedAdapter(), bias=bias)
        if t == "Int4TilePackedTo4dTensor":
            raise CheckpointError(
                f"{here}: torchao's tile-packed int4 (tinygemm) stores float zero-points "
                "(w = (q - 8)*s + z), which no integer zero-point scheme represents exactly; save "
                "with int4_packing_format='plain' or IntxWeightOnlyConfig instead"
            )
        raise CheckpointError(
            f"{here}: torchao tensor type {t!r} is not supported; known: Float8Tensor, "
            "IntxUnpackedToInt8Tensor"
        )


def _subclass(meta: dict[str, str], prefix: str, where: str) -> dict[str, Any]:
    raw = meta.get(f"{prefix}.weight")
    if raw is None:
        raise CheckpointError(
            f"{where}: {prefix}._weight_qdata has no torchao type in the file metadata ({prefix}.weight)"
        )
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{where}: metadata of {prefix}.weight is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where}: metadata of {prefix}.weight must be an object")
    return doc
