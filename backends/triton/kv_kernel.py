"""The KV cache on GPUs: the portable Triton kernels of ``backends/triton/kv.py`` for every KV scheme
(unquantized, fp8/int8 with tensor, head, token or group scales, TurboQuant), one instance per
vendor, whose policy says which devices it runs on.

``write`` quantizes in registers and scatters into the pages' slots (codes equal to the torch
codec's); ``decode`` is split-K flash decoding over the block table that dequantizes each tile in
registers, so no 16-bit copy of the cache is ever made. Neither synchronises with the host, so a
decode step captures into a CUDA graph (the first call of a TurboQuant cache copies its code book
to the device: make it before capturing). Launch shapes: ``backends/triton/kv.decode_config``.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch

from quantrt.kernels import Verdict
from quantrt.kv.kernels import KVKernels
from quantrt.reference.turboquant import codebook, rotation
from quantrt.schemes import KVScheme, TurboQuantScheme

from .vendor import VendorPolicy

if TYPE_CHECKING:
    from quantrt.kv.pages import KVPages

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: head_dim bounds of the decode tiles (16: the dot's depth; 256: registers)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


class TritonKV(KVKernels):
    """Quantize-on-write and split-K decode attention in Triton, every KV scheme, on the devices
    ``policy`` runs on (``name``: how caches and ``QUANTRT_KV_BACKEND`` call it)."""

    def __init__(self, policy: VendorPolicy, name: str) -> None:
        self.policy, self.name = policy, name
        self._tables: dict[tuple[Any, ...], Any] = {}
        self._decoders: Any = None  # the vendor's, asked at the first decode (it imports Triton)
        self._asked = False
        self._sync: tuple[torch.device, Any] | None = None  # (device, the vendor's grid sync there)

    def supports(
        self, scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> Verdict:
        v = self.policy.runs_on(device)
        if not v.ok:
            return v
        if importlib.util.find_spec("triton") is None:
            return Verdict.no("triton importable (it builds the kernels)")
        if dtype not in _DTYPES:
            return Verdict.no("a float16, bfloat16 or float32 cache", dtype=dtype)
        if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
            return Verdict.no(
                f"{MIN_HEAD_DIM} <= head_dim <= {MAX_HEAD_DIM}",
                note="the dot's depth and the tiles' registers",
                head_dim=head_dim,
            )
        return Verdict.yes("Triton: quantize in registers, split-K decode over the pages")

    def tables(self, pages: KVPages) -> Any:
        """TurboQuant's code book and rotation signs on the cache's device (None for other schemes),
        made once per (device, head_dim, key bits)."""
        s = pages.scheme
        if not isinstance(s, TurboQuantScheme) or s.key_bits == 8:
            return None
        key = (pages.device, pages.head_dim, s.key_bits)
        t = self._tables.get(key)
        if t is None:
            from .kv import TQTables

            centroids, bounds = codebook(pages.head_dim, s.key_bits)
            signs = torch.sign(rotation(pages.head_dim)[:, 0])
            t = self._tables[key] = TQTables(
                centroids.to(pages.device), bounds.to(pages.device), signs.to(pages.device)
            )
        return t

    def write(self, pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        from .kv import write_kv

        slots = slots.to(device=pages.device).reshape(-1)
        write_kv(
            pages.scheme, pages.flat(), k, v, slots.contiguous(),
            k_scale=pages.k_scale, v_scale=pages.v_scale, tables=self.tables(pages),
        )  # fmt: skip

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
        from .kv import decode_kv

        return decode_kv(
            q, pages.scheme, pages.flat(), pages.block_size, block_table, seq_lens, max_len,
            scale=scale, window=window, softcap=softcap, sinks=sinks, mask=mask,
            k_scale=pages.k_scale, v_scale=pages.v_scale, tables=self.tables(pages),
            decoders=self._vendor_decoders(), grid_sync=self.grid_sync(q.device),
        )  # fmt: skip

    def grid_sync(self, device: torch.device) -> Any:
        """The vendor's (signal, wait) that let a split combine launch before its decode ends on
        ``device`` (asked once per device), or None."""
        if self._sync is None or self._sync[0] != device:
            self._sync = (device, self.policy.kv_grid_sync(device) if device.type != "cpu" else None)
        return self._sync[1]

    def _vendor_decoders(self) -> Any:
        if not self._asked:
            self._decoders, self._asked = self.policy.kv_decoders(), True
        return self._decoders
