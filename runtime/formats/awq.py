"""AWQ, AutoAWQ's GEMM layout (also what auto-round's ``auto_awq`` export writes).

Per linear: ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [K/G, N/8], packed along N with
AutoAWQ's interleave (nibble i of a word holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]),
``scales`` [K/G, N]; zero-points are stored as they are. The GEMV layout packs along K with
padded widths; vLLM does not read it either, and quantrt refuses it by name.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ..canonical import CanonicalWeight
from ..errors import CheckpointError
from ..reference.packing import pack_codes
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import (
    CHUNK_ROWS,
    FLOAT_DTYPES,
    FormatReader,
    LayerEntry,
    TensorIndex,
    by_rows,
    check_finite,
    expect,
    prefixes_with,
)
from .gptq import _scale_torch_dtype, int_scheme

#: nibble that holds column 8c + j
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] in AWQ's interleaved order -> 4-bit codes uint8 [R, 8*C] in natural column order."""
    parts = [((words >> (4 * r)) & 0xF).to(torch.uint8) for r in AWQ_REVERSE_ORDER]
    return torch.stack(parts, dim=-1).reshape(words.shape[0], -1)


class AWQAdapter:
    """AWQ GEMM tensors of one layer <-> canonical int tensors."""

    name = "awq"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        G = scheme.group_size if scheme.granularity == "group" else K
        rows = "replicate" if scheme.granularity == "channel" else "split"
        specs = {
            "qweight": TensorSpec(
                "qweight",
                (K, N // 8),
                torch.int32,
                input_dim=0,
                output_dim=1,
                output_unit=Fraction(8),
                output_align=8,
            ),
            "scales": TensorSpec(
                "scales",
                (K // G, N),
                _scale_torch_dtype(scheme),
                input_dim=0,
                output_dim=1,
                input_unit=Fraction(G),
                input_align=G,
                row=rows,
            ),
        }
        specs["qzeros"] = TensorSpec(
            "qzeros",
            (K // G, N // 8),
            torch.int32,
            input_dim=0,
            output_dim=1,
            input_unit=Fraction(G),
            input_align=G,
            output_unit=Fraction(8),
            output_align=8,
            row=rows,
        )
        return specs

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        qweight, scales = tensors["qweight"], tensors["scales"]
        check_finite(scales, "scales")
        q = by_rows(
            N // 8, lambda s, e: pack_codes(unpack_awq(qweight[:, s:e]).T, 4), rows=max(1, CHUNK_ROWS // 8)
        )
        z = unpack_awq(tensors["qzeros"]).T.to(torch.int16).contiguous()
        out = {"qweight": q, "scales": scales.float().T.contiguous()}
        if scheme.symmetric:
            if not bool((z == 8).all()):
                raise CheckpointError(
                    "qzeros: the config says zero_point false (symmetric, zero 8) but the "
                    f"stored zero-points are {sorted({int(v) for v in z.unique()[:5]})}..."
                )
        else:
            out["zeros"] = z
        return CanonicalWeight(scheme, N, K, out, output_sizes)


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


class AWQReader(FormatReader):
    """``quant_method: awq`` (AutoAWQ spells its keys w_bit / q_group_size)."""

    name = "awq"

    def quantized_layers(self) -> dict[str, LayerEntry]:
        bits = int(self.cfg("bits", "w_bit", required=True))
        if bits != 4:
            raise CheckpointError(f"{self.source}: AWQ stores 4-bit weights, the config says bits={bits}")
        group = int(self.cfg("group_size", "q_group_size", required=True))
        zero_point = bool(self.cfg("zero_point", default=True))
        version = str(self.cfg("version", default="gemm")).lower()
        if version != "gemm":
            raise CheckpointError(
                f"{self.source}: AWQ version {version!r} is an unsupported variant: quantrt reads "
                "AutoAWQ's GEMM layout only (its GEMV layout's padded packing is not established)"
            )
        return {
            p: awq_layer(self.index, p, group, zero_point, self.source)
            for p in prefixes_with(self.index, "qweight")
        }
