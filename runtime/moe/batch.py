"""One MoE call's routing, as the grouped kernels read it.

``M`` tokens each go to ``top_k`` experts: ``M * top_k`` *assignments*, numbered ``a = m * top_k
+ j``. A grouped kernel computes one output row per assignment, ``x[row(a)] @ W[e(a)].T``, where
``row(a)`` is ``a // top_k`` when the kernel gathers token rows (the first projection) and ``a``
when its input already holds one row per assignment (the second). An expert id outside
``[0, E)`` marks an assignment to an expert this rank does not hold (expert parallelism): its
output row is zero.

The orders a kernel needs are computed from the ids with torch ops only (no host
synchronisation, so a CUDA graph can capture them) and cached on the batch, so the two
projections of one call share them: :meth:`ExpertBatch.sorted` (assignments by expert),
:meth:`ExpertBatch.aligned` (the same, each expert's run padded to a tile of ``block`` rows, as a
tiled GPU kernel walks it) and, for kernels that loop over experts on the host,
:meth:`ExpertBatch.counts`.
"""

from __future__ import annotations

import torch


class ExpertBatch:
    """The routing of ``M`` tokens to ``top_k`` of ``E`` local experts each."""

    __slots__ = (
        "A",
        "E",
        "M",
        "_aligned",
        "_counts",
        "_ids",
        "_sorted",
        "_weights",
        "top_k",
        "topk_ids",
        "topk_weights",
    )

    def __init__(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int) -> None:
        if topk_ids.dim() != 2:
            raise ValueError(f"expected topk_ids [M, top_k], found {list(topk_ids.shape)}")
        if topk_weights is not None and topk_weights.shape != topk_ids.shape:
            raise ValueError(
                f"topk_weights {list(topk_weights.shape)} must match topk_ids {list(topk_ids.shape)}"
            )
        self.M, self.top_k = int(topk_ids.shape[0]), int(topk_ids.shape[1])
        self.A, self.E = self.M * self.top_k, int(num_experts)
        self.topk_ids, self.topk_weights = topk_ids, topk_weights
        self._ids: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None
        self._sorted: tuple[torch.Tensor, torch.Tensor] | None = None
        self._aligned: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._counts: list[int] | None = None

    @property
    def ids(self) -> torch.Tensor:
        """Expert of each assignment, int64 [A]; E for an expert this rank does not hold (made on
        first use: a fused path that reads ``topk_ids`` itself never pays for it)."""
        if self._ids is None:
            ids = self.topk_ids.reshape(-1).to(torch.int64)
            self._ids = torch.where((ids >= 0) & (ids < self.E), ids, self.E)
        return self._ids

    @property
    def weights(self) -> torch.Tensor | None:
        """Routing weight of each assignment, fp32 [A] (None: not given)."""
        if self._weights is None and self.topk_weights is not None:
            self._weights = self.topk_weights.reshape(-1).to(torch.float32)
        return self._weights

    def rows(self, gather: bool) -> torch.Tensor:
        """The input row of every assignment: its token (``gather``) or itself."""
        a = torch.arange(self.A, device=self.ids.device)
        return a // self.top_k if gather else a

    def sorted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, offsets)``: assignments sorted by expert (stable; unheld experts last), and
        int64 [E + 2] offsets, expert ``e``'s assignments being ``order[offsets[e]:offsets[e+1]]``."""
        if self._sorted is None:
            order = torch.argsort(self.ids, stable=True)
            # scatter_add, not bincount: CUDA's bincount reads min/max back to the host (a sync that
            # a CUDA graph cannot capture)
            counts = torch.zeros(self.E + 1, dtype=torch.int64, device=self.ids.device)
            counts.scatter_add_(0, self.ids, torch.ones_like(self.ids))
            offsets = torch.zeros(self.E + 2, dtype=torch.int64, device=self.ids.device)
            offsets[1:] = torch.cumsum(counts, 0)
            self._sorted = (order, offsets)
        return self._sorted

    def counts(self) -> list[int]:
        """Assignments per local expert, on the host (synchronises: for host-side expert loops)."""
        if self._counts is None:
            _, offsets = self.sorted()
            self._counts = (offsets[1 : self.E + 1] - offsets[: self.E]).tolist()
        return self._counts

    def aligned(self, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(sorted_ids, block_expert, num_padded)`` for a kernel that runs tiles of ``block``
        assignments of one expert each.

        ``sorted_ids`` int32 [P]: assignments by expert, each expert's run padded with ``A`` (no
        assignment) to a multiple of ``block``; ``P`` is the bound ``A + E * (block - 1)`` rounded up
        to a tile, known without reading the ids, so the launch grid is fixed. ``block_expert``
        int32 [P / block]: each tile's expert (``E`` past the last). ``num_padded`` int32 [1]: the
        padded length actually used; tiles from there on have nothing to do.
        """
        got = self._aligned.get(block)
        if got is not None:
            return got
        order, offsets = self.sorted()
        dev, E, A = self.ids.device, self.E, self.A
        counts = offsets[1 : E + 1] - offsets[:E]
        padded = (counts + block - 1) // block * block
        poff = torch.zeros(E + 1, dtype=torch.int64, device=dev)
        poff[1:] = torch.cumsum(padded, 0)
        P = -(-(A + E * (block - 1)) // block) * block
        sorted_e = self.ids[order]  # ascending; E (unheld) last
        rank = torch.arange(A, device=dev) - offsets[sorted_e]
        held = sorted_e < E
        # unheld assignments are written to one slot past the end, which is cut off
        pos = torch.where(held, poff[sorted_e.clamp(max=E - 1)] + rank, P)
        sorted_ids = torch.full((P + 1,), A, dtype=torch.int32, device=dev)
        sorted_ids.scatter_(0, pos, order.to(torch.int32))
        starts = torch.arange(0, P, block, device=dev)
        block_expert = torch.searchsorted(poff[1:], starts, right=True).to(torch.int32)
        got = (sorted_ids[:P], block_expert, poff[E:].to(torch.int32))
        self._aligned[block] = got
        return got
