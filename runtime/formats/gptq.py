"""GPTQ (AutoGPTQ, GPTQModel, HF GPTQConfig) and the GPTQ layouts auto-round writes.

Per linear: ``qweight`` int32 [K*b/32, N] packed along K (LSB-first; 3-bit as a dense bit
stream), ``qzeros`` int32 [K/G, N*b/32] packed along N, ``scales`` [K/G, N], ``g_idx`` [K].
``checkpoint_format: gptq`` (v1) stores every zero-point minus one, so the zero is
``stored + 1`` (a true zero of 0 reads as 2^b, as vLLM reads it); ``gptq_v2`` and auto-round's
native packing store it as is. Under row-parallel act-order the scales and zeros are
replicated (group ids are global) and only ``qweight`` and ``g_idx`` are cut.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import torch

from ..canonical import CanonicalWeight, canonical_specs, g_idx_spec
from ..errors import CheckpointError
from ..packing import unpack_int32, words_as_bytes
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import (
    FLOAT_DTYPES,
    SCALE_DTYPE_NAMES,
    SCALE_TORCH_DTYPES,
    FormatReader,
    LayerEntry,
    Stored,
    TensorIndex,
    by_rows,
    check_finite,
    expect,
    prefixes_with,
    stored_specs,
)
from .patterns import Pattern, compile_patterns
from .schema import Bool, Config, GroupSize, Str, int_in

GPTQ_BITS = (2, 3, 4, 8)
#: what a config may say for bits before the format's own set (GPTQ_BITS) is checked per layer
Bits = int_in(1, 8)


class GPTQOverride(Config):
    """One GPTQModel ``dynamic`` override: the keys it may change for the layers it matches."""

    bits: Bits = None
    group_size: GroupSize = None
    sym: Bool = None
    desc_act: Bool = None


class GPTQConfig(Config):
    """``quant_method: gptq`` (AutoGPTQ, GPTQModel, HF GPTQConfig): the keys quantrt reads."""

    bits: Bits = None
    group_size: GroupSize = None
    sym: Bool | None = None
    desc_act: Bool | None = None
    checkpoint_format: Str | None = None
    dynamic: dict[str, GPTQOverride | None] | None = None


class GPTQAdapter:
    """GPTQ-layout tensors of one layer <-> canonical int tensors."""

    def __init__(self, bits: int, zero_offset: int, has_g_idx: bool = True) -> None:
        self.bits, self.zero_offset, self.has_g_idx = bits, zero_offset, has_g_idx
        self.name = "gptq" if zero_offset else "gptq-raw-zeros"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        # zero-points are stored for symmetric weights too (every one 2^(b-1)), g_idx without act-order too
        canonical = canonical_specs(scheme.with_(symmetric=False), N, K, num_slices)
        if self.has_g_idx:
            canonical.setdefault("g_idx", g_idx_spec(K))
        words = Fraction(32, self.bits)
        layout = {
            "qweight": Stored("qweight", torch.int32, packing=words, transposed=True),
            "qzeros": Stored("zeros", torch.int32, packing=words, along="output", transposed=True),
            "scales": Stored("scales", SCALE_TORCH_DTYPES[scheme.scale_dtype], transposed=True),
            "g_idx": Stored("g_idx"),
        }
        return stored_specs(canonical, N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        b = self.bits
        qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
        check_finite(scales, "scales")
        q = by_rows(N, lambda s, e: words_as_bytes(qweight[:, s:e].T, b, K))
        ng = scales.shape[0]
        z = unpack_int32(qzeros, b, 1, N).T.to(torch.int16) + self.zero_offset  # [N, ng]
        out: dict[str, torch.Tensor] = {"qweight": q, "scales": scales.float().T.contiguous()}
        if scheme.symmetric:
            mid = 1 << (b - 1)
            if not bool((z == mid).all()):
                found = sorted({int(v) for v in z.unique()[:5]})
                raise CheckpointError(
                    f"qzeros: the config says sym, so every zero-point is {mid}, but the "
                    f"stored ones decode to {found}..."
                )
        else:
            out["zeros"] = z.contiguous()
        if scheme.act_order:
            out["g_idx"] = checked_g_idx(tensors["g_idx"], ng, "g_idx")
        elif self.has_g_idx and K:
            # a row-parallel rank holds global group ids, so compare from its first one
            g = tensors["g_idx"].long()
            want = torch.arange(K, device=g.device) // (scheme.group_size or K) + int(g[0])
            if not torch.equal(g, want):
                raise CheckpointError(
                    "g_idx: the config says desc_act false (no act-order) but g_idx is not k // group_size"
                )
        return CanonicalWeight(scheme, N, K, out, output_sizes)


def checked_g_idx(g: torch.Tensor, ng: int, name: str) -> torch.Tensor:
    """Group ids range-checked in their stored dtype, then int32: casting first would wrap an
    int64 id of 2^32 + 1 to 1, a valid-looking group."""
    if g.numel():
        lo, hi = int(g.min()), int(g.max())
        if lo < 0 or hi >= ng:
            raise CheckpointError(f"{name}: group ids must lie in [0, {ng - 1}], found [{lo}, {hi}]")
    return g.to(torch.int32).contiguous()


def int_scheme(
    bits: int, group_size: int, K: int, sym: bool, act_order: bool, scale_dtype: torch.dtype, where: str
) -> Scheme:
    """The Scheme of a GPTQ-family layer, with format errors named."""
    if bits not in GPTQ_BITS:
        raise CheckpointError(f"{where}: bits must be one of {GPTQ_BITS}, found {bits}")
    G = K if group_size in (-1, 0, None) or group_size >= K else group_size
    if K % G:
        raise CheckpointError(f"{where}: group_size {G} does not divide K={K}")
    gran = "channel" if G == K else "group"
    return Scheme(
        "int",
        bits,
        gran,
        G if gran == "group" else None,
        symmetric=sym,
        scale_dtype=SCALE_DTYPE_NAMES[scale_dtype],
        act_order=act_order and gran == "group",
    )


def gptq_layer(
    index: TensorIndex,
    prefix: str,
    bits: int,
    group_size: int,
    sym: bool,
    desc_act: bool,
    adapter: GPTQAdapter,
    where: str,
) -> LayerEntry:
    """Read one GPTQ-layout layer's shapes, check every tensor, and name its scheme."""
    qw = f"{prefix}.qweight"
    expect(index, qw, None, (torch.int32,))
    rows, N = index.shape(qw)
    K = rows * 32 // bits
    if bits == 3:
        K = rows * 32 // 3
    if -(-K * bits // 32) != rows:
        raise CheckpointError(f"{index.where(qw)}: {rows} rows of {bits}-bit codes do not make a whole K")
    scales = f"{prefix}.scales"
    if scales not in index:
        raise CheckpointError(f"missing tensor {scales!r} (GPTQ layer {prefix})")
    scheme = int_scheme(bits, group_size, K, sym, desc_act, index.dtype(scales), f"{where} layer {prefix}")
    G = scheme.group_size or K
    ng = K // G
    expect(index, scales, (ng, N), FLOAT_DTYPES, f"scales of {K}x{N} in groups of {G}")
    expect(index, f"{prefix}.qzeros", (ng, -(-N * bits // 32)), (torch.int32,))
    tensors = {"qweight": qw, "qzeros": f"{prefix}.qzeros", "scales": scales}
    if adapter.has_g_idx:
        expect(index, f"{prefix}.g_idx", (K,), (torch.int32, torch.int64), "group index per input channel")
        tensors["g_idx"] = f"{prefix}.g_idx"
    bias = f"{prefix}.bias" if f"{prefix}.bias" in index else None
    return LayerEntry(prefix, scheme, N, K, tensors, adapter, bias=bias)


class GPTQReader(FormatReader):
    """``quant_method: gptq`` (or a standalone quantize_config.json), with GPTQModel's ``dynamic``."""

    name = "gptq"
    schema = GPTQConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        bits = self.cfg("bits", required=True)
        group = self.cfg("group_size", required=True)
        sym = self.cfg("sym") is not False  # unset or null: GPTQ's default, symmetric
        desc_act = self.cfg("desc_act") is True
        fmt = (self.cfg("checkpoint_format", default="gptq") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"{self.source}: checkpoint_format {fmt!r} is not gptq or gptq_v2")
        rules = self._dynamic_rules()
        out: dict[str, LayerEntry] = {}
        for prefix in prefixes_with(self.index, "qweight"):
            over = _dynamic_for(prefix, rules)
            if over is None:
                raise CheckpointError(
                    f"{self.source}: dynamic rule excludes {prefix} (-:) but it stores qweight"
                )
            b = over.get("bits", bits)
            adapter = GPTQAdapter(b, zero_offset=1 if fmt == "gptq" else 0)
            out[prefix] = gptq_layer(
                self.index,
                prefix,
                b,
                over.get("group_size", group),
                over.get("sym", sym),
                over.get("desc_act", desc_act),
                adapter,
                self.source,
            )
        return out

    def _dynamic_rules(self) -> list[tuple[Pattern, dict[str, Any] | None]]:
        """GPTQModel's ``dynamic``: ``-:<regex>`` excludes, ``+:<regex>`` (or a bare regex)
        overrides; each regex compiled once and matched from the start of the layer name."""
        dyn = self.cfg("dynamic", default=None) or {}
        keys = [k[2:] if k.startswith(("-:", "+:")) else k for k in dyn]
        patterns = compile_patterns(keys, self.at("dynamic"))
        return [
            (p, None if key.startswith("-:") else dict(val or {}))
            for p, (key, val) in zip(patterns, dyn.items(), strict=True)
        ]


def _dynamic_for(prefix: str, rules: list[tuple[Pattern, dict[str, Any] | None]]) -> dict[str, Any] | None:
    for pattern, over in rules:
        if pattern.match(prefix):
            return over
    return {}
