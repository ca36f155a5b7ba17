"""W4A16 and W8A16 on NVIDIA GPUs through the portable Triton kernel, with NVIDIA's tile choices.

Batch size is unknown at load, so ``prepare`` fixes one tile configuration per M bucket
(GEMV-like with split-K for tiny M, wider tiles for large M) from the committed tuning table
for this architecture; ``apply`` picks a bucket by comparing M. Nothing autotunes at run time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm, int_codes, pack_int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec

from .wna16_rules import wna16_conditions

#: M buckets: a batch of m rows uses the first bucket whose bound is >= m
BUCKETS = (1, 16, 64, 256, 1 << 62)


def _tuning(arch: str) -> dict[str, Any]:
    base = resources.files("quantrt.backends.cuda") / "tunings"
    for name in (f"w4a16_{arch}.json", "w4a16_default.json"):
        path = base / name
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError("quantrt.backends.cuda.tunings/w4a16_default.json is missing from the install")


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
        arch = (
            f"sm_{torch.cuda.get_device_capability(q.device)[0]}{torch.cuda.get_device_capability(q.device)[1]}"
            if q.is_cuda
            else "default"
        )
        table = _tuning(arch)
        bk = _block_k(G)
        configs = []
        for bound in BUCKETS:
            key = str(bound) if bound in (1, 16, 64, 256) else "large"
            c = dict(table[key])
            c["block_k"] = min(c.get("block_k", bk), bk)
            if c["block_m"] < 16 and (self.bits != 4 or bound > 1):
                c["block_m"] = 16  # the GEMV kernel (block_m 1) serves int4 at M=1; tiles need 16 rows
            split = c.pop("split_k_target", None)
            if split is not None:  # enough programs to fill the GPU: split K until N/BN * split >= target
                n_tiles = -(-weight.N // c["block_n"])
                k_tiles = weight.K // c["block_k"]
                c["split_k"] = max(1, min(k_tiles, -(-int(split) // n_tiles)))
            configs.append(TileConfig(**c))
        return W4A16State(
            q.contiguous(),
            weight["scales"].to(act).contiguous(),
            None if zeros is None else zeros.to(act).contiguous(),
            perm,
            G,
            tuple(configs),
            spec.output_dtype,
            w4a16_matmul,
            self.bits,
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return 4 * max_m * spec.N_part  # the fp32 split-K accumulator

    def strategy(self, state: W4A16State, m: int) -> str:
        c = self._config(state, m)
        return (
            f"{'splitk' if c.split_k > 1 else 'tile'} BM{c.block_m} BN{c.block_n} BK{c.block_k} S{c.split_k}"
        )

    @staticmethod
    def _config(state: W4A16State, m: int) -> Any:
        for bound, c in zip(BUCKETS, state.configs):
            if m <= bound:
                return c
        return state.configs[-1]

    def apply(
        self,
        state: W4A16State,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self._config(state, x.shape[0])
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
