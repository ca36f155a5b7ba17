"""Kernels built on torch's own quantized ops, shared by the vendor folders.

These are portable implementations a vendor folder subclasses with its policy (name,
device kinds, fp8 flavour, priority, requirements), the same way vendor folders
parameterise the Triton kernels: the arithmetic lives once, the choice lives per vendor.
Activation quantization here matches :mod:`quantrt.reference.activations` code for code.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .canonical import CanonicalWeight, act_order_perm, int_codes
from .kernels import Kernel, Verdict, check
from .specs import LayerSpec

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0, torch.float8_e5m2: 57344.0}
#: activation scales follow the scheme's OCP e4m3 range whatever flavour a device computes in
SCHEME_FP8_MAX = 448.0


def dynamic_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """amax / qmax, with 1 where amax is 0 (an all-zero row quantizes to zeros either way)."""
    s = amax.float() / qmax
    return torch.where(s == 0, torch.ones_like(s), s)


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: returns codes [M, K] and fp32 scales [M, 1]."""
    x32 = x.float()
    s = dynamic_scale(x32.abs().amax(dim=1, keepdim=True), 127.0)
    return torch.round(x32 / s).clamp_(-128, 127).to(torch.int8), s


def quantize_int8_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(x.float() / scale).clamp_(-128, 127).to(torch.int8)


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """Saturating cast of x / scale to an fp8 type."""
    fmax = FP8_MAX[dtype]
    return (x.float() / scale).clamp_(-fmax, fmax).to(dtype)


def per_channel_scales(weight: CanonicalWeight) -> torch.Tensor:
    """Tensor (per slice) or channel weight scales as one fp32 value per output row [N]."""
    s = weight["scales"].float()
    if weight.scheme.granularity == "tensor":
        return s[weight.slice_index().to(s.device)]
    return s.reshape(-1)


def finish(
    y: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """The shared epilogue of torch-op kernels: add the bias, honour ``out=``, cast to the output dtype."""
    if bias is not None:
        y = y + bias
    if out is not None:
        return out.copy_(y)
    return y if y.dtype == out_dtype else y.to(out_dtype)


class TorchOpKernel(Kernel):
    """A kernel around one torch op: supported when the vendor's hardware rule, the scheme and the
    op's availability on this device all hold. Vendor folders override ``device_verdict`` only."""

    op: ClassVar[str] = ""

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return cls.device_verdict(spec, caps) and cls.scheme_verdict(spec) and torch_op_verdict(caps, cls.op)

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        """The vendor's hardware requirement (matrix units, architecture)."""
        return Verdict.yes()

    @classmethod
    def scheme_verdict(cls, spec: LayerSpec) -> Verdict:
        """Which schemes and shapes the op takes."""
        return Verdict.yes()


@dataclass
class ScaledMMState:
    wt: torch.Tensor  # [K, N] column-major view of the fp8 weight, as _scaled_mm wants it
    w_scale: torch.Tensor  # [1, N] or scalar fp32
    in_scale: torch.Tensor | None  # static activation scale (fp32 scalar), in this fp8 flavour
    rowwise: bool
    out_dtype: torch.dtype


class TorchScaledMMFp8(TorchOpKernel):
    """W8A8 fp8 through ``torch._scaled_mm`` (cuBLASLt / hipBLASLt): activations quantized per
    token (dynamic) or per tensor (static/dynamic) in torch ops, weights per tensor or channel.

    Subclasses set ``fp8_dtype``; a flavour other than the checkpoint's e4m3fn (MI300's
    e4m3fnuz) is converted once in ``prepare``: same bits mean half the value, so the scale
    doubles, and the fnuz NaN pattern 0x80 (e4m3fn's -0) becomes +0.
    """

    fp8_dtype: ClassVar[torch.dtype] = torch.float8_e4m3fn
    op = "_scaled_mm"

    @classmethod
    def scheme_verdict(cls, spec: LayerSpec) -> Verdict:
        s = spec.scheme
        return check(
            (s.weight == "fp8_e4m3", "scheme.weight == 'fp8_e4m3'", {"weight": s.weight}),
            (s.act == "fp8_e4m3", "scheme.act == 'fp8_e4m3'", {"act": s.act}),
            (
                s.granularity in ("tensor", "channel"),
                "weight scales per tensor or channel",
                {"granularity": s.granularity},
            ),
            (
                s.act_granularity in ("token", "tensor"),
                "activations per token or per tensor",
                {"act_granularity": s.act_granularity},
            ),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (spec.K_part % 16 == 0, "K % 16 == 0", {"K": spec.K_part}),
            (spec.N_part % 16 == 0, "N % 16 == 0", {"N": spec.N_part}),
            (
                spec.act_dtype in (torch.bfloat16, torch.float16),
                "activations bf16 or fp16",
                {"act_dtype": spec.act_dtype},
            ),
            (
                not cls.rowwise(spec) or spec.output_dtype == torch.bfloat16,
                "bf16 output for row-wise scales",
                {"out_dtype": spec.output_dtype},
            ),
        )

    @staticmethod
    def rowwise(spec: LayerSpec) -> bool:
        s = spec.scheme
        per_tensor_w = s.granularity == "tensor" and len(spec.output_sizes) == 1
        return not (per_tensor_w and s.act_granularity == "tensor")

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> ScaledMMState:
        q = weight["qweight"]
        w_scale = per_channel_scales(weight)
        in_scale = weight.get("input_scale")
        in_scale = None if in_scale is None else in_scale.float().reshape(())
        if self.fp8_dtype == torch.float8_e4m3fnuz:
            bits = q.view(torch.int8).clone()
            bits[bits == -128] = 0
            q = bits.view(torch.float8_e4m3fnuz)
            w_scale = w_scale * 2.0
            in_scale = None if in_scale is None else in_scale * 2.0
        rowwise = self.rowwise(spec)
        w_s = w_scale.reshape(1, -1).contiguous() if rowwise else w_scale.reshape(-1)[0].clone()
        return ScaledMMState(q.t(), w_s, in_scale, rowwise, spec.output_dtype)

    def apply(
        self,
        state: ScaledMMState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Scales come from the scheme's e4m3 range (448); an fnuz flavour holds the same grid at
        # half the value, so its scale is doubled and the codes equal the reference's.
        mult = 2.0 if self.fp8_dtype == torch.float8_e4m3fnuz else 1.0
        if state.in_scale is not None:
            s = state.in_scale
            xq = quantize_fp8(x, self.fp8_dtype, s)
            a_scale = s.reshape(1, 1).repeat(x.shape[0], 1) if state.rowwise else s
        elif state.rowwise:
            a_scale = dynamic_scale(x.abs().amax(dim=1, keepdim=True), SCHEME_FP8_MAX) * mult
            xq = quantize_fp8(x, self.fp8_dtype, a_scale)
        else:
            a_scale = dynamic_scale(x.abs().amax(), SCHEME_FP8_MAX) * mult
            xq = quantize_fp8(x, self.fp8_dtype, a_scale)
        y = torch._scaled_mm(xq, state.wt, a_scale, state.w_scale, out_dtype=state.out_dtype)
        return finish(y, bias, out, state.out_dtype)


@dataclass
class IntMMState:
    wt: torch.Tensor  # [K, N] int8
    w_scale: torch.Tensor  # [1, N] fp32
    in_scale: torch.Tensor | None
    out_dtype: torch.dtype


class TorchIntMMW8A8(TorchOpKernel):
    """W8A8 int8 through ``torch._int_mm`` with the scales applied in a torch epilogue.

    ``min_m``: the op's smallest batch on this device (cuBLASLt wants M > 16); smaller
    batches are zero-padded, which the declared workspace covers.
    """

    min_m: ClassVar[int] = 1
    op = "_int_mm"
    act_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)

    @classmethod
    def scheme_verdict(cls, spec: LayerSpec) -> Verdict:
        s = spec.scheme
        return check(
            (
                s.weight == "int" and s.bits == 8 and s.symmetric,
                "symmetric int8 weights",
                {"weight": s.weight, "bits": s.bits, "symmetric": s.symmetric},
            ),
            (s.act == "int8", "scheme.act == 'int8'", {"act": s.act}),
            (
                s.granularity in ("tensor", "channel"),
                "weight scales per tensor or channel",
                {"granularity": s.granularity},
            ),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (spec.K_part % 8 == 0, "K % 8 == 0", {"K": spec.K_part}),
            (spec.N_part % 8 == 0, "N % 8 == 0", {"N": spec.N_part}),
            (
                spec.act_dtype in cls.act_dtypes,
                "activations " + ", ".join(str(d).replace("torch.", "") for d in cls.act_dtypes),
                {"act_dtype": spec.act_dtype},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> IntMMState:
        q = (weight["qweight"].to(torch.int16) - 128).to(torch.int8)
        in_scale = weight.get("input_scale")
        return IntMMState(
            q.t(),
            per_channel_scales(weight).reshape(1, -1).contiguous(),
            None if in_scale is None else in_scale.float().reshape(()),
            spec.output_dtype,
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        m = max(max_m, self.min_m)
        return m * spec.K_part + 4 * m * (spec.N_part + 2)

    def apply(
        self,
        state: IntMMState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if state.in_scale is None:
            xq, a_scale = quantize_int8_per_token(x)
        else:
            xq, a_scale = quantize_int8_static(x, state.in_scale), state.in_scale
        m = xq.shape[0]
        if m < self.min_m:
            xq = torch.nn.functional.pad(xq, (0, 0, 0, self.min_m - m))
        acc = torch._int_mm(xq, state.wt)[:m]
        return finish(acc.float().mul_(a_scale).mul_(state.w_scale), bias, out, state.out_dtype)


INT4PACK_GROUPS = (32, 64, 128, 256)


@dataclass
class Int4PackState:
    packed: torch.Tensor
    group: int
    scales_zeros: torch.Tensor  # [K/G, N, 2]: scale and float zero, w = (q - 8) * scale + zero
    perm: torch.Tensor | None  # act-order: the input-channel order the packed weight uses
    out_dtype: torch.dtype


class TorchInt4Pack(Kernel):
    """W4A16 through torch's tinygemm-form int4 ops (``_weight_int4pack_mm*``).

    torch dequantizes ``(q - 8) * scale + zero`` with a float zero, so an integer zero-point z
    becomes ``(8 - z) * scale`` at load. Act-order is served by permuting the weight's input
    channels once at load and the activations per call. Subclasses set ``mm_op``, the
    scale/zero dtype and ``pack`` (CPU and CUDA take differently packed codes).
    """

    mm_op: ClassVar[str] = ""

    @classmethod
    def scheme_verdict(cls, spec: LayerSpec) -> Verdict:
        s = spec.scheme
        G = s.group_size if s.granularity == "group" else spec.K_part
        return check(
            (
                s.weight == "int" and s.bits == 4,
                "4-bit integer weights",
                {"weight": s.weight, "bits": s.bits},
            ),
            (s.weight_only, "weight-only scheme", {"act": s.act}),
            (
                s.granularity in ("group", "channel"),
                "group or channel scales",
                {"granularity": s.granularity},
            ),
            (G in INT4PACK_GROUPS, "group size in (32, 64, 128, 256)", {"G": G}),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (
                not s.act_order or spec.k_full,
                "act-order with the full K on this rank",
                {"K_part": spec.K_part, "K": spec.K},
            ),
        )

    @abstractmethod
    def pack(self, codes: torch.Tensor, K: int) -> torch.Tensor:
        """Codes int32 [N, K] (0..15) into the op's packed layout."""

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Int4PackState:
        s = weight.scheme
        G = s.group_size if s.granularity == "group" else weight.K
        codes = int_codes(weight)
        perm = act_order_perm(weight, G)
        if perm is not None:
            codes = codes[:, perm]
        scales = weight["scales"].float()
        zeros = weight["zeros"].float() if not s.symmetric else torch.full_like(scales, 8.0)
        sz = torch.stack([scales, (8.0 - zeros) * scales], dim=-1).transpose(0, 1).contiguous()
        return Int4PackState(
            self.pack(codes.contiguous(), weight.K), G, sz.to(spec.act_dtype), perm, spec.output_dtype
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return max_m * spec.K_part * spec.act_dtype.itemsize if spec.scheme.act_order else 0

    def apply(
        self,
        state: Int4PackState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if state.perm is not None:
            x = x.index_select(1, state.perm)
        y = getattr(torch.ops.aten, self.mm_op)(x.contiguous(), state.packed, state.group, state.scales_zeros)
        return finish(y, bias, out, state.out_dtype)


def torch_op_verdict(caps: Any, op: str) -> Verdict:
    """Whether this device's torch build has a kernel for ``aten::op``."""
    return check(
        (op in caps.torch_ops, f"torch op {op} has a kernel for this device", {"op": op, "available": False})
    )
