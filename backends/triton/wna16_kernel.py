"""W4A16 and W8A16 through the portable Triton kernel, with the vendor's tile choices.

Batch size is unknown at load, so ``prepare`` fixes one tile configuration per M bucket
(GEMV-like with split-K for tiny M, wider tiles for large M) from the committed tuning table
for this architecture, each bucket one strategy; a call only compares M. Nothing autotunes at
run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm, int_codes, pack_int_codes
from quantrt.kernels import Verdict, check
from quantrt.prepared import Prepared, StrategyFn
from quantrt.specs import LayerSpec

from . import tile_table
from .vendor import Condition, TritonKernel


def wna16_scheme_conditions(spec: LayerSpec, bits: int) -> list[Condition]:
    """What every integer weight-only kernel (Triton, and a vendor's own) needs of the scheme, in
    the order ``explain`` reports the first that fails."""
    s = spec.scheme
    return [
        (
            s.weight == "int" and s.bits == bits,
            f"{bits}-bit integer weights",
            {"weight": s.weight, "bits": s.bits},
        ),
        (s.weight_only, "weight-only scheme", {"act": s.act}),
        (s.granularity in ("group", "channel"), "group or channel scales", {"granularity": s.granularity}),
        (
            not s.act_order or spec.k_full,
            "act-order with the full K on this rank",
            {"K_part": spec.K_part, "K": spec.K},
        ),
    ]


def _block_k(group: int) -> int:
    for bk in (128, 64, 32):
        if group % bk == 0:
            return bk
    return 0


@dataclass(frozen=True)
class WNA16Layout:
    qweight: torch.Tensor  # canonical codes: int4 uint8 [N, K/2] (even k low) or int8 [N, K]
    scales: torch.Tensor  # [N, K/G] in the activation dtype
    zeros: torch.Tensor | None  # [N, K/G] in the activation dtype, None: symmetric
    perm: torch.Tensor | None  # int32 [K]: act-order's input-channel order, gathered in the kernel
    group: int
    bits: int
    out_dtype: torch.dtype


def _tile(matmul: Any, config: Any) -> StrategyFn:
    """The strategy running one tile configuration (``matmul`` bound at load: nothing imported per call)."""

    def fn(lay: WNA16Layout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
        y = matmul(x, lay.qweight, lay.scales, lay.zeros, lay.perm, lay.group, bias, config, out, lay.bits)
        return y if y.dtype == lay.out_dtype else y.to(lay.out_dtype)

    return fn


class TritonWNA16(TritonKernel):
    """The integer weight-only Triton family (declarations only differ: ``bits``): GEMV/GEMM
    tiles per M bucket from the vendor's tunings."""

    bits: ClassVar[int] = 4

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size if s.granularity == "group" else spec.K_part
        return check(
            *cls.policy.device_conditions(caps),
            *wna16_scheme_conditions(spec, cls.bits),
            (_block_k(G) > 0, "group size a multiple of 32", {"G": G}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        from .common import TileConfig, tile_strategies
        from .w4a16 import w4a16_matmul

        s = weight.scheme
        G = s.group_size if s.granularity == "group" else weight.K
        perm = act_order_perm(weight, G)
        q = weight["qweight"]
        if perm is not None:
            q = pack_int_codes(int_codes(weight)[:, perm].to(torch.uint8), self.bits)
            perm = perm.to(torch.int32).contiguous()
        act = spec.act_dtype
        zeros = weight.get("zeros")
        table = self.policy.table("w4a16", self.policy.target(q.device))
        # the GEMV kernel (block_m 1) serves int4 at M=1 only; tiles need 16 rows
        section = {
            k: table[k]
            if (k == "1" and self.bits == 4)
            else {**table[k], "block_m": max(16, table[k]["block_m"])}
            for k in tile_table.KEYS
        }
        configs = tile_table.tile_configs(section, weight.N, weight.K, TileConfig, block=(None, G))
        layout = WNA16Layout(
            q.contiguous(),
            weight["scales"].to(act).contiguous(),
            None if zeros is None else zeros.to(act).contiguous(),
            perm,
            G,
            self.bits,
            spec.output_dtype,
        )
        strategies = tile_strategies(
            tile_table.BUCKETS, configs, tile_table.describe, lambda c: _tile(w4a16_matmul, c)
        )
        # the launcher also runs fp32 activations (IEEE dots): a layer prepared for them takes them,
        # though planning never picks this kernel for fp32 (the tests check its numerics so)
        extra = () if act in self.act_dtypes else (act,)
        return self.prepared(layout, strategies, spec, q.device, act_dtypes=(*self.act_dtypes, *extra))


class TritonW4A16(TritonWNA16):
    short_name = "triton_w4a16"
    description = "Triton int4 weight-only: dequantize in registers, split-K for small M"
    bits = 4


class TritonW8A16(TritonWNA16):
    short_name = "triton_w8a16"
    description = "Triton int8 weight-only: dequantize in registers, split-K for small M"
    bits = 8
