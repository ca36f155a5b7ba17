"""compressed-tensors (llm-compressor): pack-quantized, int-quantized and naive-quantized integers;
float-quantized fp8, nvfp4-pack-quantized and mxfp4-pack-quantized (see ``FLOAT_FORMATS``).

``config_groups`` name the scheme of the layers they target: an exact name, a ``re:`` regex
(matched from the start of the layer name), or a module class name. A checkpoint carries no
class names, so a class target (``Linear``) is taken to cover every linear layer that no name
or regex target claims; ``ignore`` leaves layers dense. Each group may set its own ``format``.

pack-quantized: ``weight_packed`` int32 [N, K*b/32] (codes stored as q + 2^(b-1), packed along
K), ``weight_scale`` [N, K/G] or [N, 1], ``weight_zero_point`` int32 [N*b/32, K/G] packed along N
(asymmetric only, with the same offset), ``weight_shape`` [2] (read once, to learn N and K), ``weight_g_idx`` [K] (actorder
group). int/naive-quantized: ``weight`` int8 [N, K], ``weight_scale``, ``weight_zero_point``,
static ``input_scale``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..packing import pack_codes, unpack_int32, words_as_bytes
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
    prefixes_with,
    stored_specs,
)
from .fp4 import MXFP4Adapter, NVFP4Adapter, fp4_shape
from .fp8 import FP8Adapter, fp8_layer, fp8_scheme
from .gptq import Bits, checked_g_idx
from .patterns import NameRules
from .schema import Bool, Config, GroupSize, Str, StrList, leaf

INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
FLOAT_FORMATS = ("float-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized")
LATER_FORMATS = ("mxfp8-quantized", "mxfp6-pack-quantized", "sparse-24-bitmask", "marlin-24")

Dynamic = Annotated[bool | str, leaf('true, false or "local"', lambda v: type(v) is bool or v == "local")]
#: compressed-tensors takes a bool for the older spelling (true = "group")
ActOrder = Annotated[str | bool, leaf("a string, true or false", lambda v: type(v) in (str, bool))]
BlockStructure = Annotated[
    list[int] | str,
    leaf(
        'a list of two positive integers or "<rows>x<cols>"',
        lambda v: (
            (type(v) is list and len(v) == 2 and all(type(x) is int and x > 0 for x in v))
            or (type(v) is str and re.fullmatch(r"[1-9]\d{0,8}[xX][1-9]\d{0,8}", v) is not None)
        ),
    ),
]


class QuantizationArgs(Config):
    """compressed-tensors' QuantizationArgs (weights, input activations, the KV cache)."""

    num_bits: Bits = None
    type: Str | None = None
    symmetric: Bool | None = None
    strategy: Str | None = None
    group_size: GroupSize | None = None
    block_structure: BlockStructure | None = None
    dynamic: Dynamic | None = None
    actorder: ActOrder | None = None


class QuantizationScheme(Config):
    """One entry of ``config_groups``: the layers it targets and their numerics."""

    targets: StrList = None
    weights: QuantizationArgs | None = None
    input_activations: QuantizationArgs | None = None
    format: Str | None = None


class CompressedTensorsConfig(Config):
    """``quant_method: compressed-tensors`` (or ``compression_config``): the keys quantrt reads."""

    config_groups: dict[str, QuantizationScheme] | None = None
    ignore: StrList | None = None
    format: Str | None = None
    kv_cache_scheme: QuantizationArgs | None = None


class CTPackedAdapter:
    """pack-quantized tensors <-> canonical int tensors."""

    name = "compressed-tensors pack-quantized"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        words = Fraction(32, scheme.bits)
        layout = {
            "weight_packed": Stored("qweight", torch.int32, packing=words),
            "weight_scale": Stored("scales", SCALE_TORCH_DTYPES[scheme.scale_dtype]),
            "weight_zero_point": Stored("zeros", torch.int32, packing=words, along="output"),
            "weight_g_idx": Stored("g_idx"),
        }
        # static activation scales are not read from pack-quantized layers
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout, drop=("input_scale",))

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        b = scheme.bits
        packed, scale = tensors["weight_packed"], tensors["weight_scale"]
        check_finite(scale, "weight_scale")
        q = by_rows(N, lambda s, e: words_as_bytes(packed[s:e], b, K))
        out: dict[str, torch.Tensor] = {"qweight": q, "scales": scale.float().contiguous()}
        if scheme.granularity == "tensor":
            out["scales"] = out["scales"].reshape(-1)
        if not scheme.symmetric:
            zp = unpack_int32(tensors["weight_zero_point"], b, 0, N)
            out["zeros"] = zp.to(torch.int16).contiguous()
        if scheme.act_order:
            out["g_idx"] = checked_g_idx(tensors["weight_g_idx"], out["scales"].shape[-1], "weight_g_idx")
        return CanonicalWeight(scheme, N, K, out, output_sizes)


class CTIntAdapter:
    """int-quantized / naive-quantized tensors (one signed integer per int8) <-> canonical."""

    name = "compressed-tensors int-quantized"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        sdt = SCALE_TORCH_DTYPES[scheme.scale_dtype]
        layout = {
            "weight": Stored("qweight", torch.int8, packing=1),
            "weight_scale": Stored("scales", sdt),
            "weight_zero_point": Stored("zeros", torch.int8),
            "input_scale": Stored("input_scale", sdt),
        }
        # act-order group ids are not read from int-quantized layers
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout, drop=("g_idx",))

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        b = scheme.bits
        offset = 1 << (b - 1)
        w, scale = tensors["weight"], tensors["weight_scale"]
        check_finite(scale, "weight_scale")
        lo, hi = -offset, offset - 1
        if w.numel() and (int(w.min()) < lo or int(w.max()) > hi):
            raise CheckpointError(
                f"weight: {b}-bit values must lie in [{lo}, {hi}], found [{int(w.min())}, {int(w.max())}]"
            )
        q = by_rows(N, lambda s, e: pack_codes((w[s:e].to(torch.int16) + offset).to(torch.uint8), b))
        out: dict[str, torch.Tensor] = {"qweight": q, "scales": scale.float().contiguous()}
        if scheme.granularity == "tensor":
            out["scales"] = out["scales"].reshape(-1)
        if not scheme.symmetric:
            out["zeros"] = (tensors["weight_zero_point"].to(torch.int16) + offset).reshape(
                out["scales"].shape
            )
        if "input_scale" in tensors:
            check_finite(tensors["input_scale"], "input_scale")
            out["input_scale"] = tensors["input_scale"].float().max().reshape(1)
        return CanonicalWeight(scheme, N, K, out, output_sizes)


def weight_scheme(
    args: dict[str, Any], act: dict[str, Any] | None, K: int, scale_dtype: torch.dtype, where: str
) -> Scheme:
    """A QuantizationArgs dict (and the input_activations one) as a Scheme."""
    if args.get("type", "int") != "int":
        raise CheckpointError(
            f"{where}: {args.get('type')!r} weights arrive with the FP8/FP4 formats; "
            "this reader handles integer weights"
        )
    bits = args.get("num_bits", 8)
    sym = args.get("symmetric") is not False
    strategy = args.get("strategy")
    G = args.get("group_size")
    if strategy is None:
        strategy = "tensor" if G is None else ("channel" if G == -1 else "group")
    actorder = args.get("actorder")
    act_order = actorder is True or actorder in ("group", "dynamic")
    if strategy == "group":
        if not G or G <= 0 or K % G:
            raise CheckpointError(f"{where}: group_size {G} does not divide K={K}")
        gran: dict[str, Any] = {"granularity": "group", "group_size": int(G)}
        if G == K:
            gran = {"granularity": "channel"}
            act_order = False
    elif strategy in ("channel", "tensor"):
        gran = {"granularity": strategy}
    else:
        raise CheckpointError(
            f"{where}: weight strategy {strategy!r} is not an integer strategy this reader "
            "handles (tensor, channel, group)"
        )
    kw: dict[str, Any] = dict(
        weight="int",
        bits=bits,
        symmetric=sym,
        scale_dtype=SCALE_DTYPE_NAMES[scale_dtype],
        act_order=act_order,
        **gran,
    )
    if act:
        if act.get("type", "int") != "int" or act.get("num_bits", 8) != 8:
            raise CheckpointError(
                f"{where}: input activations {act.get('type')} {act.get('num_bits')}-bit are "
                "not an integer W8A8 scheme"
            )
        if act.get("symmetric") is False:
            raise CheckpointError(f"{where}: asymmetric int8 activations are not supported")
        a_strat = act.get("strategy") or "tensor"
        dynamic = bool(act.get("dynamic", False))
        if a_strat == "token":
            kw.update(act="int8", act_granularity="token", act_dynamic=True)
        elif a_strat == "tensor":
            kw.update(act="int8", act_granularity="tensor", act_dynamic=dynamic)
        else:
            raise CheckpointError(f"{where}: activation strategy {a_strat!r} is not token or tensor")
    try:
        return Scheme(**kw)
    except Exception as e:
        raise CheckpointError(f"{where}: {e}") from None


class CompressedTensorsReader(FormatReader):
    """``quant_method: compressed-tensors`` (or the older ``compression_config``), integer formats."""

    name = "compressed-tensors"
    schema = CompressedTensorsConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        groups = self.cfg("config_groups", required=True)
        if not isinstance(groups, dict) or not groups:
            raise CheckpointError(f"{self.source}: config_groups must be a non-empty object")
        ignore = NameRules(self.cfg("ignore", default=None) or [], self.at("ignore"))
        targets = {
            n: NameRules(_name_targets(g), self.at("config_groups", n, "targets")) for n, g in groups.items()
        }
        global_fmt = self.cfg("format", default=None)
        out: dict[str, LayerEntry] = {}
        prefixes = set(prefixes_with(self.index, "weight_packed")) | set(
            prefixes_with(self.index, "weight_scale")
        )
        for prefix in sorted(prefixes):
            if ignore.first(prefix):
                raise CheckpointError(f"{self.source}: {prefix} is in 'ignore' but stores quantized tensors")
            gname, group = self._group_for(prefix, groups, targets)
            fmt = group.get("format") or global_fmt
            if (
                fmt in ("naive-quantized", "int-quantized")
                and (group.get("weights") or {}).get("type") == "float"
            ):
                fmt = (
                    "float-quantized"  # unpacked fp8 weights: the library writes them as naive-quantized too
                )
            if fmt in FLOAT_FORMATS:
                out[prefix] = self._float_layer(prefix, fmt, group, f"{self.source} config group {gname!r}")
                continue
            if fmt in LATER_FORMATS:
                raise CheckpointError(f"{self.source}: format {fmt!r} ({prefix}) is not supported yet")
            if fmt not in INT_FORMATS:
                raise CheckpointError(
                    f"{self.source}: unknown compressed-tensors format {fmt!r} for {prefix}; "
                    f"known: {', '.join(INT_FORMATS + FLOAT_FORMATS)}"
                )
            out[prefix] = self._layer(prefix, fmt, group, f"{self.source} config group {gname!r}")
        return out

    def _group_for(
        self, prefix: str, groups: dict[str, Any], targets: dict[str, NameRules]
    ) -> tuple[str, dict[str, Any]]:
        by_name = [(n, g) for n, g in groups.items() if targets[n].first(prefix)]
        if by_name:
            return by_name[0]
        by_class = [
            (n, g) for n, g in groups.items() if any(not _is_name_target(t) for t in g.get("targets", []))
        ]
        if len(by_class) == 1:
            return by_class[0]
        if not by_class:
            raise CheckpointError(
                f"{self.source}: no config group targets {prefix}, which stores quantized tensors"
            )
        raise CheckpointError(
            f"{self.source}: {prefix} could match several class-name targets "
            f"({', '.join(n for n, _ in by_class)}); a checkpoint cannot tell module classes apart"
        )

    def _layer(self, prefix: str, fmt: str, group: dict[str, Any], where: str) -> LayerEntry:
        idx = self.index
        wargs = dict(group.get("weights") or {})
        act = group.get("input_activations")
        scale = f"{prefix}.weight_scale"
        expect(idx, scale, None, FLOAT_DTYPES)
        if fmt == "pack-quantized":
            shape_t = f"{prefix}.weight_shape"
            expect(idx, shape_t, (2,), (torch.int64, torch.int32))
            N, K = (int(v) for v in idx.read(shape_t).tolist())
            if N <= 0 or K <= 0:
                raise CheckpointError(
                    f"{idx.where(shape_t)}: expected two positive sizes [N, K], found [{N}, {K}]"
                )
            scheme = weight_scheme(wargs, act, K, idx.dtype(scale), f"{where}, layer {prefix}")
            adapter: Any = CTPackedAdapter()
        else:
            w = f"{prefix}.weight"
            expect(idx, w, None, (torch.int8,))
            N, K = idx.shape(w)
            scheme = weight_scheme(wargs, act, K, idx.dtype(scale), f"{where}, layer {prefix}")
            adapter = CTIntAdapter()
        specs = adapter.tensor_specs(scheme, N, K)
        roles = {r: f"{prefix}.{r}" for r in specs}
        zp = f"{prefix}.weight_zero_point"
        if scheme.symmetric and zp in idx:
            raise CheckpointError(f"{idx.where(zp)}: the config says symmetric, but zero-points are stored")
        for role, spec in specs.items():
            shape = None if role == "weight_scale" and scheme.granularity == "tensor" else spec.shape
            expect(idx, roles[role], shape, (spec.dtype, *_alternatives(spec.dtype)), f"{scheme} {N}x{K}")
        if scheme.granularity == "tensor" and idx.shape(scale) not in ((1,), ()):
            raise CheckpointError(
                f"{idx.where(scale)}: expected shape [1] (per tensor), found {list(idx.shape(scale))}"
            )
        bias = f"{prefix}.bias" if f"{prefix}.bias" in idx else None
        extras = [shape_t] if fmt == "pack-quantized" else []
        g_idx = f"{prefix}.weight_g_idx"
        if not scheme.act_order and g_idx in idx:
            # actorder over a single group (G == K): every id must be 0, so the ids carry nothing
            ids = idx.read(g_idx)
            if ids.numel() != K or bool(ids.ne(0).any()):
                raise CheckpointError(
                    f"{idx.where(g_idx)}: {scheme} has one group per row, so every group id must be 0; "
                    f"found {ids.numel()} ids in [{int(ids.min())}, {int(ids.max())}]"
                )
            extras.append(g_idx)
        return LayerEntry(prefix, scheme, N, K, roles, adapter, bias=bias, extras=extras)

    def _float_layer(self, prefix: str, fmt: str, group: dict[str, Any], where: str) -> LayerEntry:
        """float-quantized (fp8), nvfp4-pack-quantized and mxfp4-pack-quantized layers."""
        idx = self.index
        wargs = dict(group.get("weights") or {})
        act = group.get("input_activations")
        here = f"{where}, layer {prefix}"
        if wargs.get("type") != "float":
            raise CheckpointError(
                f"{here}: format {fmt} needs float weights, the config says {wargs.get('type')!r}"
            )
        bits = wargs.get("num_bits", 8)
        bias = f"{prefix}.bias" if f"{prefix}.bias" in idx else None
        if fmt == "float-quantized":
            if bits != 8:
                raise CheckpointError(f"{here}: float-quantized weights are 8-bit, found {bits}")
            strategy = wargs.get("strategy") or "tensor"
            block = None
            if strategy == "block":
                bs = wargs.get("block_structure")
                if isinstance(bs, str):
                    bs = [int(v) for v in bs.lower().split("x")]
                if not (isinstance(bs, list) and len(bs) == 2):
                    raise CheckpointError(
                        f"{here}: block strategy needs block_structure [rows, cols], found {bs!r}"
                    )
                block = (int(bs[0]), int(bs[1]))
            mode = _fp8_act_mode(act, block, here)

            def scheme_of(wd: torch.dtype, gran: str, sd: torch.dtype) -> Scheme:
                if gran != strategy:
                    raise CheckpointError(
                        f"{here}: the config says strategy {strategy!r} but weight_scale's shape "
                        f"is {gran}-wise"
                    )
                return fp8_scheme(wd, gran, block=block, act=mode, scale_dtype=sd, where=here)

            entry = fp8_layer(idx, prefix, scheme_of, FP8Adapter(), here, block)
            entry.bias = bias
            return entry
        if bits != 4:
            raise CheckpointError(f"{here}: {fmt} weights are 4-bit, found {bits}")
        if fmt == "nvfp4-pack-quantized":
            gs = wargs.get("group_size") or 16
            if gs != 16 or wargs.get("strategy") != "tensor_group":
                raise CheckpointError(
                    f"{here}: nvfp4 weights are tensor_group with group_size 16, found "
                    f"{wargs.get('strategy')} {gs}"
                )
            N, K = fp4_shape(idx, prefix, "weight_packed", "weight_scale", 16)
            self._declared_shape(prefix, N, K, here, odd_k_error="NVFP4")
            scheme = parse_scheme("w4a4-nvfp4" if act else "w4a16-nvfp4")
            adapter: Any = NVFP4Adapter(
                "weight_packed", "weight_scale", "weight_global_scale", "input_global_scale", divisor=True
            )
        else:
            if act:
                raise CheckpointError(
                    f"{here}: MXFP4 with quantized activations is not supported (weight-only)"
                )
            N, K = fp4_shape(idx, prefix, "weight_packed", "weight_scale", 32)
            self._declared_shape(prefix, N, K, here, odd_k_error="MXFP4")
            scheme = parse_scheme("w4a16-mxfp4")
            adapter = MXFP4Adapter("weight_packed", "weight_scale")
        specs = adapter.tensor_specs(scheme, N, K)
        for role, spec in specs.items():
            shape = None if spec.per_slice else spec.shape
            expect(idx, f"{prefix}.{role}", shape, (spec.dtype,), f"{scheme} {N}x{K}")
            if spec.per_slice and idx.shape(f"{prefix}.{role}") not in ((1,), ()):
                raise CheckpointError(
                    f"{idx.where(f'{prefix}.{role}')}: expected one value, found shape "
                    f"{list(idx.shape(f'{prefix}.{role}'))}"
                )
        shape_t = f"{prefix}.weight_shape"
        extras = [shape_t] if shape_t in idx else []
        return LayerEntry(
            prefix, scheme, N, K, {r: f"{prefix}.{r}" for r in specs}, adapter, bias=bias, extras=extras
        )

    def _declared_shape(self, prefix: str, N: int, K: int, where: str, odd_k_error: str) -> None:
        """compressed-tensors also stores the unpacked shape; it must agree (an odd K cannot pack)."""
        shape_t = f"{prefix}.weight_shape"
        if shape_t not in self.index:
            return
        n, k = (int(v) for v in self.index.read(shape_t).tolist())
        if k % 2:
            raise CheckpointError(
                f"{self.index.where(shape_t)}: {odd_k_error} with odd K={k} cannot be packed two "
                "codes per byte"
            )
        if (n, k) != (N, K):
            raise CheckpointError(
                f"{self.index.where(shape_t)}: declares [{n}, {k}] but weight_packed holds [{N}, {K}]"
            )


def _fp8_act_mode(act: dict[str, Any] | None, block: tuple[int, int] | None, where: str) -> str | None:
    """compressed-tensors input_activations of an fp8 layer as fp8_scheme's activation mode."""
    if not act:
        return None
    if act.get("type") != "float" or act.get("num_bits", 8) != 8:
        raise CheckpointError(
            f"{where}: fp8 weights pair with fp8 activations, found {act.get('type')} "
            f"{act.get('num_bits')}-bit"
        )
    strategy = act.get("strategy") or "tensor"
    dynamic = bool(act.get("dynamic", False))
    if strategy == "token":
        return "token"
    if strategy == "tensor":
        return "dyn" if dynamic else "static"
    if strategy == "group":
        gs = act.get("group_size")
        if block is None or gs != block[1] or not dynamic:
            raise CheckpointError(
                f"{where}: per-group fp8 activations (group {gs}) pair with dynamic quantization "
                f"and block weights of the same K, found block {block}"
            )
        return "group"
    raise CheckpointError(f"{where}: fp8 activation strategy {strategy!r} is not token, tensor or group")


def _alternatives(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    if dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES
    if dtype == torch.int32:
        return (torch.int64,)
    return ()


def _is_name_target(t: str) -> bool:
    return t.startswith("re:") or "." in t


def _name_targets(group: dict[str, Any]) -> list[str]:
    return [t for t in group.get("targets", []) if _is_name_target(t)]
