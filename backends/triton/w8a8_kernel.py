"""FP8 and INT8 through the portable Triton kernels, with the vendor's choices.

- ``triton_fp8``: W8A8 fp8 with tensor or channel weight scales. Activations are quantized by one
  fused Triton pass (per token, per tensor, or with the static scale); small batches then run the
  Triton fp8 GEMV/split-K kernel, because cuBLASLt's row-wise ``_scaled_mm`` streams the weights
  slowly there, and large batches run ``torch._scaled_mm`` on the same codes where the vendor's
  target offers it (NVIDIA). On an e4m3fnuz device (MI300) the codes are re-read as fnuz, every
  scale doubled: the same products as the reference's.
- ``triton_block_fp8``: DeepSeek-V3 style block fp8 (128x128 weight blocks, 1x128 activation
  groups), which ``_scaled_mm`` rejects: group quantization and a Triton GEMM that applies both
  scales per k-block.
- ``triton_fp8_w8a16``: fp8 weights with 16-bit activations, decoded by integer bit tricks so it
  runs without fp8 matrix units (sm_80/86, Intel GPUs). There it also serves W8A8 fp8 checkpoints,
  as a weight-only substitute (labelled so: activations stay 16-bit).
- ``triton_int8``: W8A8 int8 with per-token (or static) activations and the scales applied in the
  GEMM's epilogue instead of extra passes over an int32 product.

Tile configurations per M bucket come from the vendor's ``tunings/w8a8_<arch>.json``
(``w8a8_default.json`` otherwise, see ``tile_table``); ``prepare`` fixes them, one strategy each,
nothing tunes at run time. The strategies themselves are in ``w8a8_ops`` (they import Triton).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec
from quantrt.torchops import SCHEME_FP8_MAX, fp8_as_fnuz, per_channel_scales

from .tile_table import BUCKETS, describe, tile_configs
from .vendor import Target, TritonKernel


def int8_w8a8_conditions(s: Any, caps: Any) -> tuple[tuple[bool, str, dict[str, Any]], ...]:
    """What the int8 W8A8 kernels (linear and MoE) need of the scheme and the device."""
    return (
        ("int8" in caps.matrix_types, "int8 matrix units", {"arch": caps.arch}),
        (
            s.weight == "int" and s.bits == 8 and s.symmetric,
            "symmetric int8 weights",
            {"weight": s.weight, "bits": s.bits, "symmetric": s.symmetric},
        ),
        (s.act == "int8", "int8 activations", {"act": s.act}),
        (s.granularity in ("tensor", "channel"), "tensor or channel scales", {"granularity": s.granularity}),
    )


def _static_scale(weight: CanonicalWeight) -> torch.Tensor | None:
    """The static activation scale as one fp32 value (the max over fused slices, as the reference)."""
    s = weight.get("input_scale")
    return None if s is None else s.float().amax().reshape(())


def _flavour(q: torch.Tensor, target: Target) -> tuple[torch.Tensor, float]:
    """The weight codes in the target's e4m3 flavour and the factor every scale takes with them."""
    return (fp8_as_fnuz(q), 2.0) if target.fnuz else (q, 1.0)


# -- fp8 W8A8, tensor or channel weight scales ------------------------------------------------


@dataclass(frozen=True)
class Fp8Layout:
    w: torch.Tensor  # fp8 [N, K] as stored
    w_scale: torch.Tensor  # fp32 [N]
    in_scale: torch.Tensor | None
    act: str  # how activations are quantized: "static", "token" or "tensor"
    tensorwise: bool  # one weight scale and one activation scale: _scaled_mm's per-tensor mode
    out_dtype: torch.dtype
    fp8: torch.dtype = torch.float8_e4m3fn  # the codes' flavour (activations quantized to it)
    mult: float = 1.0  # 2 for e4m3fnuz: dynamic activation scales doubled as the weights' were
    counters: Any = None  # common.TileCounters: the split-K launches' arrival counters


class TritonFp8(TritonKernel):
    """W8A8 fp8 (tensor/channel weights): fused activation quantization, Triton for small M,
    the vendor's ``_scaled_mm`` for large M where it has one."""

    short_name = "triton_fp8"
    description = (
        "fp8 W8A8: fused Triton activation quantization; Triton GEMV/split-K for small M, "
        "_scaled_mm above where the vendor's BLAS takes it"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *cls.policy.device_conditions(caps),
            cls.policy.fp8_units(caps),
            (s.weight == "fp8_e4m3", "fp8 e4m3 weights", {"weight": s.weight}),
            (s.act == "fp8_e4m3", "fp8 activations", {"act": s.act}),
            (
                s.granularity in ("tensor", "channel"),
                "tensor or channel scales",
                {"granularity": s.granularity},
            ),
            (
                s.act_granularity in ("token", "tensor"),
                "activations per token or per tensor",
                {"act_granularity": s.act_granularity},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from . import w8a8_ops
        from .bound import workspace_fn
        from .common import TileConfig, TileCounters, split_k_tiles, tile_strategies

        target = self.policy.target(weight["qweight"].device)
        q, mult = _flavour(weight["qweight"].contiguous(), target)
        table = self.policy.table("w8a8", target)["fp8_rowwise"]
        configs = tile_configs(table, weight.N, weight.K, TileConfig)
        # _scaled_mm needs K and N multiples of 16 and, with row-wise scales, a bf16 output
        s = weight.scheme
        tensorwise = (
            s.granularity == "tensor" and len(spec.output_sizes) == 1 and s.act_granularity == "tensor"
        )
        ok = (
            target.scaled_mm
            and weight.K % 16 == 0
            and weight.N % 16 == 0
            and (tensorwise or spec.output_dtype == torch.bfloat16)
        )
        gran = "static" if not s.act_dynamic else s.act_granularity
        in_scale = _static_scale(weight)
        layout = Fp8Layout(
            q,
            (per_channel_scales(weight) * mult).contiguous(),
            None if in_scale is None else in_scale * mult,
            gran,
            tensorwise,
            spec.output_dtype,
            q.dtype,
            mult,
            TileCounters(split_k_tiles(BUCKETS, configs, weight.N), q.device),
        )
        name = lambda c: "triton quant + " + describe(c)  # noqa: E731
        start = int(table.get("scaled_mm_from_m", 1 << 30)) if ok else ALL_M
        if not ok:
            strategies = tile_strategies(BUCKETS, configs, name, w8a8_ops.fp8_triton)
        else:  # batches of at least scaled_mm_from_m rows run torch._scaled_mm
            strategies = [
                *tile_strategies(BUCKETS, configs, name, w8a8_ops.fp8_triton, upto=start - 1),
                Strategy(ALL_M, "triton quant + _scaled_mm", w8a8_ops.fp8_scaled_mm),
            ]
        ws = None  # per-tensor dynamic scales take the checked path (a zeroed amax, a third launch)
        if gran != "tensor":
            ws = workspace_fn(BUCKETS, configs, weight.K, weight.N, 0 if gran == "static" else 1, start - 1)
        return self.prepared(layout, strategies, spec, q.device, workspace=ws)


# -- block fp8 --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockFp8Layout:
    w: torch.Tensor  # fp8 [N, K]
    w_scale: torch.Tensor  # fp32 [ceil(N/bn), ceil(K/bk)]
    block: tuple[int, int]
    out_dtype: torch.dtype
    fp8: torch.dtype = torch.float8_e4m3fn  # the codes' flavour (activations quantized to it)
    qmax: float = SCHEME_FP8_MAX  # activation groups' amax maps here (224 in fnuz: doubled scales)
    counters: Any = None  # common.TileCounters: the split-K launches' arrival counters


class TritonBlockFp8(TritonKernel):
    """Block fp8 W8A8 (128x128 weight blocks, 1x128 activation groups) as a Triton GEMM."""

    short_name = "triton_block_fp8"
    description = "block fp8 W8A8: per-token-group fp8 activations (Triton), Triton GEMM scaling per k-block"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        block = s.block or (16, 1 << 30)  # not a block scheme: the granularity condition says so first
        return check(
            *cls.policy.device_conditions(caps),
            cls.policy.fp8_units(caps),
            (s.weight == "fp8_e4m3", "fp8 e4m3 weights", {"weight": s.weight}),
            (s.granularity == "block", "block scales", {"granularity": s.granularity}),
            (s.act == "fp8_e4m3", "fp8 activations", {"act": s.act}),
            (
                s.act_granularity == "token_group" and s.act_group == block[1],
                "activation groups as wide as a weight block",
                {"act_granularity": s.act_granularity, "act_group": s.act_group, "block": s.block},
            ),
            (block[0] % 16 == 0 and block[1] % 16 == 0, "blocks of multiples of 16", {"block": s.block}),
            (
                spec.K_part % block[1] == 0 or spec.k_full,
                "this rank's K cut on block boundaries",
                {"K_part": spec.K_part, "block": s.block},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from . import w8a8_ops
        from .bound import workspace_fn
        from .common import TileConfig, TileCounters, split_k_tiles, tile_strategies

        bn, bk = weight.scheme.block
        target = self.policy.target(weight["qweight"].device)
        q, mult = _flavour(weight["qweight"].contiguous(), target)
        section = self.policy.table("w8a8", target)["fp8_block"]
        configs = tile_configs(section, weight.N, weight.K, TileConfig, block=(bn, bk))  # tiles inside blocks
        scales = (weight["scales"].float() * mult).contiguous()
        counters = TileCounters(split_k_tiles(BUCKETS, configs, weight.N), q.device)
        layout = BlockFp8Layout(
            q, scales, (bn, bk), spec.output_dtype, q.dtype, SCHEME_FP8_MAX / mult, counters
        )
        name = lambda c: "triton group quant + " + describe(c)  # noqa: E731
        ws = workspace_fn(BUCKETS, configs, weight.K, weight.N, -(-weight.K // bk))
        return self.prepared(
            layout, tile_strategies(BUCKETS, configs, name, w8a8_ops.block_fp8), spec, q.device, workspace=ws
        )


# -- fp8 weight-only --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp8WeightOnlyLayout:
    w: torch.Tensor  # fp8 [N, K]
    w_scale: torch.Tensor  # fp32 [N], or [ceil(N/bn), ceil(K/bk)] with block
    block: tuple[int, int] | None  # (bn, bk) of block scales, None for tensor/channel scales
    act: torch.dtype
    out_dtype: torch.dtype


class TritonFp8WeightOnly(TritonKernel):
    """fp8 weights with 16-bit activations, decoded by bit tricks (no fp8 hardware needed)."""

    short_name = "triton_fp8_w8a16"
    description = (
        "fp8 weight-only: codes decoded to fp16/bf16 by integer bit tricks (no fp8 units needed), Triton GEMM"
    )

    weight_only = True  # an activation-quantized scheme here is a weight-only substitute

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        fp8_hw = cls.policy.fp8_units(caps)[0]
        return check(
            *cls.policy.device_conditions(caps),
            (s.family == "fp8", "fp8 weights", {"weight": s.weight}),
            (
                s.act is None or not fp8_hw,
                "a weight-only scheme (fp8 matrix units run W8A8 natively)",
                {"act": s.act, "arch": caps.arch},
            ),
            (
                s.granularity != "block" or spec.K_part % s.block[1] == 0 or spec.k_full,
                "this rank's K cut on block boundaries",
                {"K_part": spec.K_part, "block": s.block},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from . import w8a8_ops
        from .common import TileConfig, tile_strategies

        s = weight.scheme
        q = weight["qweight"].contiguous()
        section = self.policy.table("w8a8", self.policy.target(q.device))["fp8_weight_only"]
        block: tuple[int, int] | None = None
        if s.granularity == "block":  # k tiles inside scale blocks (scales are read per column)
            block, scale = (s.block[0], s.block[1]), weight["scales"].float().contiguous()
        else:
            scale = per_channel_scales(weight).contiguous()
        configs = tile_configs(
            section, weight.N, weight.K, TileConfig, block=(None, block[1] if block else None)
        )
        layout = Fp8WeightOnlyLayout(q, scale, block, spec.act_dtype, spec.output_dtype)
        strategies = tile_strategies(BUCKETS, configs, describe, w8a8_ops.fp8_weight_only)
        return self.prepared(layout, strategies, spec, q.device)


# -- int8 W8A8 --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int8Layout:
    w: torch.Tensor  # int8 [N, K]
    w_scale: torch.Tensor  # fp32 [N]
    in_scale: torch.Tensor | None
    out_dtype: torch.dtype
    counters: Any = None  # common.TileCounters: the split-K launches' arrival counters


class TritonInt8(TritonKernel):
    """W8A8 int8: per-token (or static) int8 activations from one Triton pass, a Triton int8 GEMM
    with both scales and the bias in its epilogue (ahead of ``torch._int_mm`` in the CUDA list: faster
    than the bare op even at large M, see docs/performance.md)."""

    short_name = "triton_int8"
    act_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    description = (
        "int8 W8A8: fused Triton activation quantization, Triton int8 GEMM with scales in the epilogue"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *cls.policy.device_conditions(caps),
            *int8_w8a8_conditions(s, caps),
            (
                s.act_granularity == "token" or not s.act_dynamic,
                "activations per token or with a static scale",
                {"act_granularity": s.act_granularity, "act_dynamic": s.act_dynamic},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from . import w8a8_ops
        from .bound import workspace_fn
        from .common import TileConfig, TileCounters, split_k_tiles, tile_strategies

        q = (weight["qweight"].to(torch.int16) - 128).to(torch.int8).contiguous()  # canonical offset 128
        section = self.policy.table("w8a8", self.policy.target(q.device))["int8"]
        configs = tile_configs(section, weight.N, weight.K, TileConfig)
        layout = Int8Layout(
            q,
            per_channel_scales(weight).contiguous(),
            _static_scale(weight),
            spec.output_dtype,
            TileCounters(split_k_tiles(BUCKETS, configs, weight.N), q.device),
        )
        name = lambda c: "triton quant + " + describe(c)  # noqa: E731
        ws = workspace_fn(BUCKETS, configs, weight.K, weight.N, 0 if layout.in_scale is not None else 1)
        return self.prepared(
            layout, tile_strategies(BUCKETS, configs, name, w8a8_ops.int8), spec, q.device, workspace=ws
        )
