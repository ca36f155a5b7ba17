"""fp8 weight-only (W8A16: e4m3 and e5m2, tensor, channel or block scales) on the tensor-core
kernel of ``mma_wna16`` (``cuda.mma_fp8``).

fp8 codes are bytes like int8's, so they take int8's lane-order repack and the same kernel, built
with ``CODE`` F8E4 or F8E5 (``kernels/wna16_common.cuh``): a byte's exponent and mantissa bits,
shifted under the activation dtype's sign, are the code's value times a power of two, exactly
(subnormal codes included), and one multiply per pair by the inverse power gives the value. The
scales stay fp32 as stored: every launch shape folds them onto each chunk's sums (one group per
chunk or per whole chunks: per-tensor and per-channel scales are one group spanning K, DeepSeek-V3
style 128x128 blocks two chunks), so the products are the reference's up to fp32 summation, at any
M the tiles serve. Batches past the tuned shapes dequantize K slices (each code times its scale in
fp32, rounded once to the activation dtype) for cuBLAS, as the integer kernels do.

Against ``cuda.triton_fp8_w8a16`` it brings the CuPy launcher's host cost and the small-M kernel's
weight streaming; W8A8 fp8 checkpoints run here only where the GPU has no fp8 matrix units (as a
weight-only substitute, like the Triton kernel), since those units run them natively.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec
from quantrt.torchops import per_channel_scales

from .mma_wna16 import F8E4, F8E5, Operands, groups_per_chunk, int_rows, prepare_mma
from .policy import CUDA
from .wna16_layout import KC, N_ALIGN
from .wna16_rules import device_conditions

#: the scheme's weight type -> the kernel's CODE template argument
CODES = {"fp8_e4m3": F8E4, "fp8_e5m2": F8E5}


def scale_group(scheme: Any) -> int | None:
    """Inputs per scale along K: a block's bk, or None for tensor and channel scales."""
    return int(scheme.block[1]) if scheme.granularity == "block" else None


def fp8_operands(weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
    """Codes as stored (their bytes); fp32 scales [groups over the padded K, Npad] (block scales
    repeated over their bn columns; tensor scales expanded per column), zero past N and K."""
    s = weight.scheme
    q = weight["qweight"]
    N, K = weight.N, weight.K
    chunks = -(-K // KC[8])
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    if s.granularity == "block":
        per_col = weight["scales"].float().repeat_interleave(int(s.block[0]), dim=0)[:N]  # [N, K blocks]
        n_groups = -(-(chunks * KC[8]) // int(s.block[1]))
    else:
        per_col = per_channel_scales(weight).reshape(N, 1)
        n_groups = 1
    sz = torch.zeros(n_groups, n_pad, dtype=torch.float32, device=q.device)
    sz[: per_col.shape[1], :N] = per_col.t()
    return q.view(torch.uint8), sz.contiguous(), None, None


def fp8_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """int8's launch shapes, every one folded: the scales stay fp32 on the sums at every M (the
    unfolded decode would round each scale to the activation dtype)."""
    return [{**r, "fold": True} for r in int_rows(table, 8) if not r.get("wgmma")]


class CudaMmaFp8(Kernel):
    name = "cuda.mma_fp8"
    description = (
        "CUDA fp8 weight-only (e4m3/e5m2; tensor, channel or block scales) on tensor cores (mma.sync, int8's "
        "lane-order repack, codes placed as fp16/bf16 by bit tricks, fp32 scales on the sums); cuBLAS on "
        "dequantized slices for large M"
    )
    CODES: ClassVar[dict[str, int]] = CODES

    weight_only = True  # an activation-quantized scheme here is a weight-only substitute

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        group = scale_group(s) if s.family == "fp8" else None
        return check(
            *device_conditions(spec, caps, "cupy", "NVRTC compiles the kernel"),
            (s.family == "fp8" and s.weight in CODES, "fp8 weights (e4m3 or e5m2)", {"weight": s.weight}),
            (
                s.act is None or not CUDA.fp8_units(caps)[0],
                "a weight-only scheme (fp8 matrix units run W8A8 natively)",
                {"act": s.act, "sm": caps.sm},
            ),
            (
                groups_per_chunk(8, group) > 0,
                f"scale blocks of {KC[8]} inputs times a power of two, or 16..{KC[8]} dividing {KC[8]}",
                {"block": s.block},
            ),
            (
                s.granularity != "block" or spec.K_part % s.block[1] == 0 or spec.k_full,
                "this rank's K cut on block boundaries",
                {"K_part": spec.K_part, "block": s.block},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        s = weight.scheme
        return prepare_mma(
            self, weight, spec, bits=8, code=CODES[s.weight], operands=fp8_operands, tile_rows=fp8_rows,
            group=scale_group(s),
        )  # fmt: skip
