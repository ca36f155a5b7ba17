"""2- and 3-bit integer weights (W2A16, W3A16: GPTQ, AutoRound and compressed-tensors at 2/3 bits)
on the int4 tensor-core kernel of ``mma_wna16`` (``cuda.mma_w2w3``).

A code of fewer than four bits is a nibble whose high bits are zero, and its zero point one the
int4 decode already handles (``(magic + q - (magic + z)) * s`` holds for any q, z below 16), so the
codes are widened to nibbles at load, row slice by row slice, and everything after (lane repack,
group parameters, launch shapes, the dense path for large M) is int4's, unchanged. The prepared
weight takes 4 bits per weight against the 3 or 2 stored: a third or a half more than the
checkpoint, in exchange for the tensor-core kernel instead of the reference's per-call fp32
dequantization, the only GPU path these layouts had.
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.backends.triton.wna16_kernel import wna16_scheme_conditions
from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.packing import pack_codes, unpack_codes
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec

from .mma_wna16 import Operands, groups_per_chunk, int_rows, over_base, prepare_mma
from .wna16_layout import KC, ROW_SLICE, group_params
from .wna16_rules import device_conditions

#: the code widths this kernel widens to nibbles
NARROW_BITS = (2, 3)


def narrow_operands(weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
    """Codes widened to int4's canonical packing (uint8 [N, ceil(K/2)], low nibble = even k), and
    int4's biased group parameters with the scheme's zero points (2^(b-1) when symmetric)."""
    bits, N, K = weight.scheme.bits, weight.N, weight.K
    q = weight["qweight"]
    nib = torch.empty(N, -(-K // 2), dtype=torch.uint8, device=q.device)
    for r0 in range(0, N, ROW_SLICE):
        r1 = min(N, r0 + ROW_SLICE)
        nib[r0:r1] = pack_codes(unpack_codes(q[r0:r1], bits, K), 4)
    scales = weight["scales"]
    zeros = weight.get("zeros")
    if zeros is None:
        zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int16, device=scales.device)
    return nib, group_params(scales, zeros, 4, K, group, act).sz, None, None


class CudaMmaNarrow(Kernel):
    name = "cuda.mma_w2w3"
    description = (
        "CUDA 2/3-bit integer weight-only on the int4 tensor-core kernel (codes widened to nibbles at load, "
        "4 bits per weight prepared); cuBLAS on dequantized slices for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        group = s.group_size if s.granularity == "group" else None
        narrow = s.weight == "int" and s.bits in NARROW_BITS
        return check(
            *device_conditions(spec, caps, "cupy", "NVRTC compiles the kernel"),
            (narrow, "2- or 3-bit integer weights", {"weight": s.weight, "bits": s.bits}),
            *wna16_scheme_conditions(spec, s.bits)[1:],  # weight-only, group or channel, act-order's K
            (
                groups_per_chunk(4, group) > 0,
                f"group size {KC[4]} times a power of two, or 16..{KC[4]} dividing it",
                {"group_size": group},
            ),
        )

    @staticmethod
    def rows_for(bits: int) -> Any:
        """A width's own sweep rows (``small_m_w2``, ``small_m_w3``: their group parameters, not
        their codes, differ from int4's: w2's catalog groups are 64) over int4's."""
        return lambda table: over_base(table, f"small_m_w{bits}", int_rows(table, 4))

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        rows = self.rows_for(weight.scheme.bits)
        return prepare_mma(self, weight, spec, bits=4, code=4, operands=narrow_operands, tile_rows=rows)
