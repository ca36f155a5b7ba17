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

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.gguf_blocks import f16_field, k_scale_min, q3_k_scales
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import Prepared
from quantrt.specs import LayerSpec

from .mma_wna16 import (
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q40,
    Q41,
    Q50,
    Q51,
    Q80,
    Operands,
    RowsFn,
    fit_tiles,
    over_base,
    prepare_mma,
    sz_bytes,
)
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


#: legacy GGUF types (32-input blocks): type -> (bytes per block, offset of the nibbles, offset of
#: the fifth bits or None, bytes of d (and m) from offset 0)
BLOCK32 = {
    "q4_0": (18, 2, None, 2),
    "q4_1": (20, 4, None, 4),
    "q5_0": (22, 6, 2, 2),
    "q5_1": (24, 8, 4, 4),
}
#: bit of the kernel's high-bit word for input e of a 32-input run: 4 kt + j at kt + (0, 16, 8, 24)[j]
HIGH_BIT = [e // 4 + (0, 16, 8, 24)[e % 4] for e in range(32)]


def _pack_pairs(nib: torch.Tensor) -> torch.Tensor:
    """Codes [rows, K] (0..15) -> the canonical packing [rows, K / 2], low nibble = even k."""
    return nib[:, 0::2] | (nib[:, 1::2] << 4)


def high_word(bits: torch.Tensor) -> torch.Tensor:
    """Fifth bits [..., 32] (0/1, input order) -> the kernel's high-bit word as 4 little-endian
    bytes [..., 4] (``high_bits`` in kernels/wna16_common.cuh)."""
    pos = torch.tensor(HIGH_BIT, dtype=torch.int32, device=bits.device)
    # distinct bits, so the int32 sum is their OR (bit 31 wraps to the sign, as intended)
    w = (bits.to(torch.int32) << pos).sum(-1, keepdim=True, dtype=torch.int32)
    return ((w >> torch.arange(0, 32, 8, dtype=torch.int32, device=bits.device)) & 0xFF).to(torch.uint8)


def _block_bits(qh: torch.Tensor) -> torch.Tensor:
    """A legacy block's 4 qh bytes [..., 4] (a little-endian u32, bit e for element e) -> [..., 32]."""
    return ((qh.unsqueeze(-1) >> torch.arange(8, device=qh.device)) & 1).flatten(-2)


def _half_pairs(x: torch.Tensor, act: torch.dtype, runs: int) -> torch.Tensor:
    """Per-16-input values [rows, nb, 16 per super-block] rounded to ``act``, as the two halves of
    each 32-input run's word: uint8 [rows, runs, 4]."""
    return x.to(act).reshape(x.shape[0], runs, 2).view(torch.uint8)


def _legacy(t: str) -> RunsFn:
    """q4_0/q4_1/q5_0/q5_1: a block is a run; d (and m) as stored, after its high-bit word for
    5-bit codes (padded to 8 bytes)."""
    _, qs, qh, head = BLOCK32[t]

    def runs(b: torch.Tensor, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        nib = torch.cat((b[..., qs : qs + 16] & 0xF, b[..., qs : qs + 16] >> 4), dim=-1)
        f = b[..., :head]
        if qh is not None:
            pad = torch.zeros(*f.shape[:-1], 4 - head, dtype=torch.uint8, device=f.device)
            f = torch.cat((high_word(_block_bits(b[..., qh : qh + 4])), f, pad), dim=-1)
        return nib.reshape(b.shape[0], -1), f

    return runs


def _q5k(b: torch.Tensor, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q5_k: a run is a sub-block; its high-bit word, then d sc and -dmin m (8 bytes)."""
    rows, nb = b.shape[:2]
    qs = b[..., 48:176].reshape(rows, nb, 4, 1, 32)  # sub-block 2i + h: nibble h of run i
    nib = torch.cat((qs & 0xF, qs >> 4), dim=3)  # [rows, nb, 4, 2, 32] = sub-block, element
    hb = (b[..., 16:48].unsqueeze(-2) >> torch.arange(8, device=b.device)[:, None]) & 1  # [rows, nb, 8, 32]
    sc, mn = k_scale_min(b[..., 4:16].reshape(-1, 12))
    s = (f16_field(b, 0).reshape(-1, 1) * sc.float()).to(act).reshape(rows, nb, 8, 1)
    o = (-(f16_field(b, 2).reshape(-1, 1) * mn.float())).to(act).reshape(rows, nb, 8, 1)
    f = torch.cat((high_word(hb), torch.cat((s, o), dim=-1).view(torch.uint8)), dim=-1)
    return nib.reshape(rows, -1), f.reshape(rows, nb * 8, 8)


def _q6k(b: torch.Tensor, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q6_k: the run's fifth-bit and sixth-bit words, then d sc of its two sub-blocks (16 bytes)."""
    rows, nb = b.shape[:2]
    ql = b[..., :128].reshape(rows, nb, 2, 1, 64)  # half n: low nibbles, then high ones
    qh = b[..., 128:192].reshape(rows, nb, 2, 1, 32)  # half n: 2-bit field f for 32 f + l
    high = ((qh >> torch.arange(0, 8, 2, device=b.device)[:, None]) & 3).reshape(rows, nb * 8, 32)
    s = _half_pairs(f16_field(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float(), act, nb * 8)
    pad = torch.zeros(rows, nb * 8, 4, dtype=torch.uint8, device=b.device)
    f = torch.cat((high_word(high & 1), high_word(high >> 1), s, pad), dim=-1)
    return torch.cat((ql & 0xF, ql >> 4), dim=3).reshape(rows, -1), f


def _q2k(b: torch.Tensor, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q2_k: whole codes; d sc, then -dmin m, of the run's two sub-blocks (8 bytes)."""
    nb = b.shape[1]
    sc = b[..., :16]
    s = _half_pairs(f16_field(b, 80) * (sc & 0xF).float(), act, nb * 8)
    o = _half_pairs(-(f16_field(b, 82) * (sc >> 4).float()), act, nb * 8)
    return _two_bit(b[..., 16:80]), torch.cat((s, o), dim=-1)


def _q3k(b: torch.Tensor, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q3_k: whole codes plus 4 (the high bit as bit 2); d (sc - 32) of the run's two sub-blocks."""
    rows, nb = b.shape[:2]
    hm = b[..., :32].reshape(rows, nb, 1, 32)  # bit f of byte l: element 32 f + l
    u = _two_bit(b[..., 32:96]) | (
        ((hm >> torch.arange(8, device=b.device)[:, None]) & 1).reshape(rows, -1) << 2
    )
    sc = q3_k_scales(b[..., 96:108].reshape(-1, 12)).reshape(rows, nb, 16).float()
    return u, _half_pairs(f16_field(b, 108) * sc, act, nb * 8)


def _two_bit(qs: torch.Tensor) -> torch.Tensor:
    """A super-block's 64 bytes of 2-bit codes [rows, nb, 64] -> codes [rows, nb * 256]: half n's
    field f of byte l is element 128 n + 32 f + l."""
    rows, nb = qs.shape[:2]
    q = qs.reshape(rows, nb, 2, 1, 32) >> torch.arange(0, 8, 2, device=qs.device)[:, None]
    return (q & 3).reshape(rows, -1)


#: ``runs(blocks of some rows, act)``: (4-bit codes [rows, K], parameters [rows, K / 32, P])
RunsFn = Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]]
#: type -> (the kernel's CODE, block elements, block bytes, its runs)
RUNS: dict[str, tuple[int, int, int, RunsFn]] = {
    "q4_0": (Q40, 32, BLOCK32["q4_0"][0], _legacy("q4_0")),
    "q4_1": (Q41, 32, BLOCK32["q4_1"][0], _legacy("q4_1")),
    "q5_0": (Q50, 32, BLOCK32["q5_0"][0], _legacy("q5_0")),
    "q5_1": (Q51, 32, BLOCK32["q5_1"][0], _legacy("q5_1")),
    "q2_k": (Q2K, SUPER, 84, _q2k),
    "q3_k": (Q3K, SUPER, 110, _q3k),
    "q5_k": (Q5K, SUPER, 176, _q5k),
    "q6_k": (Q6K, SUPER, 210, _q6k),
}


def run_operands(weight: CanonicalWeight, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands of ``cuda.mma_gguf_blocks``: (codes uint8 [N, K/2], each weight's low nibble
    (q2_k, q3_k: the whole code) in the canonical packing; one parameter per 32-input run and
    column [runs over the padded K, Npad, P], padding 0), built a slice of rows at a time. The
    K types' scales are rounded once to the activation dtype, as q4_k's decode rounds them; the
    legacy types keep d and m as stored. q2_k/q3_k's nibbles cost 4 bits per weight against the
    stored 2.6 and 3.4: these layouts serve batches, where the weight is read once for many rows."""
    t = weight.scheme.gguf_type
    _, B, T, runs = RUNS[t]
    blocks = _blocks(weight, t, B, T)
    N, K = weight.N, weight.K
    codes = torch.empty(N, K // 2, dtype=torch.uint8, device=blocks.device)
    fields = []
    for r0 in range(0, N, ROW_SLICE):
        nib, f = runs(blocks[r0 : r0 + ROW_SLICE], act)
        codes[r0 : r0 + ROW_SLICE] = _pack_pairs(nib)
        fields.append(f)
    return codes, _param_layout(torch.cat(fields), -(-K // KC[4]) * KC[4] // 32)


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
    """The type's own sweep (``own``) over the integer rows of its code width (``base``:
    ``small_m`` or ``small_m_w8``), with as many n8 tiles as whole 16-byte copies of its group
    parameters allow (q4_k's heads: 2 or 4)."""
    rows = over_base(table, own, over_base(table, base, table["small_m"]))
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


class CudaMmaGGUFBlocks(Kernel):
    """The GGUF types whose codes split into a nibble and high bits: the nibbles stream as int4's do
    and each lane's 32-input run brings one parameter, so the decode is int4's plus a shift and a
    mask per high bit. 4.5-5 bits per weight as stored for q4_0/q4_1/q5_1; q5_0 and q5_k 6 (stored
    5.5), q6_k 8 (stored 6.56: the parameter copy needs power-of-two sizes); q3_k 5 and q2_k 6 (stored
    3.44 and 2.63: their codes widened to nibbles)."""

    name = "cuda.mma_gguf_blocks"
    description = (
        "CUDA GGUF q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q5_k and q6_k on tensor cores (mma.sync, int4's lane-order "
        "repack of the low nibbles; each 32-input run's high bits, scales and offsets as its group parameter); "
        "cuBLAS on dequantized slices for large M"
    )
    #: GGUF type -> CODE template argument
    CODES: ClassVar[dict[str, int]] = {t: v[0] for t, v in RUNS.items()}

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        t = spec.scheme.gguf_type
        return gguf_conditions(spec, caps, t if t in cls.CODES else "q4_0/q4_1/q5_0/q5_1/q2_k/q3_k/q5_k/q6_k",
                               SUPER if (t or "").endswith("_k") else 32)  # fmt: skip

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        codes, params = run_operands(weight, act)
        return codes, params, None, None

    @classmethod
    def rows_for(cls, t: str) -> RowsFn:
        """The type's own sweep rows (``small_m_q50`` ...) over int4's integer rows."""
        return lambda table: gguf_rows(table, f"small_m_{t.replace('_', '')}", "small_m", cls.CODES[t])

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        t = weight.scheme.gguf_type
        return prepare_mma(
            self, weight, spec, bits=4, code=self.CODES[t], operands=self.operands,
            tile_rows=self.rows_for(t), group=32,
        )  # fmt: skip
