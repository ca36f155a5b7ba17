"""4-bit code-book weights on NVIDIA GPUs: NVFP4, MXFP4 and bitsandbytes NF4/FP4 (W4A16).

All four decode one nibble through a 16-value code book (e2m1 by bit tricks, NF4/FP4 from a
table) times a per-group scale, so one Triton kernel family serves them
(``backends/triton/lut4.py``): a GEMV that streams the codes along K for M = 1, a ``tl.dot``
tile for small batches, and from ``dense_from_m`` rows on the weight dequantized slice by slice
for cuBLAS (``dense_slices``). Prepared layout, chosen so no byte is added:

- NVFP4 / MXFP4: the canonical codes (low nibble = even k) and the 1-byte scales as stored
  (e4m3 bits, e8m0 exponents); NVFP4's global scale becomes one fp32 per output row.
- bitsandbytes: the flat blocks are cut into rows (``K % blocksize == 0``, so no block spans
  two rows), nibbles swapped to low = even k, and a double-quantized absmax resolved to fp32
  once at load (4 bytes per 64 weights instead of 1, the price of a single load per group).

A W4A4 NVFP4 checkpoint runs here as a weight-only substitute (activations stay 16-bit), which
``explain`` labels. Tiles per M bucket come from ``tunings/lut4_<arch>.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, dequantize_absmax, unpack_bnb4
from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec

from . import dense_slices, tile_table

ACT_DTYPES = (torch.float16, torch.bfloat16)
TABLE = "lut4"


@dataclass
class Lut4State:
    codes: torch.Tensor  # uint8 [N, K/2], low nibble = even k
    scales: torch.Tensor  # [N, K/G]: uint8 (e4m3 bits / e8m0 exponents) or fp32 absmax
    table: torch.Tensor | None  # fp32 [16] code book; None: e2m1
    row_scale: torch.Tensor | None  # fp32 [N] (NVFP4's global scale per row)
    group: int
    scale_kind: str  # "e4m3" | "e8m0" | "f32"
    configs: tuple[Any, ...]  # one TileConfig per M bucket
    dense_from: int  # batches of at least this many rows run dequant + cuBLAS
    slice_rows: int  # rows of W dequantized per cuBLAS call
    N: int
    K: int
    act: torch.dtype
    out_dtype: torch.dtype
    matmul: Any  # lut4_matmul, bound at load so apply() imports nothing
    dequant: Any  # lut4_dequant


def _conditions(spec: LayerSpec, caps: Any) -> list[tuple[bool, str, dict[str, Any]]]:
    return [
        ((caps.sm or 0) >= 80, "sm >= 80", {"sm": caps.sm}),
        (
            "triton" in caps.libraries,
            "triton importable (it builds the kernel)",
            {"libraries": caps.libraries},
        ),
        (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
        (spec.act_dtype in ACT_DTYPES, "activations bf16 or fp16", {"act_dtype": spec.act_dtype}),
    ]


def prepare_fp4(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
    """Codes, 1-byte scales as stored and NVFP4's global scale per row; NaN scale codes refused."""
    nv = weight.scheme.family == "nvfp4"
    scales = weight["scales"]
    if nv:
        scales = scales.view(torch.uint8)
        bad = scales.eq(0x7F) | scales.eq(0xFF)
        what = "e4m3 scale codes 0x7F/0xFF are NaN"
    else:
        bad = scales.eq(255)
        what = "e8m0 scale code 255 is NaN"
    nbad = int(bad.sum())  # load time: one synchronization per layer is fine
    if nbad:
        raise ValueError(f"{weight.scheme.name}: {what} ({nbad} of {scales.numel()} scales)")
    row = None
    if nv:
        row = weight["global_scale"].float()[weight.slice_index().to(scales.device)].contiguous()
    return weight["qweight"].contiguous(), scales.contiguous(), row, "e4m3" if nv else "e8m0"


def prepare_bnb4(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, N, K = weight.scheme, weight.N, weight.K
    G = s.group_size
    assert G is not None
    c = unpack_bnb4(weight["qweight"], N * K).view(N, K)
    codes = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
    if s.double_quant:
        nb = N * K // G
        offset = weight["offset"].float()
        if offset.numel() > 1:  # one offset per fused slice's quant state
            idx = weight.slice_index().to(offset.device)
            offset = offset[idx[torch.arange(nb, device=offset.device) * G // K]]
        absmax = dequantize_absmax(weight["absmax"], weight["nested_absmax"], weight["nested_code"], offset)
    else:
        absmax = weight["absmax"].float()
    return codes, absmax.reshape(N, K // G).contiguous(), weight["code"].float().contiguous()


class CudaTritonLut4(dense_slices.DequantSlicesKernel):
    """4-bit code-book weight-only matmul in Triton; dequant + cuBLAS for large M."""

    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 40
    table = TABLE

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Lut4State:
        from quantrt.backends.triton.common import TileConfig
        from quantrt.backends.triton.lut4 import lut4_dequant, lut4_matmul

        s = weight.scheme
        if s.family in ("nvfp4", "mxfp4"):
            codes, scales, row, kind = prepare_fp4(weight)
            table = None
        else:
            codes, scales, table = prepare_bnb4(weight)
            row, kind = None, "f32"
        G = s.group_size
        assert G is not None
        doc = tile_table.load(TABLE, tile_table.arch_of(codes))
        configs = tile_table.tile_configs(doc[TABLE], weight.N, weight.K, TileConfig)
        return Lut4State(
            codes, scales, table, row, G, kind, configs, int(doc["dense_from_m"]),
            dense_slices.rows_for(weight.N, weight.K, spec.act_dtype, doc), weight.N, weight.K,
            spec.act_dtype, spec.output_dtype, lut4_matmul, lut4_dequant,
        )  # fmt: skip

    def strategy(self, state: Lut4State, m: int) -> str:
        if self.use_dense(state, m):
            return f"dequant+cuBLAS (N slices of {state.slice_rows})"
        c = self._config(state, m)
        kind = "gemv" if c.block_m == 1 else "tile"
        return f"{kind} BM{c.block_m} BN{c.block_n} BK{c.block_k} S{c.split_k}"

    def use_dense(self, state: Lut4State, m: int) -> bool:
        return m >= state.dense_from

    @staticmethod
    def _config(state: Lut4State, m: int) -> Any:
        c = tile_table.pick(state.configs, m)
        return state.configs[1] if c.block_m == 1 and m != 1 else c  # the GEMV serves one row

    def dequant_rows(self, state: Lut4State, n0: int, n1: int) -> torch.Tensor:
        return state.dequant(
            state.codes, state.scales, state.group, state.scale_kind, state.table, state.row_scale, state.act,
            n0, n1,
        )  # fmt: skip

    def small(
        self, state: Lut4State, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        c = self._config(state, x.shape[0])
        if torch.compiler.is_compiling():  # traced: the registered op with its fake
            y = torch.ops.quantrt.lut4_mm(
                x, state.codes, state.scales, state.group, state.scale_kind, state.table, state.row_scale,
                bias, c.block_m, c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages,
            )  # fmt: skip
            return y if out is None else out.copy_(y)
        return state.matmul(
            x,
            state.codes,
            state.scales,
            state.group,
            state.scale_kind,
            state.table,
            state.row_scale,
            bias,
            c,
            out,
        )


class CudaTritonFp4(CudaTritonLut4):
    name = "cuda.triton_fp4"
    description = (
        "NVFP4/MXFP4 weight-only: e2m1 codes and e4m3/e8m0 scales decoded in registers (Triton GEMV and "
        "tiles); dequant + cuBLAS for large M"
    )

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        return spec.scheme.act is not None

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *_conditions(spec, caps),
            (s.family in ("nvfp4", "mxfp4"), "NVFP4 or MXFP4 weights", {"weight": s.weight}),
        )


class CudaTritonBnb4(CudaTritonLut4):
    name = "cuda.triton_bnb4"
    description = (
        "bitsandbytes NF4/FP4 weight-only: code-book lookup in registers (Triton GEMV and tiles), double "
        "quant resolved at load; dequant + cuBLAS for large M"
    )

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *_conditions(spec, caps),
            (s.family == "bnb4", "bitsandbytes NF4/FP4 weights", {"weight": s.weight}),
            (
                s.group_size is not None and spec.K_part % s.group_size == 0,
                "K a multiple of the blocksize (no block spans two rows)",
                {"K": spec.K_part, "blocksize": s.group_size},
            ),
        )
