"""bitsandbytes checkpoints as transformers saves them: 8-bit (LLM.int8) and 4-bit (NF4/FP4).

4-bit stores ``weight`` uint8 [ceil(N*K/2), 1] (the row-major weight flattened, two codes per
byte, high nibble first), ``weight.absmax`` per block over the flattened weight,
``weight.quant_map`` (the code book) and a quant state, ``weight.quant_state.bitsandbytes__<type>``
(JSON bytes: quant_type, blocksize, dtype, shape, and for double quant nested_blocksize and
nested_offset), with ``weight.nested_absmax`` / ``weight.nested_quant_map`` under double quant.
That is already the canonical bnb4 layout, so conversion is a reshape; the nested offset, kept in
the JSON, becomes a per-slice ``offset`` tensor.

8-bit (LLM.int8) stores ``weight`` int8 [N, K] row-major, ``SCB`` fp32 [N] (per-row absmax) and
``weight_format`` (0 = row). quantrt reads it as weight-only int8 with per-row scales SCB/127
(scheme ``w8a16-int-ch-sym-sfp32``): LLM.int8's split of outlier activation columns into a
16-bit matmul is not reproduced, so activations stay 16-bit and the numerics are the weights'.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..schemes import Scheme, parse_scheme
from ..specs import TensorSpec
from .base import FormatReader, LayerEntry, Stored, check_finite, expect, prefixes_with, stored_specs
from .patterns import NameRules
from .schema import Bool, Config, Number, Positive, PositivePair, Str, StrList, validate

INT8_SCHEME = parse_scheme("w8a16-int-ch-sym-sfp32")
#: bitsandbytes dequantizes as (q * SCB) * this fp32 constant (1/127 rounded)
INV_127 = 7.874015718698502e-3


class Bnb8Adapter:
    """bitsandbytes 8-bit tensors <-> canonical int8 (codes q + 128, scales SCB * fp32(1/127)).

    The canonical int form has one multiplier, so kernels evaluate ``q * (SCB * c)`` where
    bitsandbytes' ``int8_vectorwise_dequant`` rounds ``(q * SCB) * c``: a 1-ulp difference in
    about a fifth of the fp32 weights, and no single fp32 scale per row reproduces the two
    roundings. :meth:`dequantize_stored` is the tool's own two-step rounding, which a checkpoint's
    ``dequantize()`` uses, so it equals bitsandbytes bit for bit.
    """

    name = "bitsandbytes-8bit"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        layout = {"weight": Stored("qweight", torch.int8), "SCB": Stored("scales", shape=(N,))}
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        w, scb = tensors["weight"], tensors["SCB"].float()
        check_finite(scb, "SCB")
        q = w.contiguous().view(torch.uint8) ^ 0x80  # two's complement + 128: the unsigned 8-bit code
        scales = (scb * torch.tensor(INV_127, dtype=torch.float32)).reshape(N, 1)
        return CanonicalWeight(scheme, N, K, {"qweight": q, "scales": scales}, output_sizes)

    def dequantize_stored(self, tensors: dict[str, torch.Tensor], N: int, K: int) -> torch.Tensor:
        """fp32 [N, K] as bitsandbytes computes it: ``(q * SCB) * fp32(1/127)``, rounded twice."""
        w, scb = tensors["weight"], tensors["SCB"].float()
        check_finite(scb, "SCB")
        return (w.float() * scb.reshape(N, 1)) * torch.tensor(INV_127, dtype=torch.float32)


class BitsandbytesConfig(Config):
    """``quant_method: bitsandbytes`` (transformers' BitsAndBytesConfig): the keys quantrt reads."""

    load_in_4bit: Bool | None = None
    load_in_8bit: Bool | None = None
    llm_int8_skip_modules: StrList | None = None
    bnb_4bit_quant_storage: Str | None = None


class QuantState(Config):
    """The JSON quant state bitsandbytes stores beside each 4-bit weight."""

    quant_type: Str = None
    blocksize: Positive = None
    shape: PositivePair = None
    nested_blocksize: Positive = None
    nested_offset: Number = None


BNB4_ROLES = {
    "qweight": "weight",
    "absmax": "weight.absmax",
    "code": "weight.quant_map",
    "nested_absmax": "weight.nested_absmax",
    "nested_code": "weight.nested_quant_map",
}


class Bnb4Adapter:
    """bitsandbytes 4-bit tensors <-> canonical bnb4 (the same flat layout)."""

    name = "bitsandbytes-4bit"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        canonical = canonical_specs(scheme, N, K, num_slices)
        layout = {name: Stored(name) for name in canonical}
        layout["qweight"] = Stored("qweight", shape=(canonical["qweight"].shape[0], 1))
        return stored_specs(canonical, N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        out = dict(tensors)
        out["qweight"] = tensors["qweight"].reshape(-1).contiguous()
        absmax = out["absmax"]
        if absmax.is_floating_point():
            check_finite(absmax, "weight.absmax")
        if "nested_absmax" in out:
            check_finite(out["nested_absmax"], "weight.nested_absmax")
        check_finite(out["code"], "weight.quant_map")
        if "nested_code" in out:
            check_finite(out["nested_code"], "weight.nested_quant_map")
        return CanonicalWeight(scheme, N, K, out, output_sizes)


class BitsandbytesReader(FormatReader):
    """``quant_method: bitsandbytes``."""

    name = "bitsandbytes"
    schema = BitsandbytesConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        four = bool(self.cfg("load_in_4bit", default=False))
        if not four and not self.cfg("load_in_8bit", default=False):
            raise CheckpointError(f"{self.source}: a bitsandbytes config sets load_in_8bit or load_in_4bit")
        skip = list(self.cfg("llm_int8_skip_modules", default=None) or [])
        if four:
            return self._four_bit(skip)
        rules = NameRules(skip, self.at("llm_int8_skip_modules"))
        out: dict[str, LayerEntry] = {}
        for prefix in prefixes_with(self.index, "SCB"):
            if rules.first(prefix) or any(prefix.endswith("." + s) for s in skip):
                raise CheckpointError(
                    f"{self.source}: {prefix} is in llm_int8_skip_modules but stores 8-bit tensors"
                )
            w = f"{prefix}.weight"
            expect(self.index, w, None, (torch.int8,), "bitsandbytes 8-bit weight")
            N, K = self.index.shape(w)
            expect(self.index, f"{prefix}.SCB", (N,), (torch.float32,), "per-row absmax")
            fmt = f"{prefix}.weight_format"
            if fmt in self.index:
                value = self.index.read(fmt).reshape(-1)
                if value.numel() != 1 or int(value[0]) != 0:
                    raise CheckpointError(
                        f"{self.index.where(fmt)}: only the row-major layout (0) is supported, "
                        f"found {value.tolist()}"
                    )
            bias = f"{prefix}.bias" if f"{prefix}.bias" in self.index else None
            out[prefix] = LayerEntry(
                prefix,
                INT8_SCHEME,
                N,
                K,
                {"weight": w, "SCB": f"{prefix}.SCB"},
                Bnb8Adapter(),
                bias=bias,
                notes=["LLM.int8 outlier decomposition not reproduced (weight-only)"],
                extras=[fmt] if fmt in self.index else [],
            )
        return out

    def _four_bit(self, skip: list[str]) -> dict[str, LayerEntry]:
        storage = self.cfg("bnb_4bit_quant_storage", default=None) or "uint8"
        if storage != "uint8":
            raise CheckpointError(
                f"{self.source}: bnb_4bit_quant_storage {storage!r} is not supported (uint8 only)"
            )
        out: dict[str, LayerEntry] = {}
        idx = self.index
        for state in [n for n in idx.names() if ".weight.quant_state.bitsandbytes__" in n]:
            prefix = state.split(".weight.quant_state.")[0]
            if any(prefix == s or prefix.endswith("." + s) for s in skip):
                raise CheckpointError(
                    f"{self.source}: {prefix} is in llm_int8_skip_modules but stores 4-bit tensors"
                )
            qs = _quant_state(idx, state)
            validate(QuantState, qs, idx.where(state), root="")
            qtype = qs.get("quant_type")
            if qtype not in ("nf4", "fp4"):
                raise CheckpointError(f"{idx.where(state)}: quant_type must be nf4 or fp4, found {qtype!r}")
            shape = qs.get("shape")
            if not (
                isinstance(shape, list)
                and len(shape) == 2
                and all(isinstance(d, int) and d > 0 for d in shape)
            ):
                raise CheckpointError(
                    f"{idx.where(state)}: shape must be [out_features, in_features], found {shape!r}"
                )
            N, K = shape
            bs = qs.get("blocksize", 64)
            dq = "nested_offset" in qs
            if dq and qs.get("nested_blocksize", 256) != 256:
                raise CheckpointError(
                    f"{idx.where(state)}: nested_blocksize must be 256, found {qs['nested_blocksize']}"
                )
            name = f"w4a16-{'nf4' if qtype == 'nf4' else 'bnbfp4'}-g{bs}" + ("-dq" if dq else "")
            try:
                scheme = parse_scheme(name)
            except Exception as e:
                raise CheckpointError(f"{idx.where(state)}: {e}") from None
            adapter = Bnb4Adapter()
            specs = adapter.tensor_specs(scheme, N, K)
            tensors = {role: f"{prefix}.{BNB4_ROLES[role]}" for role in specs if role in BNB4_ROLES}
            for role, name_ in tensors.items():
                expect(idx, name_, specs[role].shape, (specs[role].dtype,), f"{scheme} [{N}, {K}]")
            constants = {}
            if dq:
                offset = float(qs["nested_offset"])
                if not math.isfinite(offset):
                    raise CheckpointError(f"{idx.where(state)}: nested_offset is {offset}")
                constants["offset"] = torch.tensor([offset], dtype=torch.float32)
            bias = f"{prefix}.bias" if f"{prefix}.bias" in idx else None
            out[prefix] = LayerEntry(
                prefix, scheme, N, K, tensors, adapter, bias=bias, constants=constants, extras=[state]
            )
        return out


def _quant_state(index: Any, name: str) -> dict[str, Any]:
    raw = index.read(name)
    if raw.dtype != torch.uint8 or raw.numel() > 1 << 20:
        raise CheckpointError(f"{index.where(name)}: expected a small uint8 tensor of JSON bytes")
    try:
        qs = json.loads(bytes(raw.reshape(-1).tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index.where(name)}: the quant state is not JSON: {e}") from None
    if not isinstance(qs, dict):
        raise CheckpointError(f"{index.where(name)}: the quant state must be a JSON object")
    return qs
