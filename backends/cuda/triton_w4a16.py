"""W4A16 and W8A16 on NVIDIA GPUs through the portable Triton kernel, with NVIDIA's tile choices.

Batch size is unknown at load, so ``prepare`` fixes one tile configuration per M bucket
(GEMV-like with split-K for tiny M, wider tiles for large M) from the committed tuning table
for this architecture; ``apply`` picks a bucket by comparing M. Nothing autotunes at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm, int_codes, pack_int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec

from . import tile_table
from .wna16_rules import wna16_conditions


def _block_k(group: int) -> int:
    for bk in (128, 64, 32):
        if group % bk == 0:
            return bk
    return 0


@dataclass
class W4A16State:
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    perm: torch.Tensor | None
    group: int
    configs: tuple[Any, ...]  # one TileConfig per bucket
    out_dtype: torch.dtype
    matmul: Any  # the launcher, bound once so apply() imports nothing
    bits: int


class CudaTritonWNA16(Kernel):
    """Integer weight-only GEMV/GEMM in Triton, tiles per M bucket from the committed tunings."""

    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 40
    bits = 4

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size if s.granularity == "group" else spec.K_part
        return check(
            *wna16_conditions(spec, caps, cls.bits, "triton", "it builds the kernel"),
            (_block_k(G) > 0, "group size a multiple of 32", {"G": G}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> W4A16State:
        from quantrt.backends.triton.common import TileConfig
        from quantrt.backends.triton.w4a16 import w4a16_matmul

        s = weight.scheme
        G = s.group_size if s.granularity == "group" else weight.K
        perm = act_order_perm(weight, G)
        q = weight["qweight"]
        if perm is not None:
            q = pack_int_codes(int_codes(weight)[:, perm].to(torch.uint8), self.bits)
            perm = perm.to(torch.int32).contiguous()
        act = spec.act_dtype
        zeros = weight.get("zeros")
        table = tile_table.load("w4a16", tile_table.arch_of(q))
        # the GEMV kernel (block_m 1) serves int4 at M=1 only; tiles need 16 rows
        section = {
            k: table[k]
            if (k == "1" and self.bits == 4)
            else {**table[k], "block_m": max(16, table[k]["block_m"])}
            for k in tile_table.KEYS
        }
        configs = tile_table.tile_configs(section, weight.N, weight.K, TileConfig, block=(None, G))
        return W4A16State(
            q.contiguous(),
            weight["scales"].to(act).contiguous(),
            None if zeros is None else zeros.to(act).contiguous(),
            perm,
            G,
            configs,
            spec.output_dtype,
            w4a16_matmul,
            self.bits,
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return 4 * max_m * spec.N_part  # the fp32 split-K accumulator

    def strategy(self, state: W4A16State, m: int) -> str:
        return tile_table.describe(tile_table.pick(state.configs, m))

    def apply(
        self,
        state: W4A16State,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = tile_table.pick(state.configs, x.shape[0])
        if torch.compiler.is_compiling():  # traced: the registered op with its fake implementation
            y = torch.ops.quantrt.wna16_mm(
                x,
                state.qweight,
                state.scales,
                state.zeros,
                state.perm,
                bias,
                state.group,
                state.bits,
                c.block_m,
                c.block_n,
                c.block_k,
                c.split_k,
                c.num_warps,
                c.num_stages,
            )
        else:  # eager and CUDA-graph capture: the launcher directly (the op layer costs host time)
            y = state.matmul(
                x, state.qweight, state.scales, state.zeros, state.perm, state.group, bias, c, out, state.bits
            )
        return y if y.dtype == state.out_dtype else y.to(state.out_dtype)


class CudaTritonW4A16(CudaTritonWNA16):
    name = "cuda.triton_w4a16"
    description = "Triton int4 weight-only: dequantize in registers, split-K for small M"
    bits = 4


class CudaTritonW8A16(CudaTritonWNA16):
    name = "cuda.triton_w8a16"
    description = "Triton int8 weight-only: dequantize in registers, split-K for small M"
    bits = 8
