"""Decode attention over a 4-bit TurboQuant cache (4-bit rotated keys, 4-bit values: ``4bit_nc``
and its norm-uncorrected twin) as a CUDA C++ kernel, ``kernels/kv_tq_decode.cu`` (``cuda.mma``).

Why not the portable Triton kernel: at 4 bits a step is bound by the instructions that decode the
codes, not by the bytes, and Triton's layout of the two dots (a shared-memory pipeline, a barrier
per tile, four warps on one tile) leaves the loop at about twice the bytes' time. Here each warp
walks its own 16-token steps with its own online softmax (no barrier in the loop), keys decode
straight into mma.sync A fragments (the channel order is the thread's own: the score is a sum),
values are exact fp16 subnormals masked in place (one ``lop3`` per pair of codes), and four
programs fit per SM. The file's header comment has the layout.

Everything else stays with the portable kernels (``backends/triton/kv_kernel.TritonKV``): the
write, other schemes, masks, fp32 queries, GQA groups over 8, and calls too small for this
kernel's fixed cost (``takes``). Splits are merged by the portable
combine kernel, launched early on sm_90 (the decode signals at its start).
"""

from __future__ import annotations

import importlib.util
import struct
import weakref
from typing import TYPE_CHECKING, Any

import torch

from quantrt.kernels import Verdict
from quantrt.kv.kernels import KVKernels
from quantrt.schemes import KVScheme, TurboQuantScheme

from .policy import CUDA

if TYPE_CHECKING:
    from quantrt.backends.triton.kv_kernel import TritonKV
    from quantrt.kv.pages import KVPages

SOURCE = "kv_tq_decode.cu"
HEAD_DIMS = (64, 128, 256)
#: query heads per KV head one program serves (the score mma's N)
MAX_GROUP = 8
#: programs per SM a launch fills (head_dim <= 128: four fit by registers; 256: two)
PROGRAMS_PER_SM = {64: 4, 128: 4, 256: 2}
#: the combine merges up to this many splits in one round (backends/triton/kv.MERGE_SPLITS)
MAX_SPLITS = 64
#: a split walks at least this many tokens (four warps, two 16-token steps each)
MIN_SPLIT_TOKENS = 128
#: calls over fewer (sequence, KV head, token) triples than this go to the Triton kernel: its fixed
#: cost per launch is lower, so it is faster on short contexts at small batches (H100,
#: docs/performance.md "KV cache, fourth pass": Triton leads at 1k batch 16, 2^17 triples; at 8k
#: batch 1, 2^16, the two tie)
MIN_TOKEN_HEADS = 1 << 18
ARGS = 39
#: the kernel's WARPS and STEPS_AHEAD (tests read them from the source)
WARPS, STEPS_AHEAD = 4, 2
_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16)


def _f32_bits(x: float) -> int:
    """An fp32's bit pattern as an int (floats travel to the kernel as int64 arguments)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def key_tables(bits: tuple[int, ...]) -> tuple[int, int] | None:
    """The kernel's byte tables of a 16-entry fp16 code book (bit patterns ``bits``): (low bytes,
    high bytes) of the magnitudes ``c[8..15]``, eight bytes each packed little-endian into an
    int64; None unless the book is symmetric (``c[15 - i] = -c[i]``, ``c[8..15] >= +0``), as
    every TurboQuant book is."""
    if len(bits) != 16 or any(bits[15 - i] != bits[i] ^ 0x8000 for i in range(16)):
        return None
    mag = bits[8:]
    if any(b >= 0x8000 for b in mag):
        return None
    lo = sum((b & 0xFF) << (8 * k) for k, b in enumerate(mag))
    hi = sum((b >> 8) << (8 * k) for k, b in enumerate(mag))
    return lo, hi


def num_splits(batch: int, num_kv_heads: int, max_len: int, head_dim: int, sms: int) -> int:
    """Splits of the context: enough programs to fill ``PROGRAMS_PER_SM`` per SM, each split at
    least ``MIN_SPLIT_TOKENS`` long, at most the combine's one round."""
    fit = (PROGRAMS_PER_SM[head_dim] * sms) // max(1, batch * num_kv_heads)
    return max(1, min(MAX_SPLITS, fit, -(-max(max_len, 1) // MIN_SPLIT_TOKENS)))


def shared_bytes(head_dim: int) -> int:
    """A program's dynamic shared memory: each warp's ring of STEPS_AHEAD + 1 stages (a stage holds
    each lane's two key rows and four value rows, head_dim / 2 bytes a lane), or the merge's rows
    that reuse it after the loop, whichever is larger."""
    rings = WARPS * (STEPS_AHEAD + 1) * 32 * (head_dim // 2)
    rows = WARPS * (head_dim // 4) * 33 * 4
    return max(rings, rows)


def takes(batch: int, num_kv_heads: int, max_len: int) -> bool:
    """Whether a call is big enough for this kernel (host ints only: the answer is fixed for a
    CUDA graph, whose max_len is its capacity)."""
    return batch * num_kv_heads * max_len >= MIN_TOKEN_HEADS


def expression(head_dim: int, bf16: bool, bt64: bool, paged: bool) -> str:
    b = lambda x: "true" if x else "false"  # noqa: E731
    return f"tq4_decode<{head_dim}, {b(bf16)}, {b(bt64)}, {b(paged)}>"


class CudaKV(KVKernels):
    """4-bit TurboQuant decode on mma.sync (sm_80+), the portable kernels for the rest."""

    name = "cuda.mma"

    def __init__(self, portable: TritonKV) -> None:
        self.portable = portable
        self._launch: dict[tuple[int, str], Any] = {}
        self._books: dict[tuple[Any, ...], tuple[int, int] | None] = {}
        self._fit: weakref.WeakKeyDictionary[KVPages, bool] = weakref.WeakKeyDictionary()

    def supports(
        self, scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> Verdict:
        v = CUDA.runs_on(device)
        if not v.ok:
            return v
        if not (isinstance(scheme, TurboQuantScheme) and scheme.key_bits == 4 and scheme.value_bits == 4):
            return Verdict.no("TurboQuant with 4-bit keys and values (4bit_nc)", scheme=str(scheme))
        if head_dim not in HEAD_DIMS:
            return Verdict.no(f"head_dim in {HEAD_DIMS}", head_dim=head_dim)
        if dtype not in _DTYPES:
            return Verdict.no("a float16 or bfloat16 cache", dtype=dtype)
        if importlib.util.find_spec("cupy") is None:
            return Verdict.no("cupy importable (it compiles the kernel)")
        w = self.portable.supports(scheme, head_dim, dtype, device)
        if not w.ok:
            return Verdict.no("the portable kernels (they write the pages)", why=w.reason)
        return Verdict.yes("CUDA C++: 4-bit TurboQuant decode on mma.sync; Triton writes")

    def write(self, pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        self.portable.write(pages, k, v, slots)

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
        book = self._book(pages)
        B, Hq = q.shape[0], q.shape[1]
        H = pages.num_kv_heads
        if (
            book is None
            or not takes(B, H, max_len)
            or mask is not None
            or q.dtype not in _DTYPES
            or Hq % H
            or Hq // H > MAX_GROUP
            or block_table.dtype not in (torch.int32, torch.int64)
            or seq_lens.dtype != torch.int32
            or not self._planes_fit(pages)
        ):
            return self.portable.decode(
                q, pages, block_table, seq_lens, max_len,
                scale=scale, window=window, softcap=softcap, sinks=sinks, mask=mask,
            )  # fmt: skip
        return self._decode(
            q, pages, pages.flat(), book, block_table, seq_lens, max_len, scale, window, softcap, sinks
        )

    def _planes_fit(self, pages: KVPages) -> bool:
        """:func:`planes_fit` of the pages, asked once per cache (its planes never move)."""
        ok = self._fit.get(pages)
        if ok is None:
            ok = self._fit[pages] = planes_fit(pages.flat())
        return ok

    def _book(self, pages: KVPages) -> tuple[int, int] | None:
        key = (pages.device, pages.head_dim)
        if key not in self._books:
            self._books[key] = key_tables(self.portable.tables(pages).centroid_bits())
        return self._books[key]

    def _kernel(self, device: int, expr: str) -> Any:
        fn = self._launch.get((device, expr))
        if fn is None:
            from .cupy_kernels import Launch, function

            fn = self._launch[(device, expr)] = Launch(function(SOURCE, expr, device), ARGS)
        return fn

    def _decode(
        self,
        q: torch.Tensor,
        pages: KVPages,
        flat: dict[str, torch.Tensor],
        book: tuple[int, int],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        max_len: int,
        scale: float,
        window: int | None,
        softcap: float | None,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        from quantrt.backends.triton.kv import combine_splits, device_sms, early_sync

        from .cupy_kernels import stream

        B, Hq, D = q.shape
        H = pages.num_kv_heads
        out = torch.empty_like(q)
        if B == 0:
            return out
        if not rows_aligned(q):
            q = q.clone(memory_format=torch.contiguous_format)
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        S = num_splits(B, H, max_len, D, device_sms(q.device))
        direct = S == 1 and sinks is None
        if direct:
            pm = pl = po = out
        else:
            pm = torch.empty(B, Hq, S, dtype=torch.float32, device=q.device)
            pl = torch.empty_like(pm)
            po = torch.empty(B, Hq, S, D, dtype=torch.float32, device=q.device)
        bs = pages.block_size
        paged = bs % 16 == 0 and bs & (bs - 1) == 0
        bt64 = block_table.dtype == torch.int64
        kp, kn, vp, vs, vz = flat["k"], flat["k_norm"], flat["v"], flat["v_scale"], flat["v_zero"]
        tables = self.portable.tables(pages)
        cap = bool(softcap)
        launch = self._kernel(dev, expression(D, q.dtype == torch.bfloat16, bt64, paged))
        args = (
            q.data_ptr(), tables.signs.data_ptr(), kp.data_ptr(), kn.data_ptr(), vp.data_ptr(),
            vs.data_ptr(), vz.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
            pm.data_ptr(), pl.data_ptr(), po.data_ptr(), out.data_ptr(), _signed(book[0]), _signed(book[1]),
            _f32_bits(float(scale) / D**0.5), _f32_bits(1.0 / softcap) if cap else 0,
            _f32_bits(float(softcap) * _LOG2E) if cap else 0,
            q.stride(0), q.stride(1), kp.stride(0), kp.stride(1), kn.stride(0), kn.stride(1),
            vp.stride(0), vp.stride(1), block_table.stride(0), block_table.stride(1), seq_lens.stride(0),
            0 if direct else pm.stride(0), 0 if direct else pm.stride(1), out.stride(0), out.stride(1),
            Hq // H, bs, bs.bit_length() - 1, int(max_len), int(window or 0), int(direct),
        )  # fmt: skip
        launch((H, S, B), (32 * WARPS, 1, 1), args, shared_bytes(D), stream(dev))
        if not direct:
            combine_splits(pm, pl, po, out, sinks, early_sync(self.portable.grid_sync(q.device)))
        return out


def rows_aligned(q: torch.Tensor) -> bool:
    """Whether the kernel can read q [B, Hq, D] in place: contiguous rows at 16-byte boundaries (a
    thread reads its quarter of a row in 16-byte loads)."""
    return q.stride(-1) == 1 and q.data_ptr() % 16 == 0 and q.stride(0) % 8 == 0 and q.stride(1) % 8 == 0


def _signed(x: int) -> int:
    """An unsigned 64-bit pattern as the signed int64 the launcher packs."""
    return x - (1 << 64) if x >= 1 << 63 else x


def planes_fit(flat: dict[str, torch.Tensor]) -> bool:
    """Whether a cache's planes have the layout the kernel assumes: the three per-token scalar
    planes share their strides, code rows are contiguous and aligned for the wide loads (a
    thread's quarter of a row), slots and byte offsets fit 32 bits."""
    kp, kn, vs, vz, vp = flat["k"], flat["k_norm"], flat["v_scale"], flat["v_zero"], flat["v"]
    if not (kn.stride() == vs.stride() == vz.stride()):
        return False
    row = kp.shape[-1]
    if kp.stride(-1) != 1 or vp.stride(-1) != 1:
        return False
    if any(x % (row // 4) for x in (*kp.stride()[:2], *vp.stride()[:2])):
        return False
    if kp.data_ptr() % 16 or vp.data_ptr() % 16:
        return False
    return kp.shape[0] * max(kp.stride(0), vp.stride(0)) < 2**32
