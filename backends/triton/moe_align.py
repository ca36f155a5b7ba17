"""The routing of one MoE call sorted by expert and padded to tiles, in one Triton launch.

:meth:`quantrt.moe.ExpertBatch.sorted` and :meth:`~quantrt.moe.ExpertBatch.aligned` build the
orders the grouped GEMM reads (``backends/triton/moe.py``) from some twenty small torch ops: at a
few tokens those launches cost more than the experts' weights take to stream. :func:`align_routing`
computes the same five tensors, element for element, in one program of one launch:

* the expert of each assignment (ids outside ``[0, E)`` become ``E``: held elsewhere);
* per-expert counts (``tl.histogram``), their exclusive prefix sums (``offsets``) and those of the
  counts rounded up to ``block`` (each expert's run in ``sorted_ids``; the total is ``num_padded``);
* ``order``: a sort of the keys ``expert * BA + a`` (``BA``: A rounded up to a power of two), which
  is the stable argsort (unheld assignments last, in index order), read back from the keys' low bits;
* ``sorted_ids``: position ``q`` of ``order`` moves to ``q + padding before its expert`` (held
  assignments only); every other slot is written ``A``, each slot exactly once (no fill then
  overwrite, so no ordering between the program's threads is needed);
* ``block_expert``: tile ``t``'s expert is the number of experts whose padded run ends at or before
  it, a histogram of the runs' end tiles summed up.

Sizes come from the host's ``A``, ``E`` and ``block`` alone (``P`` is
``ceil((A + E * (block - 1)) / block) * block``, as ``aligned`` bounds it), nothing is read back, and
every output slot is written, so the launch captures into a CUDA graph and needs no memset. One
program holds all ``A`` assignments in registers, hence the bound :data:`MAX_A`; larger batches
(prefill, where the GEMMs dwarf these ops) keep the torch path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .launch import Launcher, cdiv, next_power_of_2

#: the most assignments the one-program launch takes (every key is held in registers and sorted)
MAX_A = 4096
#: slots of sorted_ids past the used runs written per loop step
_TAIL = 1024
#: elements of one step of the per-expert padding loop (experts x slots)
_PAD_TILE = 2048


# the sizes change from call to call and no access here gains from knowing one is 1 or a multiple of
# 16: one binary per set of constexprs, not one per size
@triton.jit(do_not_specialize=["A", "top_k", "stride_m", "stride_k", "block", "P", "T"])
def _align_kernel(
    IDS, ORDER, OFFS, SID, BEXP, NPAD,
    A, top_k, stride_m, stride_k, block, P, T,
    E: tl.constexpr, BA: tl.constexpr, EB: tl.constexpr, TB: tl.constexpr, JC: tl.constexpr,
    TAIL: tl.constexpr,
):  # fmt: skip
    a = tl.arange(0, BA)
    valid = a < A
    raw = tl.load(IDS + (a // top_k).to(tl.int64) * stride_m + (a % top_k) * stride_k, mask=valid, other=-1)
    held = valid & (raw >= 0) & (raw < E)
    e = tl.where(held, raw, E).to(tl.int32)

    # per-expert counts, their starts in order and in sorted_ids
    lane = tl.arange(0, EB)
    in_e = lane < E
    counts = tl.histogram(tl.where(held, e, 0), EB, mask=held)
    first = tl.cumsum(counts, 0) - counts
    n_held = tl.sum(counts, 0)
    padded = (counts + block - 1) // block * block
    pend = tl.cumsum(padded, 0)
    pstart = pend - padded
    npad = tl.sum(padded, 0)
    tl.store(OFFS + lane, first.to(tl.int64), mask=in_e)
    tl.store(OFFS + E, n_held.to(tl.int64))
    tl.store(OFFS + E + 1, n_held.to(tl.int64) + (A - n_held))
    tl.store(NPAD, npad)

    # the stable order: keys (expert, assignment) sorted; lanes past A sort after every assignment
    key = tl.sort(tl.where(valid, e, E + 1) * BA + a)
    src = key % BA
    ek = key // BA
    tl.store(ORDER + a, src.to(tl.int64), mask=valid)
    shift = tl.gather(pstart - first, tl.minimum(ek, EB - 1), 0)
    tl.store(SID + a + shift, src, mask=ek < E)

    # the rest of sorted_ids is A: each run's padding, then everything past the used runs
    gap = padded - counts
    hend = pstart + counts
    for j0 in range(0, block - 1, JC):
        j = j0 + tl.arange(0, JC)
        pad = in_e[:, None] & (j[None, :] < gap[:, None])
        tl.store(SID + hend[:, None] + j[None, :], A, mask=pad)
    for s in range(npad, P, TAIL):
        p = s + tl.arange(0, TAIL)
        tl.store(SID + p, A, mask=p < P)

    # tile t belongs to the number of experts whose run ends at or before it (E past the last)
    ends = tl.histogram(tl.where(in_e, pend // block, 0), TB, mask=in_e)
    t = tl.arange(0, TB)
    tl.store(BEXP + t, tl.cumsum(ends, 0), mask=t < T)


_align_launch = Launcher(_align_kernel)


def _warps(BA: int) -> int:
    """Warps of the one program: the sort of BA keys is its longest part, and its steps spread over
    the program's threads."""
    return 4 if BA <= 512 else 8 if BA <= 1024 else 16


def takes(topk_ids: torch.Tensor) -> bool:
    """Whether :func:`align_routing` serves this routing: at most :data:`MAX_A` assignments, on a GPU
    (or anywhere under Triton's interpreter, the CPU tests)."""
    if topk_ids.numel() > MAX_A:
        return False
    return topk_ids.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1"


def padded_length(A: int, E: int, block: int) -> int:
    """``P``: the bound on ``sorted_ids``' length, ``A + E * (block - 1)`` rounded up to a tile."""
    return cdiv(A + E * (block - 1), block) * block


def align_routing(
    topk_ids: torch.Tensor, E: int, block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, offsets, sorted_ids, block_expert, num_padded)`` of the routing ``topk_ids``
    ([M, top_k] or [A], any integer dtype and strides; ids outside ``[0, E)`` are held elsewhere),
    equal to ``ExpertBatch.sorted()`` followed by ``ExpertBatch.aligned(block)``: order int64 [A],
    offsets int64 [E + 2], sorted_ids int32 [P], block_expert int32 [P / block], num_padded int32 [1].

    One launch of one program, no host synchronisation; ``A`` (``M * top_k``) at most :data:`MAX_A`.
    """
    ids = topk_ids if topk_ids.dim() == 2 else topk_ids.reshape(-1, 1)
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(
            f"align_routing: expected integer ids [M, top_k], found {ids.dtype} {list(ids.shape)}"
        )
    if E < 1 or block < 1:
        raise ValueError(f"align_routing: need E >= 1 and block >= 1, found E={E} block={block}")
    M, top_k = int(ids.shape[0]), int(ids.shape[1])
    A = M * top_k
    if A > MAX_A:
        raise ValueError(f"align_routing: {A} assignments, one program takes at most {MAX_A}")
    BA = max(32, next_power_of_2(A))
    if (E + 2) * BA >= 1 << 31:
        raise ValueError(f"align_routing: E={E} experts leave no room for the int32 sort keys")
    P = padded_length(A, E, block)
    T = P // block
    dev = ids.device
    # one buffer per dtype (never empty, so every pointer is a real one)
    i64 = torch.empty(A + E + 2, dtype=torch.int64, device=dev)
    i32 = torch.empty(P + T + 1, dtype=torch.int32, device=dev)
    order, offsets = i64[:A], i64[A:]
    sorted_ids, block_expert, num_padded = i32[:P], i32[P : P + T], i32[P + T :]
    EB = max(32, next_power_of_2(E))
    TB = max(32, next_power_of_2(T + 1))
    JC = max(1, min(next_power_of_2(max(1, block - 1)), _PAD_TILE // EB))
    _align_launch((1,),
        ids, order, offsets, sorted_ids, block_expert, num_padded,
        A, max(1, top_k), ids.stride(0), ids.stride(1), block, P, T,
        E=E, BA=BA, EB=EB, TB=TB, JC=JC, TAIL=_TAIL, num_warps=_warps(BA),
    )  # fmt: skip
    return order, offsets, sorted_ids, block_expert, num_padded
