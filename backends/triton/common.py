"""Launch plumbing shared by the portable Triton GEMMs (:mod:`.w4a16`, :mod:`.fp8_mm`,
:mod:`.fp8_weight_only`, :mod:`.int8_mm`).

Every one of them tiles the output [M, N] in ``block_m`` x ``block_n`` tiles and may split K over
``split_k`` programs per tile. ``split_k`` = 1 stores the output dtype directly. ``split_k`` > 1
reduces the partial sums one of two ways:

- in the launch (:func:`reduce_tile`: the W8A8 GEMMs of :mod:`.fp8_mm` and :mod:`.int8_mm`, the
  GGUF GEMV of :mod:`.gguf`): each program stores its fp32 partial tile, counts itself in on the
  tile's arrival counter (:class:`TileCounters`), and the last to arrive sums the partials in
  ``pid_k`` order, adds the bias, stores the output dtype and resets the counter. One launch, deterministic, and the partials need
  no zeroing: the host allocates them uninitialised;
- with fp32 atomics into a zeroed buffer (``out`` itself when the output is fp32) cast into the
  output afterwards (:func:`output_buffers`, :func:`store_tile`, :func:`finish_output`): the older
  kernels, whose CUDA calls now go to the CuPy-launched kernels, so their two extra launches are off
  the hot path.

Host side: :class:`TileConfig`, the argument checks, the output buffers, one prepared strategy per
tile (:func:`tile_strategies`); device side: the K-loop's operand loads (:func:`load_k_tiles`) and
the epilogues.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantrt.prepared import ALL_M, Strategy, StrategyFn

from .launch import cdiv

#: activation, bias and output dtypes the kernels take
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration; ``split_k`` > 1 splits K over that many programs per output tile."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_config(config: TileConfig, min_block_k: int, what: str) -> None:
    """Raise ValueError unless the tile is a valid launch: powers of two, dot-sized, split_k >= 1.

    ``tl.dot`` needs M, N >= 16 and K >= 16 (K >= 32 for 8-bit operands on NVIDIA): ``min_block_k``.
    """
    for field, lo in (("block_m", 16), ("block_n", 16), ("block_k", min_block_k)):
        v = getattr(config, field)
        if not isinstance(v, int) or v < lo or v & (v - 1):
            raise ValueError(f"{what}: {field} must be a power of two >= {lo}, found {v!r}")
    for field in ("split_k", "num_warps", "num_stages"):
        v = getattr(config, field)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{what}: {field} must be a positive integer, found {v!r}")


def check_block(block: tuple[int, int], what: str) -> tuple[int, int]:
    """The (bn, bk) of a block-scaled weight, checked: two positive ints."""
    if len(block) != 2 or any(not isinstance(b, int) or b < 1 for b in block):
        raise ValueError(f"{what}: block must be (bn, bk) positive ints, found {block!r}")
    return block[0], block[1]


def check_epilogue(
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    out_dtype: torch.dtype,
    M: int,
    N: int,
    device: torch.device,
    what: str,
    name: Callable[[torch.dtype], str] = dtype_name,
) -> None:
    """Validate bias [N] (float), the output dtype and ``out`` [M, N] of that dtype (``name`` spells
    the dtypes in the messages)."""
    if out_dtype not in FLOAT_DTYPES:
        want = ", ".join(dtype_name(d) for d in FLOAT_DTYPES)
        raise ValueError(f"{what}: out_dtype must be one of {want}, found {out_dtype}")
    if bias is not None:
        if bias.dtype not in FLOAT_DTYPES or tuple(bias.shape) != (N,) or bias.device != device:
            raise ValueError(
                f"{what}: bias must be a float16/bfloat16/float32 [{N}] tensor on {device}, "
                f"found {name(bias.dtype)} {list(bias.shape)} on {bias.device}"
            )
    if out is not None:
        if out.dtype != out_dtype or tuple(out.shape) != (M, N) or out.device != device:
            raise ValueError(
                f"{what}: out must be {name(out_dtype)} [{M}, {N}] on {device}, "
                f"found {name(out.dtype)} {list(out.shape)} on {out.device}"
            )


def empty_result(
    N: int, out_dtype: torch.dtype, out: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """M = 0: nothing to launch (a zero-size grid is an error in some launchers)."""
    return out if out is not None else torch.empty(0, N, device=device, dtype=out_dtype)


def output_buffers(
    M: int, N: int, out_dtype: torch.dtype, out: torch.Tensor | None, atomic: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the kernel writes, what the caller gets). Split-K adds into fp32 zeros: ``out``
    itself when the output is fp32, else a scratch buffer cast afterwards by :func:`finish_output`."""
    if out is None:
        result = torch.empty(M, N, device=device, dtype=out_dtype)
    else:
        result = out
    if not atomic:
        return result, result
    if out_dtype == torch.float32:
        return result.zero_(), result
    return torch.zeros(M, N, device=device, dtype=torch.float32), result


def finish_output(written: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """After the launch: cast the split-K scratch buffer into the result (nothing when it is the result)."""
    if written is not result:
        result.copy_(written)
    return result


def tile_strategies(
    bounds: Sequence[int],
    configs: Sequence[TileConfig],
    name: Callable[[TileConfig], str],
    make: Callable[[TileConfig], StrategyFn],
    upto: int = ALL_M,
) -> list[Strategy]:
    """The strategies of a tile table resolved at load: ``configs[i]`` serves batches up to
    ``bounds[i]`` rows (the last one every larger batch), the whole list cut at ``upto`` rows (a
    caller serves the batches above with a strategy of its own). Neighbouring buckets with the same
    tile are one strategy; ``make(config)`` is the strategy's function, ``name(config)`` its name."""
    spans: list[tuple[int, TileConfig]] = []
    lo = 0
    for i, (bound, c) in enumerate(zip(bounds, configs)):
        hi = upto if i == len(configs) - 1 else min(bound, upto)
        if hi <= lo:
            break
        if spans and c == spans[-1][1]:
            spans[-1] = (hi, c)
        else:
            spans.append((hi, c))
        lo = hi
    return [Strategy(hi, name(c), make(c)) for hi, c in spans]


def tile_grid(M: int, N: int, config: TileConfig) -> tuple[int, int, int]:
    """Program ids (M-tile, N-tile, K-split), as the kernels read them with ``tl.program_id(0..2)``."""
    return cdiv(M, config.block_m), cdiv(N, config.block_n), config.split_k


@triton.jit
def load_k_tiles(
    X, W, kk, offs_m, offs_n, mask_m, mask_n, K, stride_xm, stride_xk, stride_wn, stride_wk,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """The K-tile ``kk`` of both operands: x [BM, BK], and the weight, [N, K] as stored, read
    transposed to [BK, BN] (``tl.dot``'s B operand) by pointer arithmetic. Rows, columns and (unless
    ``EVEN_K``: BK divides K) k out of range read as 0."""
    x_ptrs = X + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk
    w_ptrs = W + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk
    if EVEN_K:
        a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=mask_n[None, :], other=0.0)
    else:
        mask_k = kk < K
        a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=mask_n[None, :] & mask_k[:, None], other=0.0)
    return a, b


@triton.jit
def store_tile(
    acc, B, Y, offs_m, offs_n, mask_m, mask_n, pid_k, stride_b, stride_ym, stride_yn,
    HAS_B: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    """The epilogue after scaling: the fp32 tile ``acc`` plus bias (added once, by the ``pid_k`` = 0
    programs), then an fp32 atomic add into the zeroed split-K buffer (``ATOMIC``) or a store in
    Y's dtype."""
    if HAS_B:
        if pid_k == 0:
            acc += tl.load(B + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    mask = mask_m[:, None] & mask_n[None, :]
    if ATOMIC:
        tl.atomic_add(y_ptrs, acc, mask=mask)
    else:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)


class TileCounters:
    """The arrival counters of an in-launch split-K reduction (:func:`reduce_tile`): int32 zeros, one
    per output tile, which every launch leaves at zero again (its last program per tile resets
    its counter). One set per thread: launches on one thread's stream run one after another, so
    a layer's counters are never shared by two launches at once (the contract of the shared
    workspace in ``quantrt.prepared``). The preparing thread's set is allocated at load; another
    thread's on its first call. A batch needing more tiles than a set holds gets a larger one;
    the old set stays alive for a CUDA graph captured with it."""

    def __init__(self, tiles: int, device: torch.device) -> None:
        self.device = device
        self._local = threading.local()
        self._kept: list[torch.Tensor] = []
        if tiles:
            self.get(tiles)

    def get(self, tiles: int) -> torch.Tensor:
        """A zeroed counter per tile for a launch of ``tiles`` output tiles."""
        t = getattr(self._local, "t", None)
        if t is None or t.numel() < tiles:
            if t is not None:
                self._kept.append(t)
            t = torch.zeros(
                max(tiles, 2 * t.numel() if t is not None else 0), dtype=torch.int32, device=self.device
            )
            self._local.t = t
            self._local.held = (t.numel(), t.data_ptr())
        return t

    def address(self, tiles: int) -> int:
        """:meth:`get`'s counters as a raw address (for bound launches)."""
        held = getattr(self._local, "held", None)
        if held is None or held[0] < tiles:
            return self.get(tiles).data_ptr()
        return held[1]


def split_k_tiles(bounds: Sequence[int], configs: Sequence[TileConfig], N: int) -> int:
    """Output tiles of the largest split-K launch a tile table makes for N columns (0 without
    split-K; an unbounded split-K bucket counts its first 256 rows, larger batches grow the set)."""
    tiles, lo = 0, 0
    for bound, c in zip(bounds, configs):
        if c.split_k > 1:
            tiles = max(tiles, cdiv(min(bound, max(lo, 256)), c.block_m) * cdiv(N, c.block_n))
        lo = bound
    return tiles


def split_k_buffers(
    y: torch.Tensor, tiles: int, M: int, N: int, config: TileConfig, counters: TileCounters | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reduce_tile`'s partials (uninitialised fp32 [split_k, M, N]: every element a launch
    reads, one of its programs wrote first) and arrival counters (``counters``' set, or zeros
    made for this call); without split-K, ``y`` stands in for both (never read)."""
    if config.split_k == 1:
        return y, y
    part = torch.empty((config.split_k, M, N), dtype=torch.float32, device=y.device)
    if counters is None:
        return part, torch.zeros(tiles, dtype=torch.int32, device=y.device)
    return part, counters.get(tiles)


@triton.jit
def reduce_tile(
    acc, B, Y, P, C, tile, pid_k, offs_m, offs_n, mask_m, mask_n, M, N, stride_b, stride_ym, stride_yn,
    HAS_B: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    """The epilogue after scaling, reducing split-K in the launch. ``SPLIT_K`` = 1: bias, then a
    store in Y's dtype. Otherwise the fp32 tile goes to its slot ``pid_k`` of the partials P
    ([SPLIT_K, M, N]); the barrier and the release half of the counter's atomic (one thread's,
    Triton's scalar atomics) publish the whole program's stores; the program that counts
    ``SPLIT_K`` - 1 (the acquire half) sums the slots in order (past L1: ``.cg``), adds the bias,
    stores Y and resets the counter ``C[tile]`` for the next launch."""
    mask = mask_m[:, None] & mask_n[None, :]
    y_ptrs = Y + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    if SPLIT_K == 1:
        if HAS_B:
            acc += tl.load(B + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)
    else:
        mn = tl.cast(M, tl.int64) * N  # M or N may arrive as a constexpr 1
        part = P + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(part + pid_k * mn, acc, mask=mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(C + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for s in range(1, SPLIT_K):
                total += tl.load(part + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_B:
                total += tl.load(B + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask)
            tl.atomic_xchg(C + tile, 0, sem="relaxed", scope="gpu")
