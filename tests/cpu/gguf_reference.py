"""The independent reference of the native GGUF kernels (cpu.native_gguf on x86, its NEON build under
qemu): llama.cpp's activation blocks, written here from llama.cpp's definitions, and gguf-py's
dequantizer with the f16 fields split off, so that every block's dot product is an exact integer
times its scales, in float64."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

from quantrt.reference.gguf import F16_FIELDS
from quantrt.schemes import GGUF_TYPES


def quantize_acts(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's activation blocks with fp32 scales: codes [M, K] and scales [M, K/block], float64."""
    M, K = x.shape
    xb = x.to(torch.float32).reshape(M, K // block, block)

    def div(a: float, b: torch.Tensor) -> torch.Tensor:  # C's a / b: torch's `a / b` is a * (1 / b)
        return torch.full_like(b, a) / b

    if block == 32:  # quantize_row_q8_0
        d = xb.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), div(1.0, d))
        q = torch.round(xb * inv).clamp(max=127)
    else:  # quantize_row_q8_K_ref: the first element of largest magnitude sets the sign
        mx = xb.gather(-1, xb.abs().argmax(-1, keepdim=True))
        zero = mx == 0
        iscale = div(-127.0, torch.where(zero, torch.ones_like(mx), mx))
        q = torch.where(zero, torch.zeros_like(xb), torch.round(iscale * xb).clamp(max=127))
        d = torch.where(zero, torch.zeros_like(mx), div(1.0, iscale))
    return q.reshape(M, K).double(), d.squeeze(-1).double()


def exact_weight(qweight: torch.Tensor, gtype: str) -> np.ndarray:
    """float64 [N, K] without rounding: sum over the f16 fields f of f * (the block decoded with that
    field 1 and the others 0), each decoded part being integer codes times integer scales."""
    B, T, _ = GGUF_TYPES[gtype]
    N = qweight.shape[0]
    blocks = qweight.numpy().reshape(N, -1, T)
    offs = F16_FIELDS[gtype]
    total = np.zeros((N, blocks.shape[1], B))
    for i, off in enumerate(offs):
        unit = blocks.copy()
        for j, o in enumerate(offs):
            unit[..., o : o + 2] = np.array([1.0 if i == j else 0.0], "<f2").view(np.uint8)
        part = gguf_dequantize(unit.reshape(N, -1), GT[gtype.upper()]).reshape(N, -1, B).astype(np.float64)
        field = blocks[..., off : off + 2].copy().view("<f2")[..., 0].astype(np.float64)
        total += field[..., None] * part
    return total.reshape(N, -1)


def integer_reference(x: torch.Tensor, qweight: torch.Tensor, gtype: str, bias: torch.Tensor | None = None):
    block = 256 if gtype.endswith("_k") else 32
    q, d = quantize_acts(x, block)
    xdq = (q.reshape(q.shape[0], -1, block) * d.unsqueeze(-1)).reshape(q.shape)
    y = xdq @ torch.from_numpy(exact_weight(qweight, gtype)).T
    return y if bias is None else y + bias.double()
