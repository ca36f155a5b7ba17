"""The weight layout the tensor-core W4A16/W8A16 kernel (``kernels/wna16_mma.cu``) reads.

mma.sync m16n8k16 gives each lane (g = lane // 4, t = lane % 4) of a warp a fixed piece of the
16x8 B tile: column g, inputs 2t, 2t+1 (register b0) and 2t+8, 2t+9 (b1). The repack puts, for
every 8 output columns and every chunk of KC inputs (128 at 4 bits, 64 at 8), exactly the codes a
lane needs into its own 16 bytes, lanes in order: one coalesced 512-byte load per warp feeds 8
(4-bit) or 4 (8-bit) k16 tiles, with no shuffles and no shared memory.

Inside a lane's 16 bytes, 32-bit word j holds:
  4-bit: k16 tiles 2j and 2j+1, nibble slot u (bits 4u..4u+3) = tile 2j + (u%4)//2, input
         2t + u//4 + 8*(u%2): slots u and u+4 are one fp16/bf16 pair after ``(w >> 4s) & 0x000F000F``;
  8-bit: k16 tile j, bytes (2t, 2t+1, 2t+8, 2t+9).
Columns are padded to a multiple of 64 and inputs to a multiple of KC with code 0; padded scales
are 0, so padding contributes nothing (the kernel also never reads x past K).

Group parameters are stored transposed, [groups, Npad], already biased for the dequantizer:
zb = 1024 + z (fp16), 128 + z (bf16, 4-bit) or 2^23 + z (bf16, 8-bit, kept in fp32).
"""

from __future__ import annotations

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


def lane_k(bits: int) -> torch.Tensor:
    """int64 [32 lanes, 16 bytes, 8 // bits codes]: the (row g, input k) of each code, as g * KC + k."""
    kc = KC[bits]
    idx = torch.empty(32, 16, 8 // bits, dtype=torch.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for byte in range(16):
            j, i = divmod(byte, 4)  # word j, byte i of that word
            if bits == 4:
                for nib in range(2):
                    u = 2 * i + nib  # nibble slot in the word
                    kt = 2 * j + (u % 4) // 2
                    k = kt * 16 + 2 * t + u // 4 + 8 * (u % 2)
                    idx[lane, byte, nib] = g * kc + k
            else:
                k = j * 16 + 2 * t + i % 2 + 8 * (i // 2)
                idx[lane, byte, 0] = g * kc + k
    return idx


def codes_rows(qweight: torch.Tensor, bits: int, K: int, rows: slice) -> torch.Tensor:
    """Unsigned codes uint8 [rows, K] from the canonical packing (4-bit: low nibble = even k)."""
    q = qweight[rows]
    if bits == 8:
        return q[:, :K]
    return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(q.shape[0], -1)[:, :K]


def repack_codes(
    qweight: torch.Tensor, bits: int, N: int, K: int, perm: torch.Tensor | None = None
) -> torch.Tensor:
    """Canonical codes -> uint8 [Npad/8/TG, chunks, TG, 32, 16] in the kernel's lane order.

    The 16 bytes of n8 tile T, chunk c, lane l sit at [T // TG, c, T % TG, l].
    """
    kc = KC[bits]
    chunks = -(-K // kc)
    n_pad = -(-N // N_ALIGN) * N_ALIGN
    idx = lane_k(bits).to(qweight.device).reshape(-1)
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


def unpack_codes(packed: torch.Tensor, bits: int, N: int, K: int) -> torch.Tensor:
    """The inverse of ``repack_codes`` (without the permutation): uint8 [N, K]. For tests and tools."""
    kc = KC[bits]
    packed = tile_major(packed)
    tiles, chunks = packed.shape[:2]
    idx = lane_k(bits).to(packed.device).reshape(-1)
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
    group: int  # the group length in inputs the kernel divides by


def magic(bits: int, act: torch.dtype) -> float:
    """The power of two the dequantizer ORs a code into (its exponent leaves the code in the mantissa)."""
    if act == torch.float16:
        return 1024.0
    return 128.0 if bits == 4 else float(1 << 23)


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
    wide = bits == 8 and act == torch.bfloat16  # bf16 cannot hold 2^23 + z: keep fp32
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
