"""FP8 weights: ``quant_method: fp8`` (per tensor, or DeepSeek-V3's 128x128 blocks with
``weight_scale_inv``) and ``fbgemm_fp8`` (per channel); compressed-tensors ``float-quantized``,
ModelOpt FP8 and Quark FP8 use the same adapter with their own tensor names.

Scales are multipliers whatever their name: ``w = fp8 * s`` (``weight_scale_inv`` is DeepSeek's
name for the inverse of the quantization scale, i.e. still the multiplier). A per-tensor scale
comes once per shard of a fused layer and stays one per slice in canonical form (exact, no
requantization); static input scales of a fused layer reduce to their max.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import (
    FLOAT_DTYPES,
    SCALE_DTYPE_NAMES,
    SCALE_DTYPES,
    SCALE_TORCH_DTYPES,
    FormatReader,
    LayerEntry,
    Stored,
    TensorIndex,
    check_finite,
    check_fp8_codes,
    expect,
    stored_specs,
)
from .patterns import NameRules
from .schema import Config, Number, PositivePair, Str, StrList

FP8_WEIGHTS = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


class FP8Adapter:
    """fp8 weight + scales (+ static input scale) <-> canonical fp8 tensors.

    ``scale``: the stored scale's name; ``scale_shape``: its stored shape for one unfused layer
    (``()``/``(1,)`` per tensor, ``(N,)``/``(N, 1)`` per channel, the block grid per block).
    """

    def __init__(
        self,
        scale: str = "weight_scale",
        input_scale: str = "input_scale",
        channel_shape: str = "N1",
        weight: str = "weight",
    ) -> None:
        self.scale, self.input_scale, self.channel_shape, self.weight = (
            scale,
            input_scale,
            channel_shape,
            weight,
        )
        self.name = f"fp8 ({scale})"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        sdt = SCALE_TORCH_DTYPES[scheme.scale_dtype]
        flat = scheme.granularity == "channel" and self.channel_shape == "N"
        layout = {
            self.weight: Stored("qweight"),
            self.scale: Stored("scales", sdt, shape=(N,) if flat else None),
            self.input_scale: Stored("input_scale", sdt),
        }
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        s = tensors[self.scale].float()
        check_finite(s, self.scale)
        if scheme.granularity == "tensor":
            s = s.reshape(-1)
        elif scheme.granularity == "channel":
            s = s.reshape(N, 1)
        check_fp8_codes(tensors[self.weight], self.weight)
        out = {"qweight": tensors[self.weight].contiguous(), "scales": s.contiguous()}
        if scheme.act is not None and not scheme.act_dynamic:
            inp = tensors[self.input_scale].float()
            check_finite(inp, self.input_scale)
            if bool((inp <= 0).any()):
                raise CheckpointError(
                    f"{self.input_scale}: a static activation scale must be positive, found "
                    f"{inp.reshape(-1).tolist()} (an uncalibrated scale?)"
                )
            out["input_scale"] = inp.max().reshape(1)
        return CanonicalWeight(scheme, N, K, out, output_sizes)


def fp8_scheme(
    weight_dtype: torch.dtype,
    granularity: str,
    *,
    block: tuple[int, int] | None = None,
    act: str | None = None,
    scale_dtype: torch.dtype = torch.float32,
    where: str = "",
) -> Scheme:
    """act: None (weight-only), ``token`` (dynamic per token), ``static`` or ``dyn`` (per tensor),
    ``group`` (dynamic per token in groups of the block's K)."""
    if weight_dtype not in FP8_WEIGHTS:
        raise CheckpointError(f"{where}: fp8 weights are float8_e4m3fn or float8_e5m2, found {weight_dtype}")
    kw: dict[str, Any] = {
        "weight": FP8_WEIGHTS[weight_dtype],
        "bits": 8,
        "granularity": granularity,
        "scale_dtype": SCALE_DTYPE_NAMES.get(scale_dtype, "fp32"),
    }
    if granularity == "block":
        kw["block"] = block
    if act == "token":
        kw.update(act="fp8_e4m3", act_granularity="token", act_dynamic=True)
    elif act in ("static", "dyn"):
        kw.update(act="fp8_e4m3", act_granularity="tensor", act_dynamic=act == "dyn")
    elif act == "group":
        assert block is not None
        kw.update(act="fp8_e4m3", act_granularity="token_group", act_dynamic=True, act_group=block[1])
    try:
        return Scheme(**kw)
    except Exception as e:
        raise CheckpointError(f"{where}: {e}") from None


def fp8_layer(
    index: TensorIndex,
    prefix: str,
    scheme_of: Any,
    adapter: FP8Adapter,
    where: str,
    block: tuple[int, int] | None = None,
) -> LayerEntry:
    """One fp8 layer: shapes checked against the scale layout the format declares."""
    w = f"{prefix}.{adapter.weight}"
    expect(index, w, None, tuple(FP8_WEIGHTS), "fp8 weight")
    N, K = index.shape(w)
    sname = f"{prefix}.{adapter.scale}"
    if sname not in index:
        raise CheckpointError(f"missing tensor {sname!r} (fp8 layer {prefix})")
    sshape = index.shape(sname)
    if block is not None:
        bn, bk = block
        grid = (-(-N // bn), -(-K // bk))
        if tuple(sshape) != grid:
            raise CheckpointError(
                f"{index.where(sname)}: block scales {list(sshape)} do not cover the weight "
                f"[{N}, {K}] in {bn}x{bk} blocks (expected {list(grid)})"
            )
        gran = "block"
    elif math.prod(sshape) == 1 and len(sshape) <= 2:
        gran = "tensor"
    elif tuple(sshape) in ((N, 1), (N,)):
        gran = "channel"
        adapter.channel_shape = "N1" if len(sshape) == 2 else "N"
    else:
        raise CheckpointError(
            f"{index.where(sname)}: expected a per-tensor scale ([] or [1]) or per-channel scales "
            f"([{N}, 1] or [{N}]), found {list(sshape)}"
        )
    expect(index, sname, None, SCALE_DTYPES)
    scheme = scheme_of(index.dtype(w), gran, index.dtype(sname))
    if scheme.act is not None and not scheme.act_dynamic:
        iname = f"{prefix}.{adapter.input_scale}"
        expect(index, iname, None, FLOAT_DTYPES, "static activation scale")
        if math.prod(index.shape(iname)) != 1:
            raise CheckpointError(
                f"{index.where(iname)}: a static per-tensor input scale has one value, found shape "
                f"{list(index.shape(iname))}"
            )
    tensors = {r: f"{prefix}.{r}" for r in adapter.tensor_specs(scheme, N, K)}
    bias = f"{prefix}.bias" if f"{prefix}.bias" in index else None
    return LayerEntry(prefix, scheme, N, K, tensors, adapter, bias=bias)


def fp8_prefixes(index: TensorIndex) -> list[str]:
    """Prefixes whose ``weight`` is stored in an fp8 dtype."""
    return [
        n[: -len(".weight")]
        for n in index.names()
        if n.endswith(".weight") and index.dtype(n) in FP8_WEIGHTS and len(index.shape(n)) == 2
    ]


class FP8Config(Config):
    """``quant_method: fp8`` (transformers' FineGrainedFP8Config, AutoFP8, Quark's fp8 mode)."""

    activation_scheme: Str = None
    weight_block_size: PositivePair | None = None
    ignored_layers: StrList | None = None
    modules_to_not_convert: StrList | None = None


class FbgemmFP8Config(Config):
    """``quant_method: fbgemm_fp8``: the keys quantrt reads."""

    modules_to_not_convert: StrList | None = None
    activation_scale_ub: Number | None = None


class FP8Reader(FormatReader):
    """``quant_method: fp8``: per-tensor (static or dynamic activations) or block-wise weights."""

    name = "fp8"
    schema = FP8Config

    def ignored(self) -> dict[str, str]:
        """Scales beside a weight that is not stored in fp8: transformers' FP8 writer leaves layers
        whose N or K is not a multiple of the block dense but still saves their (uninitialised)
        scale, which its own reload wrongly applies."""
        out: dict[str, str] = {}
        fp8 = set(fp8_prefixes(self.index))
        for name in self.index.names():
            for leaf in (".weight_scale_inv", ".weight_scale"):
                prefix = name[: -len(leaf)]
                if name.endswith(leaf) and prefix not in fp8 and f"{prefix}.weight" in self.index:
                    out[name] = f"a scale beside {prefix}.weight, which is stored dense (not fp8)"
        return out

    def quantized_layers(self) -> dict[str, LayerEntry]:
        act = self.cfg("activation_scheme", required=True).lower()
        if act not in ("static", "dynamic"):
            raise CheckpointError(
                f"{self.source}: activation_scheme must be static or dynamic, found {act!r}"
            )
        block = self.cfg("weight_block_size", default=None)
        if block is not None:
            if act != "dynamic":
                raise CheckpointError(
                    f"{self.source}: block-wise fp8 needs activation_scheme dynamic, found {act}"
                )
        key = "ignored_layers" if "ignored_layers" in self.qconfig else "modules_to_not_convert"
        ignored = list(self.cfg(key, default=None) or [])
        rules = NameRules(ignored, self.at(key))
        out: dict[str, LayerEntry] = {}
        for prefix in fp8_prefixes(self.index):
            if ignored and (rules.first(prefix) or any(prefix.endswith("." + i) for i in ignored)):
                raise CheckpointError(f"{self.source}: {prefix} is in ignored_layers but stores fp8 weights")
            if block is not None:
                bt = (block[0], block[1])

                def scheme_of(
                    wd: torch.dtype, gran: str, sd: torch.dtype, bt: tuple[int, int] = bt
                ) -> Scheme:
                    return fp8_scheme(wd, gran, block=bt, act="group", scale_dtype=sd, where=self.source)

                out[prefix] = fp8_layer(
                    self.index, prefix, scheme_of, FP8Adapter("weight_scale_inv"), self.source, bt
                )
            else:
                mode = "static" if act == "static" else "token"

                def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype, mode: str = mode) -> Scheme:
                    return fp8_scheme(wd, gran, act=mode, scale_dtype=sd, where=self.source)

                # AutoFP8 names its scales weight_scale / input_scale; transformers' FineGrainedFP8
                # weight_scale_inv / activation_scale (both multipliers)
                scale = "weight_scale" if f"{prefix}.weight_scale" in self.index else "weight_scale_inv"
                inp = "input_scale" if f"{prefix}.input_scale" in self.index else "activation_scale"
                out[prefix] = fp8_layer(self.index, prefix, scheme_of, FP8Adapter(scale, inp), self.source)
        return out


class FbgemmFP8Reader(FormatReader):
    """``quant_method: fbgemm_fp8``: per-channel fp8 weights, dynamic per-token activations.

    Its ``activation_scale_ub`` (an upper bound on each token's activation scale) is not applied:
    the scheme's per-token activations match it whenever a token's amax stays below the bound.
    """

    name = "fbgemm_fp8"
    schema = FbgemmFP8Config

    def quantized_layers(self) -> dict[str, LayerEntry]:
        skip = list(self.cfg("modules_to_not_convert", default=None) or [])
        out: dict[str, LayerEntry] = {}
        for prefix in fp8_prefixes(self.index):
            if any(prefix == s or prefix.endswith("." + s) for s in skip):
                raise CheckpointError(
                    f"{self.source}: {prefix} is in modules_to_not_convert but stores fp8 weights"
                )

            def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype, prefix: str = prefix) -> Scheme:
                if gran != "channel":
                    raise CheckpointError(
                        f"{self.source}: {prefix}: fbgemm_fp8 stores per-channel scales, found {gran}"
                    )
                return fp8_scheme(wd, gran, act="token", scale_dtype=sd, where=self.source)

            entry = fp8_layer(self.index, prefix, scheme_of, FP8Adapter(), self.source)
            entry.notes.append("activation_scale_ub not applied to per-token activation scales")
            out[prefix] = entry
        return out
