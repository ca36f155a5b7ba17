"""Kernels built on torch's own quantized ops, shared by the vendor folders.

Each class here is a portable family: it prepares the layout and names the strategies; a vendor
folder declares one kernel of it (name, the torch op, the fp8 flavour, the hardware verdict), so
the arithmetic lives once and the choice lives per vendor. Activation quantization here matches
:mod:`quantrt.reference.activations` code for code.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .canonical import CanonicalWeight, act_order_perm, int_codes
from .kernels import Kernel, Verdict, check
from .prepared import ALL_M, Prepared, Strategy
from .specs import LayerSpec

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0, torch.float8_e5m2: 57344.0}
#: activation scales follow the scheme's OCP e4m3 range whatever flavour a device computes in
SCHEME_FP8_MAX = 448.0


def fp8_as_fnuz(q: torch.Tensor) -> torch.Tensor:
    """OCP e4m3 codes as e4m3fnuz (MI300's flavour) of half the value: the same bits (the exponent
    bias is 8, not 7), so a scale doubles to keep the values. e4m3's -0 (0x80) is fnuz's NaN,
    hence +0; e4m3's NaNs (0x7f, 0xff) become fnuz's NaN. Equal, code for code, to torch's own
    conversion of ``q / 2``."""
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_as_fnuz: expected float8_e4m3fn codes, found {q.dtype}")
    bits = q.view(torch.uint8)
    bits = torch.where(bits == 0x80, 0, bits)
    return torch.where((bits & 0x7F) == 0x7F, 0x80, bits).to(torch.uint8).view(torch.float8_e4m3fnuz)


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


def quantize_fp8(
    x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor, fmax: float | None = None
) -> torch.Tensor:
    """Saturating cast of x / scale to an fp8 type, at ``fmax`` (the type's max by default)."""
    fmax = FP8_MAX[dtype] if fmax is None else fmax
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


# -- fp8 W8A8 through torch._scaled_mm ------------------------------------------------------


@dataclass(frozen=True)
class ScaledMMLayout:
    wt: torch.Tensor  # [K, N] column-major view of the fp8 weight, as _scaled_mm wants it
    w_scale: torch.Tensor  # [1, N] or scalar fp32
    in_scale: torch.Tensor | None  # static activation scale (fp32 scalar), in this fp8 flavour
    fp8_dtype: torch.dtype
    mult: float  # the scheme's e4m3 scale times this: 2 for e4m3fnuz (same grid at half the value)
    out_dtype: torch.dtype


def _scaled_mm_static(lay: ScaledMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    s = lay.in_scale
    xq = quantize_fp8(x, lay.fp8_dtype, s, SCHEME_FP8_MAX / lay.mult)  # fnuz: e4m3's 448, halved
    y = torch._scaled_mm(xq, lay.wt, s, lay.w_scale, out_dtype=lay.out_dtype)
    return finish(y, bias, out, lay.out_dtype)


def _scaled_mm_static_rowwise(
    lay: ScaledMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any
) -> torch.Tensor:
    s = lay.in_scale
    xq = quantize_fp8(x, lay.fp8_dtype, s, SCHEME_FP8_MAX / lay.mult)
    a_scale = s.reshape(1, 1).repeat(x.shape[0], 1)
    y = torch._scaled_mm(xq, lay.wt, a_scale, lay.w_scale, out_dtype=lay.out_dtype)
    return finish(y, bias, out, lay.out_dtype)


def _scaled_mm_token(lay: ScaledMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    a_scale = dynamic_scale(x.abs().amax(dim=1, keepdim=True), SCHEME_FP8_MAX) * lay.mult
    xq = quantize_fp8(x, lay.fp8_dtype, a_scale)
    y = torch._scaled_mm(xq, lay.wt, a_scale, lay.w_scale, out_dtype=lay.out_dtype)
    return finish(y, bias, out, lay.out_dtype)


def _scaled_mm_tensor(lay: ScaledMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    a_scale = dynamic_scale(x.abs().amax(), SCHEME_FP8_MAX) * lay.mult
    xq = quantize_fp8(x, lay.fp8_dtype, a_scale)
    y = torch._scaled_mm(xq, lay.wt, a_scale, lay.w_scale, out_dtype=lay.out_dtype)
    return finish(y, bias, out, lay.out_dtype)


class TorchScaledMMFp8(Kernel):
    """W8A8 fp8 through ``torch._scaled_mm`` (cuBLASLt / hipBLASLt): activations quantized per
    token (dynamic) or per tensor (static/dynamic) in torch ops, weights per tensor or channel.

    Vendors declare ``fp8_dtype`` and ``device_verdict``; a flavour other than the checkpoint's
    e4m3fn (MI300's e4m3fnuz) is converted once in ``prepare``: same bits mean half the value, so
    the scale doubles, and the fnuz NaN pattern 0x80 (e4m3fn's -0) becomes +0.
    """

    fp8_dtype: ClassVar[torch.dtype] = torch.float8_e4m3fn
    op: ClassVar[str] = "_scaled_mm"

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return cls.device_verdict(spec, caps) and cls.scheme_verdict(spec) and torch_op_verdict(caps, cls.op)

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        """The vendor's hardware requirement (matrix units, architecture)."""
        return Verdict.yes()

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
            (spec.K_part % 16 == 0, "K % 16 == 0", {"K": spec.K_part}),
            (spec.N_part % 16 == 0, "N % 16 == 0", {"N": spec.N_part}),
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

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        q = weight["qweight"]
        w_scale = per_channel_scales(weight)
        in_scale = weight.get("input_scale")
        in_scale = None if in_scale is None else in_scale.float().reshape(())
        # Scales come from the scheme's e4m3 range (448); an fnuz flavour holds the same grid at
        # half the value, so its scale is doubled and the codes equal the reference's.
        mult = 1.0
        if self.fp8_dtype == torch.float8_e4m3fnuz:
            q = fp8_as_fnuz(q)
            w_scale = w_scale * 2.0
            in_scale = None if in_scale is None else in_scale * 2.0
            mult = 2.0
        rowwise = self.rowwise(spec)
        w_s = w_scale.reshape(1, -1).contiguous() if rowwise else w_scale.reshape(-1)[0].clone()
        layout = ScaledMMLayout(q.t(), w_s, in_scale, self.fp8_dtype, mult, spec.output_dtype)
        mm = f"torch._scaled_mm ({'row-wise' if rowwise else 'per-tensor'} scales)"
        if in_scale is not None:
            fn, what = (_scaled_mm_static_rowwise if rowwise else _scaled_mm_static), "static fp8"
        elif rowwise:
            fn, what = _scaled_mm_token, "per-token fp8"
        else:
            fn, what = _scaled_mm_tensor, "per-tensor fp8"
        return self.prepared(layout, [Strategy(ALL_M, f"{what} + {mm}", fn)], spec, q.device)


# -- int8 W8A8 through torch._int_mm ----------------------------------------------------------


@dataclass(frozen=True)
class IntMMLayout:
    wt: torch.Tensor  # [K, N] int8 (a column-major view)
    w_scale: torch.Tensor  # [1, N] fp32
    in_scale: torch.Tensor | None
    min_m: int  # the op's smallest batch: smaller ones run padded to it in the workspace
    out_dtype: torch.dtype


#: byte alignment of the int8 codes after the int32 product in the padded batch's workspace
_ALIGN = 256


def _padded_codes_at(N: int, min_m: int) -> int:
    """Byte offset of the padded codes in the workspace: after the int32 product [min_m, N]."""
    return -(-4 * min_m * N // _ALIGN) * _ALIGN


def _quantize_int8(lay: IntMMLayout, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if lay.in_scale is None:
        return quantize_int8_per_token(x)
    # a NaN has no int8 code (the cast makes it a finite one): its row's scale becomes NaN instead, so
    # the row comes out NaN as in the reference, which quantizes in floats
    nan_rows = x.isnan().any(dim=1, keepdim=True)
    scale = lay.in_scale.reshape(1, 1).expand(x.shape[0], 1).masked_fill(nan_rows, float("nan"))
    return quantize_int8_static(x, lay.in_scale), scale


def _int_mm(lay: IntMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    xq, a_scale = _quantize_int8(lay, x)
    acc = torch._int_mm(xq, lay.wt)
    return finish(acc.float().mul_(a_scale).mul_(lay.w_scale), bias, out, lay.out_dtype)


def _int_mm_padded(lay: IntMMLayout, x: torch.Tensor, bias: Any, out: Any, ws: torch.Tensor) -> torch.Tensor:
    """A batch below the op's smallest: its codes copied into ``min_m`` rows of the workspace and the
    int32 product written there. Rows are independent, so whatever the rows past M hold (an earlier
    call's codes) only reaches rows of the product that are cut off."""
    m, pad = x.shape[0], lay.min_m
    K, N = lay.wt.shape
    at = _padded_codes_at(N, pad)
    acc = ws[: 4 * pad * N].view(torch.int32).view(pad, N)
    codes = ws[at : at + pad * K].view(torch.int8).view(pad, K)
    xq, a_scale = _quantize_int8(lay, x)
    codes[:m].copy_(xq)
    torch._int_mm(codes, lay.wt, out=acc)
    return finish(acc[:m].float().mul_(a_scale).mul_(lay.w_scale), bias, out, lay.out_dtype)


class TorchIntMMW8A8(Kernel):
    """W8A8 int8 through ``torch._int_mm`` with the scales applied in a torch epilogue.

    ``min_m``: the op's smallest batch on this device (cuBLASLt wants M > 16); smaller batches run
    padded to it in the declared workspace (the codes and the int32 product of ``min_m`` rows), so
    the padding allocates nothing.
    """

    min_m: ClassVar[int] = 1
    op: ClassVar[str] = "_int_mm"
    act_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return cls.device_verdict(spec, caps) and cls.scheme_verdict(spec) and torch_op_verdict(caps, cls.op)

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        """The vendor's hardware requirement (matrix units, architecture)."""
        return Verdict.yes()

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
            (spec.K_part % 8 == 0, "K % 8 == 0", {"K": spec.K_part}),
            (spec.N_part % 8 == 0, "N % 8 == 0", {"N": spec.N_part}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        q = (weight["qweight"].to(torch.int16) - 128).to(torch.int8)
        in_scale = weight.get("input_scale")
        layout = IntMMLayout(
            q.t(),
            per_channel_scales(weight).reshape(1, -1).contiguous(),
            None if in_scale is None else in_scale.float().reshape(()),
            self.min_m,
            spec.output_dtype,
        )
        what = "per-token int8" if in_scale is None else "static int8"
        strategies = [Strategy(ALL_M, f"{what} + torch._int_mm", _int_mm)]
        if self.min_m > 1:
            name = f"{what} + torch._int_mm (padded to {self.min_m} rows)"
            strategies.insert(0, Strategy(self.min_m - 1, name, _int_mm_padded))
        return self.prepared(layout, strategies, spec, q.device)

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        """The padded batch's int32 product and codes; the same for every M (larger batches need none,
        and a size that shrank with M would leave a grown buffer unsized for a later small batch)."""
        if self.min_m <= 1:
            return 0
        return _padded_codes_at(spec.N_part, self.min_m) + self.min_m * spec.K_part


# -- W4A16 through torch's int4 (tinygemm-form) ops -------------------------------------------

INT4PACK_GROUPS = (32, 64, 128, 256)


@dataclass(frozen=True)
class Int4PackLayout:
    packed: torch.Tensor
    group: int
    scales_zeros: torch.Tensor  # [K/G, N, 2]: scale and float zero, w = (q - 8) * scale + zero
    perm: torch.Tensor | None  # act-order: the input-channel order the packed weight uses
    mm: Any  # the torch op, bound at load
    out_dtype: torch.dtype


def _int4pack(lay: Int4PackLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    y = lay.mm(x.contiguous(), lay.packed, lay.group, lay.scales_zeros)
    return finish(y, bias, out, lay.out_dtype)


def _int4pack_act_order(lay: Int4PackLayout, x: torch.Tensor, bias: Any, out: Any, ws: Any) -> torch.Tensor:
    y = lay.mm(x.index_select(1, lay.perm), lay.packed, lay.group, lay.scales_zeros)
    return finish(y, bias, out, lay.out_dtype)


class TorchInt4Pack(Kernel):
    """W4A16 through torch's tinygemm-form int4 ops (``_weight_int4pack_mm*``).

    torch dequantizes ``(q - 8) * scale + zero`` with a float zero, so an integer zero-point z
    becomes ``(8 - z) * scale`` at load. Act-order is served by permuting the weight's input
    channels once at load and the activations per call (a gather into a fresh tensor: a per-layer
    workspace would keep M x K activations alive for every layer). Vendors declare ``mm_op``,
    ``act_dtypes``, the shape multiples ``n_align``/``k_align`` and ``device_verdict``, and
    implement ``pack`` (CPU and CUDA take differently packed codes).
    """

    mm_op: ClassVar[str] = ""
    #: the op's shape rules: N and K multiples of these
    n_align: ClassVar[int] = 1
    k_align: ClassVar[int] = 1

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return (
            cls.device_verdict(spec, caps)
            and cls.scheme_verdict(spec)
            and check(
                (spec.N_part % cls.n_align == 0, f"N % {cls.n_align} == 0", {"N": spec.N_part}),
                (spec.K_part % cls.k_align == 0, f"K % {cls.k_align} == 0", {"K": spec.K_part}),
            )
            and torch_op_verdict(caps, cls.mm_op)
        )

    @classmethod
    def device_verdict(cls, spec: LayerSpec, caps: Any) -> Verdict:
        """The vendor's hardware requirement (matrix units, architecture)."""
        return Verdict.yes()

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
            (
                not s.act_order or spec.k_full,
                "act-order with the full K on this rank",
                {"K_part": spec.K_part, "K": spec.K},
            ),
        )

    @abstractmethod
    def pack(self, codes: torch.Tensor, K: int) -> torch.Tensor:
        """Codes int32 [N, K] (0..15) into the op's packed layout."""

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        s = weight.scheme
        G = s.group_size if s.granularity == "group" else weight.K
        codes = int_codes(weight)
        perm = act_order_perm(weight, G)
        if perm is not None:
            codes = codes[:, perm]
        scales = weight["scales"].float()
        zeros = weight["zeros"].float() if not s.symmetric else torch.full_like(scales, 8.0)
        sz = torch.stack([scales, (8.0 - zeros) * scales], dim=-1).transpose(0, 1).contiguous()
        packed = self.pack(codes.contiguous(), weight.K)
        mm = getattr(torch.ops.aten, self.mm_op)
        layout = Int4PackLayout(packed, G, sz.to(spec.act_dtype), perm, mm, spec.output_dtype)
        if perm is None:
            strategy = Strategy(ALL_M, f"torch.{self.mm_op}", _int4pack)
        else:
            strategy = Strategy(ALL_M, f"act-order gather + torch.{self.mm_op}", _int4pack_act_order)
        return self.prepared(layout, [strategy], spec, packed.device)


def torch_op_verdict(caps: Any, op: str) -> Verdict:
    """Whether this device's torch build has a kernel for ``aten::op``."""
    return check(
        (op in caps.torch_ops, f"torch op {op} has a kernel for this device", {"op": op, "available": False})
    )
