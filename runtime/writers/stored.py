"""What several writers store alike: the error for a weight a format cannot hold exactly, scales
cast to the format's dtype only where that is exact, and canonical code bytes re-read as int32
words along K (compressed-tensors' ``weight_packed``, GPTQ's ``qweight`` before its transpose)."""

from __future__ import annotations

import torch

from ..errors import CheckpointError

SCALE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class WriterError(CheckpointError):
    """A weight this format cannot hold exactly."""


def exact_scales(
    t: torch.Tensor, scale_dtype: str, what: str, allowed: tuple[str, ...] = tuple(SCALE_DTYPES)
) -> torch.Tensor:
    """``t`` in ``scale_dtype``, refused unless every value survives the cast unchanged."""
    if scale_dtype not in allowed:
        raise WriterError(f"{what}: scales stored as {scale_dtype} have no place here ({', '.join(allowed)})")
    out = t.to(SCALE_DTYPES[scale_dtype])
    if not torch.equal(out.float(), t.float()):
        raise WriterError(f"{what}: the scales are not exact in {scale_dtype}")
    return out.contiguous()


def words_along_k(q: torch.Tensor) -> torch.Tensor:
    """Canonical code bytes uint8 [N, bytes] as little-endian int32 words [N, words], zero-padded."""
    words = -(-q.shape[-1] // 4)
    padded = torch.zeros(q.shape[0], 4 * words, dtype=torch.uint8, device=q.device)
    padded[:, : q.shape[-1]] = q
    return padded.view(torch.int32)
