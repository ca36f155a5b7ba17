"""Canonical tensors: one documented layout per scheme family.

Format adapters convert what a checkpoint stores into these; kernels ``prepare`` from them;
the references dequantize them. ``N`` = out_features, ``K`` = in_features, ``S`` = number of
output slices of a fused layer (1 when not fused). Float scales are always stored as fp32
whose values are exactly representable in the scheme's ``scale_dtype`` (the quantizers round).

int (weight ``int``, bits b in 2, 3, 4, 8)
    qweight  uint8 [N, ceil(K*b/8)]  unsigned codes 0..2^b-1 along K, each row a little-endian
             bit stream: code k sits at bits [b*k, b*k+b) of the row (4-bit: low nibble = even k)
    scales   fp32  tensor: [S] | channel: [N, 1] | group: [N, K/G]
    zeros    int16 like scales, asymmetric only; may hold 2^b (GPTQ v1's zero 0 after its +1)
             symmetric weights use the implicit zero 2^(b-1)
    g_idx    int32 [K], act-order only: the scale/zero column of each input channel
    input_scale fp32 [1], static activations only (loaded per slice of a fused layer, then
             reduced to their max, as vLLM does: the slices share one activation)
    w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)],  g(k) = g_idx[k] or k // G

fp8 (weight ``fp8_e4m3`` / ``fp8_e5m2``)
    qweight  float8_e4m3fn | float8_e5m2 [N, K]
    scales   fp32 tensor: [S] | channel: [N, 1] | block (bn, bk): [ceil(N/bn), ceil(K/bk)]
    input_scale fp32 [1], static activations only
    w[n, k] = float(q[n, k]) * s[...]

nvfp4
    qweight  uint8 [N, K/2]  e2m1 codes, low nibble = even k
    scales   float8_e4m3fn [N, K/16]
    global_scale fp32 [S]  a multiplier (ModelOpt's weight_scale_2; compressed-tensors stores 1/x)
    input_global_scale fp32 [1], W4A4 only: multiplier of the activations' block scales
    w[n, k] = e2m1(q[n, k]) * float(scales[n, k // 16]) * global_scale[slice(n)]

mxfp4
    qweight  uint8 [N, K/2]  e2m1 codes, low nibble = even k
    scales   uint8 [N, K/32] e8m0 exponents: 2^(E - 127); E = 255 is NaN
    w[n, k] = e2m1(q[n, k]) * 2^(scales[n, k // 32] - 127)

bnb4 (weight ``nf4`` / ``fp4_bnb``; blocks of G over the row-major flattened weight)
    qweight  uint8 [ceil(N*K/2)]  high nibble = even element
    code     fp32 [16]  the code book (NF4 or bitsandbytes' FP4 table)
    absmax   fp32 [ceil(N*K/G)], or uint8 codes of the same length with double quant:
    nested_absmax fp32 [ceil(len(absmax)/256)], nested_code fp32 [256], offset fp32 [S]
             absmax = nested_code[codes] * nested_absmax[i // 256] + offset[slice of block i]
             (each slice of a fused layer keeps its own quant state's offset)
    w.flat[e] = code[nibble(e)] * absmax[e // G]

gguf (weight ``gguf``, type t with block of B elements in T bytes)
    qweight  uint8 [N, K/B*T]  llama.cpp's native blocks, each row an independent run along K
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from .packing import pack_codes, unpack_codes
from .schemes import GGUF_TYPES, Scheme
from .specs import TensorSpec

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class CanonicalWeight:
    """A quantized weight in canonical tensors, with the facts needed to read them."""

    scheme: Scheme
    N: int
    K: int
    tensors: dict[str, torch.Tensor]
    output_sizes: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.output_sizes:
            self.output_sizes = (self.N,)
        if sum(self.output_sizes) != self.N:
            raise ValueError(f"output_sizes {self.output_sizes} do not add up to N={self.N}")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(name)

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def to(self, device: torch.device | str) -> CanonicalWeight:
        return CanonicalWeight(
            self.scheme, self.N, self.K, {k: v.to(device) for k, v in self.tensors.items()}, self.output_sizes
        )

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def slice_index(self) -> torch.Tensor:
        """For each output row, the index of the fused slice it belongs to ([N] int64)."""
        sizes = torch.tensor(self.output_sizes)
        return torch.repeat_interleave(torch.arange(len(self.output_sizes)), sizes)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def g_idx_spec(K: int) -> TensorSpec:
    """The act-order group index: one int32 per input channel (GPTQ stores it without act-order too)."""
    return TensorSpec("g_idx", (K,), torch.int32, input_dim=0)


def canonical_specs(scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
    """The TensorSpecs of a scheme's canonical tensors for a full [N, K] layer."""
    fam = scheme.family
    S = num_slices
    specs: dict[str, TensorSpec] = {}

    def add(spec: TensorSpec) -> None:
        specs[spec.name] = spec

    def scale_like(name: str, dtype: torch.dtype, *, replicate_rows: bool = False) -> None:
        if scheme.granularity == "tensor":
            add(TensorSpec(name, (S,), dtype, per_slice=True))
        elif scheme.granularity == "channel":
            add(TensorSpec(name, (N, 1), dtype, output_dim=0, row="replicate"))
        elif scheme.granularity == "group":
            G = scheme.group_size
            assert G is not None
            add(
                TensorSpec(
                    name,
                    (N, _ceil(K, G)),
                    dtype,
                    output_dim=0,
                    input_dim=1,
                    input_unit=Fraction(G),
                    input_align=G,
                    row="replicate" if replicate_rows else "split",
                )
            )
        else:
            bn, bk = scheme.block  # type: ignore[misc]
            add(
                TensorSpec(
                    name,
                    (_ceil(N, bn), _ceil(K, bk)),
                    dtype,
                    output_dim=0,
                    input_dim=1,
                    output_unit=Fraction(bn),
                    input_unit=Fraction(bk),
                    output_align=bn,
                    input_align=bk,
                    ceil_end=True,
                )
            )

    if fam == "int":
        b = scheme.bits
        add(
            TensorSpec(
                "qweight",
                (N, _ceil(K * b, 8)),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(8, b),
                input_align=8 // math.gcd(8, b),
            )
        )
        scale_like("scales", torch.float32, replicate_rows=scheme.act_order)
        if not scheme.symmetric:
            scale_like("zeros", torch.int16, replicate_rows=scheme.act_order)
        if scheme.act_order:
            add(g_idx_spec(K))
    elif fam == "fp8":
        add(TensorSpec("qweight", (N, K), FP8_DTYPES[scheme.weight], output_dim=0, input_dim=1))
        scale_like("scales", torch.float32)
    elif fam in ("nvfp4", "mxfp4"):
        G = scheme.group_size
        assert G is not None
        add(
            TensorSpec(
                "qweight",
                (N, _ceil(K, 2)),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(2),
                input_align=G,
            )
        )
        sdt = torch.float8_e4m3fn if fam == "nvfp4" else torch.uint8
        add(
            TensorSpec(
                "scales",
                (N, _ceil(K, G)),
                sdt,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(G),
                input_align=G,
            )
        )
        if fam == "nvfp4":
            add(TensorSpec("global_scale", (S,), torch.float32, per_slice=True))
            if scheme.act is not None:
                add(TensorSpec("input_global_scale", (S,), torch.float32, per_slice=True))
    elif fam == "bnb4":
        G = scheme.group_size
        assert G is not None
        flat = "bitsandbytes 4-bit blocks run over the flattened weight, across rows"
        col = "split" if K % G == 0 else "refuse"
        why = (
            f"{flat}; a row-parallel cut would split them"
            if col == "split"
            else f"{flat}, and K={K} is not a multiple of the blocksize {G}, so rows share blocks"
        )
        add(
            TensorSpec(
                "qweight",
                (_ceil(N * K, 2),),
                torch.uint8,
                output_dim=0,
                output_unit=Fraction(2, K),
                column=col,
                row="refuse",
                refuse_reason=why,
            )
        )
        add(TensorSpec("code", (16,), torch.float32, column="replicate", row="replicate"))
        nb = _ceil(N * K, G)
        if scheme.double_quant:
            add(
                TensorSpec(
                    "absmax",
                    (nb,),
                    torch.uint8,
                    output_dim=0,
                    output_unit=Fraction(G, K),
                    column=col,
                    row="refuse",
                    refuse_reason=why,
                )
            )
            add(
                TensorSpec(
                    "nested_absmax",
                    (_ceil(nb, 256),),
                    torch.float32,
                    output_dim=0,
                    output_unit=Fraction(256 * G, K),
                    column=col,
                    row="refuse",
                    refuse_reason=why,
                    ceil_end=True,
                )
            )
            add(TensorSpec("nested_code", (256,), torch.float32, column="replicate", row="replicate"))
            add(TensorSpec("offset", (S,), torch.float32, per_slice=True))
        else:
            add(
                TensorSpec(
                    "absmax",
                    (nb,),
                    torch.float32,
                    output_dim=0,
                    output_unit=Fraction(G, K),
                    column=col,
                    row="refuse",
                    refuse_reason=why,
                )
            )
    elif fam == "gguf":
        B, T, _ = GGUF_TYPES[scheme.gguf_type]  # type: ignore[index]
        add(
            TensorSpec(
                "qweight",
                (N, K // B * T),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(B, T),
                input_align=B,
            )
        )
    else:  # pragma: no cover - every family is listed above
        raise AssertionError(fam)
    if scheme.act is not None and not scheme.act_dynamic:
        add(TensorSpec("input_scale", (S,), torch.float32, per_slice=True))
    return specs


#: activation scales loaded once per slice of a fused layer and reduced to one at load
PER_LAYER_ACTIVATION_SCALES = ("input_scale", "input_global_scale")


class CanonicalAdapter:
    """The format adapter for canonical tensors as quantrt's own quantizer writes them.

    Format adapters (GPTQ, AWQ, GGUF ...) have the same two methods: the TensorSpecs of what
    the checkpoint stores, and the conversion of loaded tensors to canonical ones.
    """

    name = "canonical"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        return canonical_specs(scheme, N, K, num_slices)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        out = dict(tensors)
        for name in PER_LAYER_ACTIVATION_SCALES:
            if name in out:
                out[name] = out[name].max().reshape(1)
        return CanonicalWeight(scheme, N, K, out, output_sizes)


def int_codes(weight: CanonicalWeight) -> torch.Tensor:
    """The unsigned integer codes of an ``int`` weight as int32 [N, K] (unpacked once, at load)."""
    return unpack_codes(weight["qweight"], weight.scheme.bits, weight.K).to(torch.int32)


def act_order_perm(weight: CanonicalWeight, group: int) -> torch.Tensor | None:
    """The input-channel order that makes act-order groups contiguous (None without act-order).

    Sorting by g_idx must leave groups of exactly ``group`` consecutive channels, as GPTQ's
    desc_act does; a uniform-group kernel refuses anything else, at load, with this error.
    """
    g_idx = weight.get("g_idx")
    if g_idx is None:
        return None
    perm = torch.argsort(g_idx.long(), stable=True)
    want = torch.arange(weight.K, device=g_idx.device) // group
    if not torch.equal(g_idx.long()[perm], want):
        raise ValueError(
            f"act-order g_idx does not form groups of exactly {group} channels; "
            "a uniform-group kernel cannot run it"
        )
    return perm


def pack_int_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned integer codes [N, K] in the canonical packed layout (a kernel that permutes K repacks)."""
    return pack_codes(codes, bits)


# -- layout helpers shared by the references and the kernels (the layouts above, decoded) ----------

#: e2m1 (fp4) code -> value, for the nvfp4 and mxfp4 layouts (code 8 is -0)
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
#: double-quant absmax: nested scales per this many absmax codes (bitsandbytes' fixed block)
NESTED_BLOCK = 256


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: uint8 [..., B] -> codes uint8 [..., 2B]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def unpack_bnb4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` 4-bit codes of a bnb packed buffer (uint8), high nibble first."""
    return torch.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 0xF], dim=-1).flatten()[:n]


def dequantize_absmax(
    codes: torch.Tensor, nested_absmax: torch.Tensor, nested_code: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """fp32 absmax from double-quant codes: ``nested_code[c] * nested_absmax[i // 256] + offset``."""
    n = codes.numel()
    nb = -(-n // NESTED_BLOCK)
    vals = torch.nn.functional.pad(nested_code[codes.long()], (0, nb * NESTED_BLOCK - n)).view(
        nb, NESTED_BLOCK
    )
    return ((vals * nested_absmax.unsqueeze(1)).reshape(-1)[:n] + offset).to(torch.float32)
