"""AWQ, AutoAWQ's GEMM layout (also what auto-round's ``auto_awq`` export writes).

Per linear: ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [K/G, N/8], packed along N with
AutoAWQ's interleave (nibble i of a word holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]),
``scales`` [K/G, N]; zero-points are stored as they are. The GEMV layout packs along K with
padded widths; vLLM does not read it either, and quantrt refuses it by name.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..packing import pack_codes
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import (
    CHUNK_ROWS,
    FLOAT_DTYPES,
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
from .gptq import Bits, int_scheme
from .schema import Bool, Config, GroupSize, Str

#: nibble that holds column 8c + j
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] in AWQ's interleaved order -> 4-bit codes uint8 [R, 8*C] in natural column order."""
    parts = [((words >> (4 * r)) & 0xF).to(torch.uint8) for r in AWQ_REVERSE_ORDER]
    return torch.stack(parts, dim=-1).reshape(words.shape[0], -1)


class AWQAdapter:
    """Int4 packed along N (AWQ's GEMM layout, also Quark's int4/uint4) <-> canonical int tensors.

    ``interleave``: AWQ's nibble order (Quark ``pack_method: reorder``) or natural LSB-first
    (``order``); ``signed``: nibbles are two's complement (Quark int4), so the canonical code is
    ``nibble ^ 8`` and the zero-point ``zp + 8``. Role names follow the format's tensor names.
    """

    def __init__(
        self,
        weight: str = "qweight",
        scales: str = "scales",
        zeros: str = "qzeros",
        interleave: bool = True,
        signed: bool = False,
    ) -> None:
        self.weight, self.scales, self.zeros = weight, scales, zeros
        self.interleave, self.signed = interleave, signed
        self.name = "awq" if weight == "qweight" else "int4 packed along N"

    def _unpack(self, words: torch.Tensor) -> torch.Tensor:
        codes = unpack_awq(words) if self.interleave else unpack_natural(words)
        return codes ^ 8 if self.signed else codes

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        # zero-points are stored for symmetric weights too (every one 8)
        canonical = canonical_specs(scheme.with_(symmetric=False), N, K, num_slices)
        words = Fraction(32, scheme.bits)  # AWQ's nibble interleave is a 4-bit layout
        layout = {
            self.weight: Stored("qweight", torch.int32, packing=words, along="output", transposed=True),
            self.scales: Stored("scales", SCALE_TORCH_DTYPES[scheme.scale_dtype], transposed=True),
            self.zeros: Stored("zeros", torch.int32, packing=words, along="output", transposed=True),
        }
        return stored_specs(canonical, N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        qweight, scales = tensors[self.weight], tensors[self.scales]
        check_finite(scales, self.scales)
        q = by_rows(
            N // 8, lambda s, e: pack_codes(self._unpack(qweight[:, s:e]).T, 4), rows=max(1, CHUNK_ROWS // 8)
        )
        z = self._unpack(tensors[self.zeros]).T.to(torch.int16).contiguous()
        out = {"qweight": q, "scales": scales.float().T.contiguous()}
        if scheme.symmetric:
            if not bool((z == 8).all()):
                raise CheckpointError(
                    f"{self.zeros}: the config says symmetric (zero 8) but the stored zero-points "
                    f"decode to {sorted({int(v) for v in z.unique()[:5]})}..."
                )
        else:
            out["zeros"] = z
        return CanonicalWeight(scheme, N, K, out, output_sizes)


def unpack_natural(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] packing 8 nibbles LSB-first along the last dim -> uint8 [R, 8*C]."""
    parts = [((words >> (4 * j)) & 0xF).to(torch.uint8) for j in range(8)]
    return torch.stack(parts, dim=-1).reshape(words.shape[0], -1)


def awq_layer(index: TensorIndex, prefix: str, group_size: int, zero_point: bool, where: str) -> LayerEntry:
    qw = f"{prefix}.qweight"
    expect(index, qw, None, (torch.int32,))
    K, cols = index.shape(qw)
    N = cols * 8
    scales = f"{prefix}.scales"
    if scales not in index:
        raise CheckpointError(f"missing tensor {scales!r} (AWQ layer {prefix})")
    scheme = int_scheme(
        4, group_size, K, not zero_point, False, index.dtype(scales), f"{where} layer {prefix}"
    )
    ng = K // (scheme.group_size or K)
    expect(index, scales, (ng, N), FLOAT_DTYPES, "AWQ scales [K/G, N]")
    expect(index, f"{prefix}.qzeros", (ng, cols), (torch.int32,), "AWQ qzeros [K/G, N/8]")
    bias = f"{prefix}.bias" if f"{prefix}.bias" in index else None
    tensors = {"qweight": qw, "qzeros": f"{prefix}.qzeros", "scales": scales}
    return LayerEntry(prefix, scheme, N, K, tensors, AWQAdapter(), bias=bias)


class AWQConfig(Config):
    """``quant_method: awq`` (AutoAWQ, GPTQModel, auto-round's AWQ export): the keys quantrt reads."""

    bits: Bits = None
    w_bit: Bits = None
    group_size: GroupSize = None
    q_group_size: GroupSize = None
    zero_point: Bool | None = None
    version: Str | None = None


class AWQReader(FormatReader):
    """``quant_method: awq`` (AutoAWQ spells its keys w_bit / q_group_size)."""

    name = "awq"
    schema = AWQConfig

    def quantized_layers(self) -> dict[str, LayerEntry]:
        bits = self.cfg("bits", "w_bit", required=True)
        if bits != 4:
            raise CheckpointError(f"{self.source}: AWQ stores 4-bit weights, the config says bits={bits}")
        group = self.cfg("group_size", "q_group_size", required=True)
        zero_point = self.cfg("zero_point") is not False  # unset or null: AutoAWQ's default
        version = (self.cfg("version", default=None) or "gemm").lower()
        if version != "gemm":
            raise CheckpointError(
                f"{self.source}: AWQ version {version!r} is an unsupported variant: quantrt reads "
                "AutoAWQ's GEMM layout only (its GEMV layout's padded packing is not established)"
            )
        return {
            p: awq_layer(self.index, p, group, zero_point, self.source)
            for p in prefixes_with(self.index, "qweight")
        }
