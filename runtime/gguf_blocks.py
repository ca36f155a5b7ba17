"""Fields of llama.cpp's blocks: the fp16 scalars (d, dmin, m) at their byte offsets, Q4_K/Q5_K's
6-bit sub-block scales and mins, Q3_K's 6-bit signed scales.

A layout of its own, as :mod:`quantrt.packing` is, shared by the reference dequantizers
(``reference/gguf.py``) and the kernels that lay the fields out for their decode
(``backends/cuda/mma_gguf.py``), so both read the same bytes the same way.
"""

from __future__ import annotations

import torch


def f16_field(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian fp16 at byte ``at`` of each block (``blocks`` [..., bytes]) as fp32 [..., 1]."""
    return blocks[..., at : at + 2].contiguous().view(torch.float16).to(torch.float32)


def k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes [M, 12] -> 8 six-bit scales and 8 six-bit mins, each [M, 8] uint8."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0xF) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    """Q3_K: 12 bytes [M, 12] -> 16 signed 6-bit scales [M, 16] int16 (the stored value minus 32):
    the low nibbles of bytes 0-7 (scales 0-7, then 8-15 from the high nibbles), the top two bits
    from bytes 8-11, two per scale."""
    shifts4 = torch.tensor([0, 4], dtype=torch.uint8, device=s.device).view(2, 1)
    shifts2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=s.device).view(4, 1)
    low = ((s[:, None, :8] >> shifts4) & 0xF).reshape(-1, 16)
    high = ((s[:, None, 8:12] >> shifts2) & 3).reshape(-1, 16)
    return (low | (high << 4)).to(torch.int16) - 32
