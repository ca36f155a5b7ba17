"""GGUF Q4_K (``cuda.mma_gguf``) and Q8_0 (``cuda.mma_gguf_q8``) on the tensor-core kernel of
``mma_wna16``.

Q4_K's codes are unsigned nibbles like int4's, so they take int4's lane-order repack
(``wna16_layout.repack_codes``) and the same kernel, built with ``CODE = Q4K``
(``kernels/wna16_common.cuh``). The scales stay as llama.cpp stores them: each super-block's 16
head bytes (d and dmin in fp16, then 12 bytes of 6-bit sub-block scales and mins), transposed to
the kernel's parameter layout [super-blocks, Npad], so the prepared weight is exactly the stored
bytes (4.5 bits per weight). A super-block spans two of the kernel's 128-input chunks and each
lane's 32-input run of a chunk is one sub-block, so a lane decodes its scale and min once per
chunk and column, and each code pair costs one mask, one subtraction and one fused multiply-add
(``d sc q - dmin m``, with ``d sc`` and ``dmin m`` rounded once to the activation dtype).

Q8_0's signed bytes plus 128 take int8's lane repack (``CODE = Q80``) and each block's fp16 d
is the group parameter as stored (two blocks per 64-input chunk), so the prepared weight is again
the stored bytes (8.5 bits per weight). A code pair costs a byte permute and a subtraction (fp16:
1024 + u less 1152) or two more bit operations (bf16, whose 8-bit significand cannot hold 128 + u:
the low 7 bits go into 128's mantissa and bit 7 picks 128 or 256 to subtract), then one multiply by
d (exact in fp16, rounded once in bf16).

Why: the CUDA GEMV on the native planes (``gguf_gemv.py``) decodes into fp32 and is bound by
instructions, 40-48% of copy bandwidth at M = 1 on the H200; the tensor-core kernel spends fewer
instructions per weight and serves every small batch with one launch. Large batches dequantize K
slices for cuBLAS, as the integer kernels do.
"""

from __future__ import annotations

from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec

from .mma_wna16 import Q4K, Q80, Operands, fit_tiles, prepare_mma, sz_bytes
from .wna16_layout import KC, N_ALIGN, ROW_SLICE
from .wna16_rules import device_conditions

#: bytes of a Q4_K block: d, dmin (fp16), 12 scale bytes, 128 code bytes for 256 weights
BLOCK_BYTES = 144
HEAD_BYTES = 16
SUPER = 256
#: a Q8_0 block: d (fp16), 32 signed code bytes
Q8_BYTES = 34
Q8_BLOCK = 32


def _blocks(weight: CanonicalWeight, t: str, B: int, T: int) -> torch.Tensor:
    """qweight as [N, blocks, T] bytes, checked against N and K (B weights per block)."""
    q = weight["qweight"]
    N, K = weight.N, weight.K
    nb = K // B
    if q.dtype != torch.uint8 or tuple(q.shape) != (N, nb * T):
        raise ValueError(
            f"gguf {t} qweight for N={N}, K={K}: expected uint8 [{N}, {nb * T}], found {q.dtype} {list(q.shape)}"
        )
    return q.view(N, nb, T)


def _param_layout(fields: torch.Tensor, groups: int) -> torch.Tensor:
    """Per-block bytes [N, blocks, F] -> the kernel's parameter layout [groups, Npad, F] (padding 0)."""
    N, nb, F = fields.shape
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    out = torch.zeros(groups, n_pad, F, dtype=torch.uint8, device=fields.device)
    out[:nb, :N] = fields.transpose(0, 1)
    return out


def q8_operands(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K] = the signed bytes plus 128; d bits int16 [blocks over K padded to the
    64-input chunk, Npad], the kernel's parameter layout, padding 0)."""
    blocks = _blocks(weight, "q8_0", Q8_BLOCK, Q8_BYTES)
    codes = (blocks[:, :, 2:] ^ 0x80).reshape(weight.N, weight.K)
    d = _param_layout(blocks[:, :, :2], -(-weight.K // KC[8]) * KC[8] // Q8_BLOCK)
    return codes, d.view(torch.int16).squeeze(-1)


def q4k_operands(weight: CanonicalWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K/2] in the canonical packing, low nibble = even k; head bytes uint8
    [super-blocks over the padded K, Npad, 16], the kernel's parameter layout, padding 0). Blocks
    decode as stored, as llama.cpp's do; the GGUF loader refuses NaN or infinite f16 fields first."""
    blocks = _blocks(weight, "q4_k", SUPER, BLOCK_BYTES)
    N, K = weight.N, weight.K
    nb = blocks.shape[1]
    codes = torch.empty(N, K // 2, dtype=torch.uint8, device=blocks.device)
    for r0 in range(0, N, ROW_SLICE):
        qs = blocks[r0 : r0 + ROW_SLICE, :, HEAD_BYTES:].reshape(-1, nb, 4, 1, 32)
        # byte l of 32-byte run j: weight 64 j + l (low nibble) and 64 j + 32 + l (high)
        k = torch.cat((qs & 0xF, qs >> 4), dim=3).reshape(-1, K)
        codes[r0 : r0 + ROW_SLICE] = k[:, 0::2] | (k[:, 1::2] << 4)
    return codes, _param_layout(blocks[:, :, :HEAD_BYTES], -(-K // KC[4]) * KC[4] // SUPER)


def gguf_conditions(spec: LayerSpec, caps: Any, gguf_type: str, k_multiple: int) -> Verdict:
    """The device, the one GGUF type, and K in whole blocks (or super-blocks) of it."""
    s = spec.scheme
    return check(
        *device_conditions(spec, caps, "cupy", "NVRTC compiles the kernel"),
        (
            s.family == "gguf" and s.gguf_type == gguf_type,
            f"GGUF {gguf_type} weights",
            {"gguf_type": s.gguf_type},
        ),
        (spec.K_part % k_multiple == 0, f"K a multiple of {k_multiple}", {"K": spec.K_part}),
    )


def gguf_rows(table: dict[str, Any], own: str, base: str, code: int) -> list[dict[str, Any]]:
    """The type's own sweep (``own``), else the integer rows of its code width (``base``, else
    ``small_m``), unfolded, with as many n8 tiles as whole 16-byte copies of its group parameters
    allow (q4_k's heads: 2 or 4)."""
    rows = table.get(own, table.get(base, table["small_m"]))
    return fit_tiles(rows, sz_bytes(torch.float16, code))


class CudaMmaGGUF(Kernel):
    name = "cuda.mma_gguf"
    description = (
        "CUDA GGUF q4_k on tensor cores (mma.sync, int4's lane-order repack, llama.cpp's super-block heads as "
        "the group parameters: one fused multiply-add per code pair); cuBLAS on dequantized slices for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return gguf_conditions(spec, caps, "q4_k", SUPER)

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        codes, heads = q4k_operands(weight)
        return codes, heads, None, None

    @classmethod
    def tile_rows(cls, table: dict[str, Any]) -> list[dict[str, Any]]:
        return gguf_rows(table, "small_m_q4k", "small_m", Q4K)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        return prepare_mma(
            self, weight, spec, bits=4, code=Q4K, operands=self.operands, tile_rows=self.tile_rows
        )


class CudaMmaGGUFQ8(Kernel):
    name = "cuda.mma_gguf_q8"
    description = (
        "CUDA GGUF q8_0 on tensor cores (mma.sync, int8's lane-order repack, llama.cpp's block scales as the "
        "group parameters); cuBLAS on dequantized slices for large M"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return gguf_conditions(spec, caps, "q8_0", Q8_BLOCK)

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        codes, d = q8_operands(weight)
        return codes, d, None, None

    @classmethod
    def tile_rows(cls, table: dict[str, Any]) -> list[dict[str, Any]]:
        return gguf_rows(table, "small_m_q80", "small_m_w8", Q80)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        return prepare_mma(
            self, weight, spec, bits=8, code=Q80, operands=self.operands, tile_rows=self.tile_rows
        )
