"""Helpers shared by the GGUF Triton kernel tests (test_gguf_triton.py, test_gguf_gemm.py): fresh
seeds, sub-block scale overwrites, gguf-py's dequantizer as the independent reference, the error
measure, planes on the test device, and the llama.cpp-written fixture tensors per type."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

from quantrt.backends.triton.gguf import gguf_planes
from quantrt.reference.gguf import BLOCK, F16_FIELDS, SCALE_FIELDS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def legacy(gtype: str) -> bool:
    return BLOCK[gtype][0] == 32


def set_scales(q: torch.Tensor, gtype: str, values: torch.Tensor | int) -> torch.Tensor:
    """Overwrite the sub-block scale bytes of every block."""
    T = BLOCK[gtype][1]
    off, size = SCALE_FIELDS[gtype]
    out = q.clone()
    out.view(q.shape[0], -1, T)[:, :, off : off + size] = values
    return out


def typical_d(q: torch.Tensor, gtype: str, row: int, element: int) -> torch.Tensor:
    """``q`` with the block scale d of (row, element) set to 2^-7, the size of random_blocks' draws:
    a draw near 0 would let a flipped code there move its weight by less than a test's tolerance."""
    B, T = BLOCK[gtype]
    at = element // B * T + F16_FIELDS[gtype][0]
    out = q.clone()
    out[row, at : at + 2] = torch.tensor([2.0**-7], dtype=torch.float16).view(torch.uint8)
    return out


def dense(q: torch.Tensor, gtype: str) -> torch.Tensor:
    """gguf-py's fp32 dequantization of uint8 [N, bytes] -> [N, K]."""
    w = gguf_dequantize(q.cpu().numpy(), GT[gtype.upper()])
    return torch.from_numpy(np.ascontiguousarray(w)).reshape(q.shape[0], -1)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double().cpu()
    return float((y.double().cpu() - ref).norm() / ref.norm())


def planes_of(q: torch.Tensor, gtype: str, K: int) -> dict[str, torch.Tensor]:
    return gguf_planes(q.to(DEV), gtype, q.shape[0], K)


def fixture_rows(types: tuple[str, ...] | dict) -> list[tuple[str, str]]:
    """(file, tensor) of each of ``types`` in each llama.cpp file, one tensor per type and file."""
    out = []
    for path in sorted(FIXTURES.glob("*.gguf")):
        seen = set()
        for t in gguf.GGUFReader(path).tensors:
            gtype = t.tensor_type.name.lower()
            if gtype in types and gtype not in seen:
                seen.add(gtype)
                out.append((path.name, t.name))
    return out
