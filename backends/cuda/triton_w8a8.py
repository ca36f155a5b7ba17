"""FP8 and INT8 on NVIDIA GPUs through the portable Triton kernels, with NVIDIA's choices.

- ``cuda.triton_fp8``: W8A8 fp8 with tensor or channel weight scales. Activations are quantized
  by one fused Triton pass (per token, per tensor, or with the static scale); small batches then
  run the Triton fp8 GEMV/split-K kernel, because cuBLASLt's row-wise ``_scaled_mm`` streams the
  weights slowly there, and large batches run ``torch._scaled_mm`` (cuBLASLt) on the same codes.
- ``cuda.triton_block_fp8``: DeepSeek-V3 style block fp8 (128x128 weight blocks, 1x128
  activation groups), which ``_scaled_mm`` rejects: group quantization and a Triton GEMM that
  applies both scales per k-block.
- ``cuda.triton_fp8_w8a16``: fp8 weights with 16-bit activations, decoded by integer bit tricks
  so it runs without fp8 matrix units (sm_80/86). Below sm_89 it also serves W8A8 fp8
  checkpoints, as a weight-only substitute (labelled so: activations stay 16-bit).
- ``cuda.triton_int8``: W8A8 int8 with per-token (or static) activations and the scales applied
  in the GEMM's epilogue instead of extra passes over an int32 product.

Tile configurations per M bucket come from ``tunings/w8a8_<arch>.json`` (``w8a8_default.json``
otherwise, see ``tile_table``); ``prepare`` fixes them, nothing tunes at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec
from quantrt.torchops import per_channel_scales

from .tile_table import arch_of, describe, load, pick, tile_configs

Condition = tuple[bool, str, dict[str, Any]]


def run(
    op: str, forward: Any, args: tuple, tile: Any, out_dtype: torch.dtype, out: torch.Tensor | None
) -> torch.Tensor:
    """Eager calls and CUDA-graph capture: the forward bound at load (no op layer, no import).
    Traced by torch.compile: the registered op ``quantrt::<op>`` (w8a8_ops) with its fake."""
    if torch.compiler.is_compiling():
        ints = [tile.block_m, tile.block_n, tile.block_k, tile.split_k, tile.num_warps, tile.num_stages]
        y = getattr(torch.ops.quantrt, op)(*args, ints, out_dtype)
        return y if out is None else out.copy_(y)
    return forward(*args, tile, out_dtype, out)


def _common(spec: LayerSpec, caps: Any, act_dtypes: tuple[torch.dtype, ...]) -> list[Condition]:
    return [
        ((caps.sm or 0) >= 80, "sm >= 80", {"sm": caps.sm}),
        (
            "triton" in caps.libraries,
            "triton importable (it builds the kernel)",
            {"libraries": caps.libraries},
        ),
        (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
        (
            spec.act_dtype in act_dtypes,
            "activations " + " or ".join(str(d).replace("torch.", "") for d in act_dtypes),
            {"act_dtype": spec.act_dtype},
        ),
    ]


def _fp8_units(caps: Any) -> Condition:
    return (
        (caps.sm or 0) >= 89 and "fp8_e4m3" in caps.matrix_types,
        "fp8 matrix units (sm >= 89)",
        {"sm": caps.sm, "arch": caps.arch},
    )


def _static_scale(weight: CanonicalWeight) -> torch.Tensor | None:
    """The static activation scale as one fp32 value (the max over fused slices, as the reference)."""
    s = weight.get("input_scale")
    return None if s is None else s.float().amax().reshape(())


# -- fp8 W8A8, tensor or channel weight scales ------------------------------------------------


@dataclass
class Fp8State:
    w: torch.Tensor  # fp8 [N, K] as stored
    w_scale: torch.Tensor  # fp32 [N]
    in_scale: torch.Tensor | None
    act_granularity: str
    tensorwise: bool  # one weight scale and one activation scale: _scaled_mm's per-tensor mode
    configs: tuple
    scaled_mm_from: int  # batches of at least this many rows run torch._scaled_mm
    out_dtype: torch.dtype
    forward: Any  # w8a8_ops.fp8_forward, bound at load so apply() imports nothing (triton is optional)


class CudaTritonFp8(Kernel):
    """W8A8 fp8 (tensor/channel weights): fused activation quantization, Triton for small M,
    cuBLASLt ``_scaled_mm`` for large M."""

    name = "cuda.triton_fp8"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 45
    description = (
        "fp8 W8A8: fused Triton activation quantization; Triton GEMV/split-K for small M, _scaled_mm above"
    )

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *_common(spec, caps, (torch.bfloat16, torch.float16)),
            _fp8_units(caps),
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

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Fp8State:
        from quantrt.backends.triton.common import TileConfig

        from . import w8a8_ops  # registers the custom ops too

        q = weight["qweight"].contiguous()
        w_scale = per_channel_scales(weight).contiguous()
        table = load("w8a8", arch_of(q))["fp8_rowwise"]
        configs = tile_configs(table, weight.N, weight.K, TileConfig)
        # _scaled_mm needs K and N multiples of 16 and, with row-wise scales, a bf16 output
        s = weight.scheme
        tensorwise = (
            s.granularity == "tensor" and len(spec.output_sizes) == 1 and s.act_granularity == "tensor"
        )
        ok = weight.K % 16 == 0 and weight.N % 16 == 0 and (tensorwise or spec.output_dtype == torch.bfloat16)
        start = int(table.get("scaled_mm_from_m", 1 << 30)) if ok else 1 << 62
        gran = "static" if not s.act_dynamic else s.act_granularity
        forward = w8a8_ops.fp8_forward
        return Fp8State(
            q, w_scale, _static_scale(weight), gran, tensorwise, configs, start, spec.output_dtype, forward
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return max_m * spec.K_part + 4 * max_m * (spec.N_part + 1)  # codes, scales, split-K sums

    def strategy(self, state: Fp8State, m: int) -> str:
        if m >= state.scaled_mm_from:
            return "triton quant + _scaled_mm"
        return "triton quant + " + describe(pick(state.configs, m))

    def apply(
        self,
        state: Fp8State,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        fields = (state.in_scale, bias, state.act_granularity, state.tensorwise, state.scaled_mm_from)
        c = pick(state.configs, x.shape[0])
        return run("fp8_linear", state.forward, (x, state.w, state.w_scale, *fields), c, state.out_dtype, out)


# -- block fp8 --------------------------------------------------------------------------------


@dataclass
class BlockFp8State:
    w: torch.Tensor  # fp8 [N, K]
    w_scale: torch.Tensor  # fp32 [ceil(N/bn), ceil(K/bk)]
    block: tuple[int, int]
    configs: tuple
    out_dtype: torch.dtype
    forward: Any  # w8a8_ops.block_fp8_forward


class CudaTritonBlockFp8(Kernel):
    """Block fp8 W8A8 (128x128 weight blocks, 1x128 activation groups) as a Triton GEMM."""

    name = "cuda.triton_block_fp8"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 45
    description = "block fp8 W8A8: per-token-group fp8 activations (Triton), Triton GEMM scaling per k-block"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        block = s.block or (16, 1 << 30)  # not a block scheme: the granularity condition says so first
        return check(
            *_common(spec, caps, (torch.bfloat16, torch.float16)),
            _fp8_units(caps),
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

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> BlockFp8State:
        from quantrt.backends.triton.common import TileConfig

        from . import w8a8_ops  # registers the custom ops too

        bn, bk = weight.scheme.block
        q = weight["qweight"].contiguous()
        section = load("w8a8", arch_of(q))["fp8_block"]
        configs = tile_configs(section, weight.N, weight.K, TileConfig, block=(bn, bk))  # tiles inside blocks
        scales = weight["scales"].float().contiguous()
        return BlockFp8State(q, scales, (bn, bk), configs, spec.output_dtype, w8a8_ops.block_fp8_forward)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        bk = spec.scheme.block[1] if spec.scheme.block else 128
        return max_m * spec.K_part + 4 * max_m * (-(-spec.K_part // bk) + spec.N_part)

    def strategy(self, state: BlockFp8State, m: int) -> str:
        return "triton group quant + " + describe(pick(state.configs, m))

    def apply(
        self,
        state: BlockFp8State,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        args = (x, state.w, state.w_scale, bias, state.block)
        return run(
            "block_fp8_linear", state.forward, args, pick(state.configs, x.shape[0]), state.out_dtype, out
        )


# -- fp8 weight-only --------------------------------------------------------------------------


@dataclass
class Fp8WeightOnlyState:
    w: torch.Tensor  # fp8 [N, K]
    w_scale: torch.Tensor  # fp32 [N], or [ceil(N/bn), ceil(K/bk)] with block
    block: tuple[int, ...]  # (bn, bk) of block scales, () for tensor/channel scales
    configs: tuple
    act: torch.dtype
    out_dtype: torch.dtype
    forward: Any  # w8a8_ops.fp8_weight_only_forward


class CudaTritonFp8WeightOnly(Kernel):
    """fp8 weights with 16-bit activations, decoded by bit tricks (no fp8 hardware needed)."""

    name = "cuda.triton_fp8_w8a16"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 46
    description = (
        "fp8 weight-only: codes decoded to fp16/bf16 by integer bit tricks (runs on sm_80), Triton GEMM"
    )

    @classmethod
    def is_substitute(cls, spec: LayerSpec) -> bool:
        return spec.scheme.act is not None

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        fp8_hw = (caps.sm or 0) >= 89 and "fp8_e4m3" in caps.matrix_types
        return check(
            *_common(spec, caps, (torch.bfloat16, torch.float16)),
            (s.family == "fp8", "fp8 weights", {"weight": s.weight}),
            (
                s.act is None or not fp8_hw,
                "a weight-only scheme (fp8 matrix units run W8A8 natively)",
                {"act": s.act, "sm": caps.sm},
            ),
            (
                s.granularity != "block" or spec.K_part % s.block[1] == 0 or spec.k_full,
                "this rank's K cut on block boundaries",
                {"K_part": spec.K_part, "block": s.block},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Fp8WeightOnlyState:
        from quantrt.backends.triton.common import TileConfig

        from . import w8a8_ops  # registers the custom ops too

        s = weight.scheme
        q = weight["qweight"].contiguous()
        section = load("w8a8", arch_of(q))["fp8_weight_only"]
        if s.granularity == "block":  # k tiles inside scale blocks (scales are read per column)
            block, scale = tuple(s.block), weight["scales"].float().contiguous()
        else:
            block, scale = (), per_channel_scales(weight).contiguous()
        configs = tile_configs(
            section, weight.N, weight.K, TileConfig, block=(None, block[1] if block else None)
        )
        forward = w8a8_ops.fp8_weight_only_forward
        return Fp8WeightOnlyState(q, scale, block, configs, spec.act_dtype, spec.output_dtype, forward)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return 4 * max_m * spec.N_part

    def strategy(self, state: Fp8WeightOnlyState, m: int) -> str:
        return describe(pick(state.configs, m))

    def apply(
        self,
        state: Fp8WeightOnlyState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        args = (x, state.w, state.w_scale, bias, state.block, state.act)
        return run(
            "fp8_w8a16_linear", state.forward, args, pick(state.configs, x.shape[0]), state.out_dtype, out
        )


# -- int8 W8A8 --------------------------------------------------------------------------------


@dataclass
class Int8State:
    w: torch.Tensor  # int8 [N, K]
    w_scale: torch.Tensor  # fp32 [N]
    in_scale: torch.Tensor | None
    configs: tuple
    out_dtype: torch.dtype
    forward: Any  # w8a8_ops.int8_forward


class CudaTritonInt8(Kernel):
    """W8A8 int8: per-token (or static) int8 activations from one Triton pass, a Triton int8 GEMM
    with both scales and the bias in its epilogue."""

    name = "cuda.triton_int8"
    backend = "cuda"
    device_kinds = ("cuda",)
    priority = (
        45  # ahead of torch._int_mm: 1.37-1.39x the bare op at M=4096 on the H200 (docs/performance.md)
    )
    description = (
        "int8 W8A8: fused Triton activation quantization, Triton int8 GEMM with scales in the epilogue"
    )

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return check(
            *_common(spec, caps, (torch.bfloat16, torch.float16, torch.float32)),
            ("int8" in caps.matrix_types, "int8 matrix units", {"arch": caps.arch}),
            (
                s.weight == "int" and s.bits == 8 and s.symmetric,
                "symmetric int8 weights",
                {"weight": s.weight, "bits": s.bits, "symmetric": s.symmetric},
            ),
            (s.act == "int8", "int8 activations", {"act": s.act}),
            (
                s.granularity in ("tensor", "channel"),
                "tensor or channel scales",
                {"granularity": s.granularity},
            ),
            (
                s.act_granularity == "token" or not s.act_dynamic,
                "activations per token or with a static scale",
                {"act_granularity": s.act_granularity, "act_dynamic": s.act_dynamic},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Int8State:
        from quantrt.backends.triton.common import TileConfig

        from . import w8a8_ops  # registers the custom ops too

        q = (weight["qweight"].to(torch.int16) - 128).to(torch.int8).contiguous()  # canonical offset 128
        section = load("w8a8", arch_of(q))["int8"]
        return Int8State(
            q,
            per_channel_scales(weight).contiguous(),
            _static_scale(weight),
            tile_configs(section, weight.N, weight.K, TileConfig),
            spec.output_dtype,
            w8a8_ops.int8_forward,
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return max_m * spec.K_part + 4 * max_m * (spec.N_part + 1)

    def strategy(self, state: Int8State, m: int) -> str:
        return "triton quant + " + describe(pick(state.configs, m))

    def apply(
        self,
        state: Int8State,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        args = (x, state.w, state.w_scale, state.in_scale, bias)
        return run("int8_linear", state.forward, args, pick(state.configs, x.shape[0]), state.out_dtype, out)
