"""The two cache operations and who runs them: quantize-on-write, and decode attention that reads
the quantized pages directly.

Backends register :class:`KVKernels` per device kind (``registry().register_kv``); a cache picks
the first whose ``supports`` says yes when it is built (``QUANTRT_KV_BACKEND=<name>`` puts one
first, ``torch`` forces the torch path) and keeps every answer for ``explain``. On CUDA the Triton
kernels quantize in registers and scatter into the slots, and decode is split-K flash decoding
that dequantizes each page in registers, so no 16-bit copy of the cache ever exists. The torch
kernels here run everywhere: the write is the reference codec, decode walks the pages a chunk at a
time (one chunk dequantized at once, never the whole context).

Decode semantics, shared by every path and by :func:`quantrt.kv.attention_reference`: query ``b``
sits at position ``seq_lens[b] - 1`` and attends keys ``t < seq_lens[b]`` with ``mask[b, t]``
(when given) and ``t > pos - window`` (when ``window``); logits are ``scale * q.k``, then
``softcap * tanh(logit / softcap)`` (when ``softcap``); ``sinks[h]`` (when given) is one more
logit in head ``h``'s softmax that contributes no value.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch

from ..kernels import Verdict
from ..schemes import KVScheme
from .pages import decode, encode, gather

if TYPE_CHECKING:
    from .pages import KVPages

#: tokens dequantized at once by the torch decode path
TORCH_CHUNK = 1024


class KVKernels(ABC):
    """One backend's KV-cache kernels: quantize-on-write and decode attention over pages."""

    name: ClassVar[str]

    @abstractmethod
    def supports(
        self, scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> Verdict:
        """Whether these kernels serve a cache of this scheme, head_dim, dtype and device."""

    @abstractmethod
    def write(self, pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Quantize keys and values [N, H, D] into ``pages`` at ``slots`` [N] (negative: skipped)."""

    @abstractmethod
    def decode(
        self,
        q: torch.Tensor,
        pages: KVPages,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        max_len: int,
        *,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One query token per sequence, q [B, Hq, D] -> [B, Hq, D] in q's dtype, over each
        sequence's block-table row (lengths ``seq_lens`` [B] int32 on q's device, at most
        ``max_len``; ``mask`` [B, >= max_len] bool)."""


class TorchKV(KVKernels):
    """The torch path: the reference codec on write, chunked online-softmax decode."""

    name = "torch"

    def supports(
        self, scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> Verdict:
        return Verdict.yes("every device, the reference codec")

    def write(self, pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        slots = slots.to(device=pages.device, dtype=torch.long).reshape(-1)
        keep = slots >= 0
        if not bool(keep.all()):
            k, v, slots = k[keep], v[keep], slots[keep]
        planes = encode(pages.scheme, k, v, pages.k_scale, pages.v_scale)
        for name, dst in pages.flat().items():
            src = planes[name].to(dst.dtype)
            if dst.dtype.is_floating_point and dst.element_size() == 1:  # fp8: copied as bytes
                dst, src = dst.view(torch.uint8), src.view(torch.uint8)
            dst.index_copy_(0, slots, src)

    def decode(self, q, pages, block_table, seq_lens, max_len, **kw):  # type: ignore[no-untyped-def]
        return torch_decode_attention(q, pages, block_table, seq_lens, max_len, **kw)


def select_kv(
    scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[KVKernels, list[tuple[str, Verdict]]]:
    """The kernels a cache runs on, and every candidate's verdict (the torch path last)."""
    from ..kernels import registry

    cands: list[KVKernels] = [*registry().kv.get(device.type, []), TorchKV()]
    want = os.environ.get("QUANTRT_KV_BACKEND", "").strip().lower()
    if want:
        named = [c for c in cands if want in (c.name, c.name.rsplit(".", 1)[-1])]  # "triton": any vendor's
        if not named:
            from .pages import KVCacheError

            raise KVCacheError(
                f"QUANTRT_KV_BACKEND={want!r}: no such KV kernels on {device.type}; "
                f"known: {', '.join(c.name for c in cands)}"
            )
        cands = named + [c for c in cands if c not in named]
    verdicts = [(c.name, c.supports(scheme, head_dim, dtype, device)) for c in cands]
    chosen = next(c for c, (_, v) in zip(cands, verdicts, strict=True) if v.ok)
    return chosen, verdicts


def write_kv(pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize keys and values [N, H, D] into ``pages`` at ``slots`` [N] (negative: skipped)."""
    if k.shape[0]:
        pages.kernels.write(pages, k, v, slots)


def decode_attention(
    q: torch.Tensor,
    pages: KVPages,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    *,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over the cache's pages by the kernels the cache chose (see :class:`KVKernels`)."""
    return pages.kernels.decode(
        q, pages, block_table, seq_lens, max_len,
        scale=scale, window=window, softcap=softcap, sinks=sinks, mask=mask,
    )  # fmt: skip


def torch_decode_attention(
    q: torch.Tensor,
    pages: KVPages,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    *,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    chunk: int = TORCH_CHUNK,
) -> torch.Tensor:
    """Decode attention in torch, ``chunk`` tokens dequantized at a time (online softmax)."""
    B, Hq, D = q.shape
    H = pages.num_kv_heads
    G = Hq // H
    bs = pages.block_size
    qf = q.float().view(B, H, G, D)
    lens = seq_lens.to(device=q.device, dtype=torch.long).view(B, 1)
    pos = lens - 1
    m = torch.full((B, H, G), -torch.inf, device=q.device)
    denom = torch.zeros(B, H, G, device=q.device)
    acc = torch.zeros(B, H, G, D, device=q.device)
    flat = pages.flat()
    chunk = max(bs, chunk // bs * bs)
    for t0 in range(0, max_len, chunk):
        t1 = min(max_len, t0 + chunk)
        t = torch.arange(t0, t1, device=q.device)
        blocks = block_table[:, t0 // bs : -(-t1 // bs)].long()
        slots = (blocks[:, :, None] * bs + torch.arange(bs, device=q.device)).flatten(1)
        slots = slots[:, : t1 - t0].clamp(0, pages.num_blocks * bs - 1)
        k, v = decode(pages.scheme, gather(flat, slots), D, pages.k_scale, pages.v_scale)
        s = torch.einsum("bhgd,bthd->bhgt", qf, k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        ok = t[None, :] < lens
        if window:
            ok = ok & (t[None, :] > pos - window)
        if mask is not None:
            ok = ok & mask[:, t0:t1].to(torch.bool)
        s = s.masked_fill(~ok[:, None, None, :], -torch.inf)
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isfinite(m_new), m_new, 0.0)
        p = torch.exp(s - safe[..., None])
        corr = torch.exp(torch.where(torch.isfinite(m), m - safe, -torch.inf))
        denom = denom * corr + p.sum(-1)
        acc = acc * corr[..., None] + torch.einsum("bhgt,bthd->bhgd", p, v)
        m = m_new
    if sinks is not None:
        sk = sinks.float().view(1, H, G)
        m_new = torch.maximum(m, sk)
        corr = torch.exp(torch.where(torch.isfinite(m), m - m_new, -torch.inf))
        denom = denom * corr + torch.exp(sk - m_new)
        acc = acc * corr[..., None]
    out = acc / denom.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return out.reshape(B, Hq, D).to(q.dtype)
