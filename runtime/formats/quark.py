"""AMD Quark exports (``quant_method: quark``): FP8 (e4m3/e5m2, per tensor or per channel,
static or dynamic activations), int4/uint4 group weight-only, and OCP MXFP4.

A layer's config is looked up as vLLM does: ``layer_quant_config`` by name pattern (``*``
wildcards, else substring), then ``global_quant_config`` (``layer_type_quant_config`` needs
module classes a checkpoint does not carry). ``exclude`` leaves layers dense.
FP8 stores ``weight``, ``weight_scale`` ([] per tensor, [N] per channel) and static
``input_scale``. int4/uint4 store ``weight`` int32 [K, N/8] packed along N (``pack_method``
``reorder``: AWQ's nibble interleave; ``order``: natural), ``weight_scale`` [K/G, N] and
``weight_zero_point`` [K/G, N/8]; int4 nibbles are two's complement. MXFP4 stores ``weight``
uint8 [N, K/2] and e8m0 ``weight_scale`` [N, K/32]. KV-cache scales are ``k_proj.output_scale``
and ``v_proj.output_scale`` (see ``quantrt.checkpoint.kv_cache``).
"""

from __future__ import annotations

from typing import Annotated, Any

import torch

from ..errors import CheckpointError
from ..schemes import Scheme, parse_scheme
from .awq import AWQAdapter
from .base import FLOAT_DTYPES, SCALE_DTYPE_NAMES, FormatReader, LayerEntry, expect
from .fp4 import MXFP4Adapter, fp4_shape
from .fp8 import FP8Adapter, fp8_layer, fp8_scheme
from .patterns import Pattern, compile_patterns
from .schema import LIST_PASSES, Bool, Config, GroupSize, Int, Str, StrList

FP8_TYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


class QuarkTensor(Config):
    """Quark's QuantizationSpec of one tensor (weight, input or output): the keys quantrt reads."""

    dtype: Str | None = None
    qscheme: Str | None = None
    group_size: GroupSize | None = None
    is_dynamic: Bool | None = None
    scale_format: Str | None = None
    ch_axis: Int | None = None


class QuarkLayer(Config):
    """One layer config (global, per name pattern); a list for ``weight`` is W4A8's two levels,
    which the reader refuses by name."""

    weight: Annotated[QuarkTensor | None, LIST_PASSES] = None
    input_tensors: QuarkTensor | None = None


class QuarkExport(Config):
    """Quark's ``export`` section: how int4 nibbles were packed."""

    pack_method: Str | None = None


class QuarkConfig(Config):
    """``quant_method: quark``: the keys quantrt reads."""

    export: QuarkExport | None = None
    exclude: StrList | None = None
    global_quant_config: QuarkLayer | None = None
    layer_quant_config: dict[str, QuarkLayer] | None = None


class QuarkReader(FormatReader):
    name = "quark"
    schema = QuarkConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        export = self.cfg("export", default=None)
        if not isinstance(export, dict):
            raise CheckpointError(
                f"{self.source}: a Quark config needs its 'export' section (pack_method ...)"
            )
        pack = export.get("pack_method") or "reorder"
        if pack not in ("reorder", "order"):
            raise CheckpointError(
                f"{self.source}: export.pack_method must be reorder or order, found {pack!r}"
            )
        exclude = compile_patterns(self.cfg("exclude", default=None) or [], self.at("exclude"), glob=True)
        layer_configs = self.cfg("layer_quant_config", default=None) or {}
        by_pattern = [
            (p, dict(cfg))
            for p, cfg in zip(
                compile_patterns(layer_configs, self.at("layer_quant_config"), glob=True),
                layer_configs.values(),
                strict=True,
            )
        ]
        out: dict[str, LayerEntry] = {}
        prefixes = {n[: -len(".weight_scale")] for n in self.index.names() if n.endswith(".weight_scale")}
        for prefix in sorted(prefixes):
            if any(_excluded(prefix, p) for p in exclude):
                raise CheckpointError(f"{self.source}: {prefix} is excluded but stores quantized tensors")
            cfg = self._config_for(prefix, by_pattern)
            w = cfg.get("weight")
            if isinstance(w, list):
                raise CheckpointError(
                    f"{self.source}: {prefix}: a two-level Quark weight (W4A8) is not supported"
                )
            if not isinstance(w, dict):
                raise CheckpointError(
                    f"{self.source}: {prefix} stores quantized tensors but its config has no weight"
                )
            out[prefix] = self._layer(prefix, w, cfg.get("input_tensors"), pack)
        return out

    def _config_for(self, prefix: str, by_pattern: list[tuple[Pattern, dict[str, Any]]]) -> dict[str, Any]:
        for pattern, cfg in by_pattern:
            if pattern.match(prefix) if "*" in pattern.text else pattern.text in prefix:
                return cfg
        return dict(self.cfg("global_quant_config", default=None) or {})

    def _layer(self, prefix: str, w: dict[str, Any], inp: dict[str, Any] | None, pack: str) -> LayerEntry:
        idx, here = self.index, f"{self.source}: layer {prefix}"
        dtype, qscheme = w.get("dtype"), w.get("qscheme")
        bias = f"{prefix}.bias" if f"{prefix}.bias" in idx else None
        if dtype in FP8_TYPES:
            mode = _act_mode(inp, here)

            def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype) -> Scheme:
                want = {"per_tensor": "tensor", "per_channel": "channel"}.get(qscheme)
                if gran != want:
                    raise CheckpointError(
                        f"{here}: the config says {qscheme} but weight_scale is {gran}-wise"
                    )
                if wd != FP8_TYPES[dtype]:
                    raise CheckpointError(f"{here}: the config says {dtype} but the weight is {wd}")
                return fp8_scheme(wd, gran, act=mode, scale_dtype=sd, where=here)

            entry = fp8_layer(idx, prefix, scheme_of, FP8Adapter(channel_shape="N"), here)
            entry.bias = bias
            return entry
        if dtype in ("int4", "uint4"):
            if inp:
                raise CheckpointError(f"{here}: int4 weights with quantized activations are not supported")
            if qscheme != "per_group":
                raise CheckpointError(f"{here}: int4 weights are per_group, found {qscheme!r}")
            G = w.get("group_size") or 0
            qw = f"{prefix}.weight"
            expect(idx, qw, None, (torch.int32,), "int4 packed along N")
            K, cols = idx.shape(qw)
            N = cols * 8
            if G <= 0 or K % G:
                raise CheckpointError(f"{here}: group_size {G} does not divide K={K}")
            scale = f"{prefix}.weight_scale"
            expect(idx, scale, (K // G, N), FLOAT_DTYPES)
            sym = dtype == "int4"
            gran = f"g{G}" if G < K else "ch"
            sd = SCALE_DTYPE_NAMES[idx.dtype(scale)]
            scheme = parse_scheme(
                f"w4a16-int-{gran}-{'sym' if sym else 'asym'}" + ("" if sd == "fp16" else f"-s{sd}")
            )
            adapter = AWQAdapter(
                "weight", "weight_scale", "weight_zero_point", interleave=pack == "reorder", signed=sym
            )
            expect(idx, f"{prefix}.weight_zero_point", (K // G, cols), (torch.int32,))
            tensors = {r: f"{prefix}.{r}" for r in ("weight", "weight_scale", "weight_zero_point")}
            return LayerEntry(prefix, scheme, N, K, tensors, adapter, bias=bias)
        if dtype == "fp4":
            if w.get("scale_format") not in (None, "e8m0") or (w.get("group_size") or 0) != 32:
                raise CheckpointError(
                    f"{here}: fp4 weights are OCP MXFP4 (e8m0 scales per 32), found "
                    f"{w.get('scale_format')} per {w.get('group_size')}"
                )
            N, K = fp4_shape(idx, prefix, "weight", "weight_scale", 32)
            entry = LayerEntry(
                prefix,
                parse_scheme("w4a16-mxfp4"),
                N,
                K,
                {"weight": f"{prefix}.weight", "weight_scale": f"{prefix}.weight_scale"},
                MXFP4Adapter("weight", "weight_scale"),
                bias=bias,
            )
            if inp:
                entry.notes.append("MXFP4 activations run 16-bit here (weight-only)")
            return entry
        raise CheckpointError(
            f"{here}: Quark weight dtype {dtype!r} is not supported; known: fp8_e4m3, fp8_e5m2, "
            "int4, uint4, fp4"
        )


def _act_mode(inp: dict[str, Any] | None, where: str) -> str | None:
    if not inp:
        return None
    if inp.get("dtype") not in FP8_TYPES:
        raise CheckpointError(f"{where}: fp8 weights pair with fp8 activations, found {inp.get('dtype')!r}")
    q, dynamic = inp.get("qscheme"), bool(inp.get("is_dynamic"))
    if q == "per_tensor":
        return "dyn" if dynamic else "static"
    if q == "per_channel" and dynamic:
        return "token"  # Quark's per-channel activations (ch_axis 1) are per token: PTPC
    raise CheckpointError(f"{where}: activation qscheme {q!r} (dynamic={dynamic}) is not supported")


def _excluded(prefix: str, pattern: Pattern) -> bool:
    """Quark's ``exclude``: an fnmatch wildcard, the layer's name, or its last components."""
    return pattern.match(prefix) or pattern.text == prefix or prefix.endswith("." + pattern.text)
