"""The weight layout the tensor-core W4A16/W8A16 kernel (``kernels/wna16_mma.cu``) reads.

mma.sync m16n8k16 gives each lane (g = lane // 4, t = lane % 4) of a warp a fixed piece of a
k16 tile: column (or row) g, and the four inputs the fragment calls 2t, 2t+1 (first register)
and 2t+8, 2t+9 (second). Which real inputs those are is free, as long as x and W agree. The
kernel takes inputs t*KC/4 + 4*tile + (0, 1 | 2, 3) for lane t in tile `tile` of a chunk of KC
inputs (128 at 4 bits, 64 at 8), so across a chunk lane (g, t) multiplies KC/4 consecutive
inputs of column g: its codes are one 16-byte load and its x one or two 16-byte loads.

The repack stores, for every 8 output columns and every chunk, lane l's 16 bytes at lane l:
  4-bit: word j holds inputs 8j..8j+7 of the lane's run; nibble slot u (bits 4u..4u+3) holds
         input 8j + 2*(u % 4) + u // 4, so ``(w >> 8h) & 0x000F000F`` and ``(w >> 8h+4) & ...``
         are the fp16/bf16 pairs (4h, 4h+1) and (4h+2, 4h+3) after OR-ing in a power of two;
  8-bit: byte b holds input b of the lane's run.
  Code books read in shared memory (``natural``) keep the canonical order instead: byte b holds
  inputs 2b (low nibble) and 2b + 1, so each byte is one pair-table index.
Columns are padded to a multiple of 64 and inputs to a multiple of KC with code 0; the kernel
zero-fills x past K, so padding contributes nothing.

Group parameters are stored transposed, [groups, Npad], already biased for the dequantizer:
zb = 1024 + z (fp16), 128 + z (bf16, 4-bit) or 2176 + z (bf16, 8-bit: a byte read as two nibbles
at 128 and 2048, kept in fp32).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

#: inputs per chunk: one 16-byte load per lane covers this many k for 8 columns
KC = {4: 128, 8: 64}
#: columns are padded to this, so a block of up to 8 n8 tiles never runs past the end
N_ALIGN = 64
#: rows repacked at a time, which bounds the extra memory while loading
ROW_SLICE = 4096
#: n8 tiles stored side by side per chunk: a block's warp reads TG * 512 contiguous bytes per
#: chunk and walks K through one contiguous run (scattered 512-byte reads cost DRAM efficiency)
TG = 4


@functools.cache
def lane_k(bits: int, natural: bool = False) -> torch.Tensor:
    """int64 [32 lanes, 16 bytes, 8 // bits codes]: the (row g, input k) of each code, as g * KC + k
    (``natural``: 4-bit codes in the canonical order, byte b = inputs 2b, 2b + 1 of the run).
    Cached (a constant built in Python loops); callers must not write into it."""
    kc = KC[bits]
    run = kc // 4  # consecutive inputs per lane
    idx = torch.empty(32, 16, 8 // bits, dtype=torch.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for byte in range(16):
            if bits == 4:
                j, i = divmod(byte, 4)  # word j, byte i of that word
                for nib in range(2):
                    u = 2 * i + nib  # nibble slot in the word
                    k = 2 * byte + nib if natural else 8 * j + 2 * (u % 4) + u // 4
                    idx[lane, byte, nib] = g * kc + t * run + k
            else:
                idx[lane, byte, 0] = g * kc + t * run + byte
    return idx


def codes_rows(qweight: torch.Tensor, bits: int, K: int, rows: slice) -> torch.Tensor:
    """Unsigned codes uint8 [rows, K] from the canonical packing (4-bit: low nibble = even k)."""
    q = qweight[rows]
    if bits == 8:
        return q[:, :K]
    return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(q.shape[0], -1)[:, :K]


def repack_codes(
    qweight: torch.Tensor, bits: int, N: int, K: int, perm: torch.Tensor | None = None, natural: bool = False
) -> torch.Tensor:
    """Canonical codes -> uint8 [Npad/8/TG, chunks, TG, 32, 16] in the kernel's lane order
    (``natural``: see :func:`lane_k`).

    The 16 bytes of n8 tile T, chunk c, lane l sit at [T // TG, c, T % TG, l].
    """
    kc = KC[bits]
    chunks = -(-K // kc)
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    idx = lane_k(bits, natural).to(qweight.device).reshape(-1)
    out = torch.zeros(n_pad // 8, chunks, 32, 16, dtype=torch.uint8, device=qweight.device)
    for r0 in range(0, N, ROW_SLICE):
        r1 = min(N, r0 + ROW_SLICE)
        c = codes_rows(qweight, bits, K, slice(r0, r1))
        if perm is not None:
            c = c[:, perm]
        rows = -(-(r1 - r0) // 8) * 8
        block = torch.zeros(rows, chunks * kc, dtype=torch.uint8, device=qweight.device)
        block[: r1 - r0, :K] = c
        tiles = block.view(rows // 8, 8, chunks, kc).permute(0, 2, 1, 3).reshape(rows // 8, chunks, 8 * kc)
        picked = tiles[:, :, idx].view(rows // 8, chunks, 32, 16, 8 // bits)
        if bits == 4:
            picked = picked[..., 0] | (picked[..., 1] << 4)
        else:
            picked = picked[..., 0]
        out[r0 // 8 : r0 // 8 + rows // 8] = picked
    return out.view(n_pad // 8 // TG, TG, chunks, 32, 16).transpose(1, 2).contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, N: int, K: int, natural: bool = False) -> torch.Tensor:
    """The inverse of ``repack_codes`` (without the permutation): uint8 [N, K]. For tests and tools."""
    kc = KC[bits]
    packed = tile_major(packed)
    tiles, chunks = packed.shape[:2]
    idx = lane_k(bits, natural).to(packed.device).reshape(-1)
    if bits == 4:
        vals = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(tiles, chunks, -1)
    else:
        vals = packed.reshape(tiles, chunks, -1)
    flat = torch.empty(tiles, chunks, 8 * kc, dtype=torch.uint8, device=packed.device)
    flat[:, :, idx] = vals
    full = flat.view(tiles, chunks, 8, kc).permute(0, 2, 1, 3).reshape(tiles * 8, chunks * kc)
    return full[:N, :K]


def tile_major(packed: torch.Tensor) -> torch.Tensor:
    """[Npad/8/TG, chunks, TG, 32, 16] -> [Npad/8, chunks, 32, 16] (one n8 tile per row)."""
    groups, chunks = packed.shape[:2]
    return packed.transpose(1, 2).reshape(groups * TG, chunks, 32, 16)


@dataclass(frozen=True)
class GroupParams:
    """Scales and biased zeros as the kernel reads them."""

    sz: torch.Tensor  # [groups, Npad]: int32 words (zb, s halves) or fp32 pairs [groups, Npad, 2]
    group: int  # the group length in inputs (padded K per channel): input k uses group k // group


def magic(bits: int, act: torch.dtype) -> float:
    """The power of two the dequantizer ORs a code into (its exponent leaves the code in the mantissa)."""
    if act == torch.float16:
        return 1024.0
    return 128.0 if bits == 4 else 2176.0  # bf16 8-bit: 128 + 2048, a byte as two nibbles


def group_params(
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    K: int,
    group: int | None,
    act: torch.dtype,
) -> GroupParams:
    """Canonical scales [N, K/G] or [N, 1] (fp32) and zeros (int16, None if symmetric) -> [groups, Npad].

    Symmetric weights get the pair too (zero 2^(b-1)): one 4-byte asynchronous copy per group
    and column serves both kinds.
    """
    kc = KC[bits]
    chunks = -(-K // kc)
    N = scales.shape[0]
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    if group is None:  # per channel: one group spanning the padded K
        g_len, n_groups = chunks * kc, 1
    else:
        g_len, n_groups = group, -(-(chunks * kc) // group)
    base = magic(bits, act)
    wide = bits == 8 and act == torch.bfloat16  # bf16 cannot hold 2176 + z: keep fp32
    store = torch.float32 if wide else act
    s = torch.zeros(n_groups, n_pad, dtype=torch.float32, device=scales.device)
    s[: scales.shape[1], :N] = scales.to(torch.float32).t()
    zb = torch.full(
        (n_groups, n_pad), base + float(1 << (bits - 1)), dtype=torch.float32, device=scales.device
    )
    if zeros is not None:
        zb[: zeros.shape[1], :N] = base + zeros.to(torch.float32).t()
    pair = torch.stack((zb.to(store), s.to(store)), dim=-1).contiguous()
    if not wide:
        pair = pair.view(torch.int32).squeeze(-1)
    return GroupParams(pair, g_len)


def wgmma_x_order(x: torch.Tensor, bits: int, chunks: int) -> torch.Tensor:
    """x [M, K] rearranged for the wgmma kernel (``kernels/wna16_wgmma.cu``), [M, chunks*KC].

    Lane t of k16 tile kt multiplies inputs t*KC/4 + 4kt + 2h + e (h, e in {0, 1}) of a chunk
    (see ``lane_k``), and wgmma reads its shared-memory operand in the canonical order k = 8h +
    2t + e, so position kt*16 + 8h + 2t + e of each chunk takes that input. Inputs past K are zero.
    """
    kc = KC[bits]
    M, K = x.shape
    if K != chunks * kc:
        x = torch.nn.functional.pad(x, (0, chunks * kc - K))
    tiles = kc // 16
    return x.reshape(M, chunks, 4, tiles, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(M, chunks * kc)
