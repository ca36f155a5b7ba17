"""Fused MoE experts on the tensor-core kernel (``kernels/wna16_mma.cu``, entry ``wna16_moe``), for
decode-sized batches of NVFP4/MXFP4 experts.

A few tokens touch a few experts, each for a few rows: the layer is bound by streaming those
experts' weights, and the linear kernel's swapped mma (the weights as the A operand, x rows as the
narrow B) streams them at a higher rate than the Triton grouped GEMM's K loop. ``wna16_moe`` is that
kernel with its rows taken from the routing sorted by expert and padded to ``XR`` rows per tile
(block row b: assignments ``sid[b * XR ..]`` of expert ``bexp[b]``, whose weights it reads at the
expert's offset), the routing weight in its epilogue, and one extra block row that zeroes the rows
of assignments held elsewhere. No expert has more rows than there are tokens (a token routes to
distinct experts), so with ``XR >= M`` every active expert is one tile: its weights are read once.

The experts keep one layout for both kernels, the lane order of ``wna16_layout`` (``repack_codes``)
with ``fp4_operands``' e5m3 scale bytes and fp32 column factors: larger batches run the Triton
grouped GEMM over the same bytes (``MoeWeights`` layout "lane", ``backends/triton/moe.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from quantrt.backends.triton import tile_table
from quantrt.backends.triton.moe import grid_tiles
from quantrt.moe import CanonicalExperts

from .cupy_kernels import Launch, compile_all, function, stream
from .mma_codebook import fp4_operands, fp4_rows
from .mma_wna16 import (
    CT,
    E2M1,
    SOURCE,
    Shape,
    Tile,
    groups_per_chunk,
    max_groups,
    pick_warps,
    smem_limit,
    sz_bytes,
)
from .policy import CUDA
from .wna16_layout import repack_codes

#: wna16_moe's arguments: x, w, sz, bias, cs, book, y, K, ldx, ldy, N, Npad, chunks, shift, sid,
#: bexp, npad, tw, order, offs, A, E, row_div, w_stride, sz_stride
MOE_ARGS = 25
#: token counts the kernel serves (its x rows per tile): larger batches take the Triton GEMM
TOKENS = (1, 8, 16)


def lane_fp4_experts(weight: CanonicalExperts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every expert's NVFP4/MXFP4 operands (``fp4_operands``) in the lane layout, stacked: codes uint8
    [E, Npad/8/TG, chunks, TG, 32, 16], scale bytes [E, groups, Npad], column factors fp32 [E, N]."""
    codes, sz, cs = [], [], []
    for e in range(weight.E):  # one expert at a time: the unpacked copies stay one expert's size
        c, s, col = fp4_operands(weight.expert(e))
        codes.append(repack_codes(c, 4, weight.N, weight.K))
        sz.append(s)
        cs.append(col)
    return torch.stack(codes), torch.stack(sz), torch.stack(cs).contiguous()


@dataclass
class MmaExperts:
    """One projection's experts as ``wna16_moe`` reads them, and its launch shapes per token count."""

    w: torch.Tensor  # uint8 [E, Npad/8/TG, chunks, TG, 32, 16]
    sz: torch.Tensor  # uint8 [E, groups, Npad]: e5m3 scale bytes
    cs: torch.Tensor  # fp32 [E, N]: column factors
    E: int
    N: int
    K: int
    n_pad: int
    chunks: int
    gpc: int
    act: torch.dtype
    device: int
    shapes: tuple[tuple[Shape, dict[str, Any]], ...]  # per entry of TOKENS: (shape, its table row)
    sms: int
    limit: int
    w_stride: int  # uint4 of codes per expert
    sz_stride: int  # scale bytes per expert
    _tiles: dict[tuple[int, int], Tile] = field(default_factory=dict)

    def max_tokens(self) -> int:
        return max(sh.max_m for sh, _ in self.shapes)

    def tile(self, M: int, A: int) -> Tile:
        """The launch for ``M`` tokens (``A`` assignments): the smallest shape holding M rows, its K
        groups per block picked for the tiles that can be active (at most ``min(A, E)``)."""
        i = next(j for j, (sh, _) in enumerate(self.shapes) if M <= sh.max_m)
        active = min(A, self.E)
        got = self._tiles.get((i, active))
        if got is None:
            got = self._tiles[(i, active)] = self._make(i, active)
        return got

    def _make(self, i: int, active: int) -> Tile:
        shape, row = self.shapes[i]
        szb = sz_bytes(self.act, E2M1)
        fn = function(SOURCE, moe_expr(self.act, self.gpc, shape), self.device)
        wk = pick_warps(shape, row, self.n_pad * active, self.chunks, self.sms, self.limit, self.gpc, szb, 4)
        wk = max(1, min(wk, fn.max_threads_per_block // (32 * shape.wn), max_groups(shape)))
        return Tile(
            shape.max_m, shape.mt, shape.nt, shape.wn, wk, shape.stages, shape.swap, shape.fold, shape.xr,
            False, Launch(fn, MOE_ARGS), shape.smem(wk, self.gpc, szb, 4),
        )  # fmt: skip

    def run(
        self,
        tile: Tile,
        x: torch.Tensor,
        sorted_ids: torch.Tensor,
        block_expert: torch.Tensor,
        num_padded: torch.Tensor,
        order: torch.Tensor,
        offsets: torch.Tensor,
        A: int,
        row_div: int,
        topk_weights: torch.Tensor | None,
        bias: torch.Tensor | None,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """``y`` [A, N] in the activation dtype, one launch (the routing aligned to ``tile.xr`` rows):
        ``y[a] = (x[a // row_div] . W[e(a)] + bias[e(a)]) * topk_weights[a]``; x [rows, K] in the
        activation dtype; ``out``: [A, N] with unit column stride, or None."""
        if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
            buf = torch.empty(x.shape[0], -(-self.K // 8) * 8, dtype=x.dtype, device=x.device)
            buf[:, : self.K] = x
            x = buf
        if bias is not None and (bias.dtype != self.act or not bias.is_contiguous()):
            bias = bias.to(self.act).contiguous()
        y = torch.empty(A, self.N, dtype=self.act, device=x.device) if out is None else out
        tiles = min(grid_tiles(A, self.E, tile.xr), block_expert.shape[0])
        tile.fn(
            (tiles + 1, -(-self.n_pad // (8 * tile.nt * tile.wn)), 1),
            (32 * tile.wk * tile.wn, 1, 1),
            (
                x.data_ptr(), self.w.data_ptr(), self.sz.data_ptr(), 0 if bias is None else bias.data_ptr(),
                self.cs.data_ptr(), 0, y.data_ptr(), self.K, x.stride(0), y.stride(0), self.N, self.n_pad,
                self.chunks, 0,
                sorted_ids.data_ptr(), block_expert.data_ptr(), num_padded.data_ptr(),
                0 if topk_weights is None else topk_weights.data_ptr(), order.data_ptr(), offsets.data_ptr(),
                A, self.E, row_div, self.w_stride, self.sz_stride,
            ),
            tile.smem,
            stream(self.device),
        )  # fmt: skip
        return y


def moe_expr(act: torch.dtype, gpc: int, shape: Shape) -> str:
    """The ``wna16_moe`` instance of one (swapped, unfolded) launch shape for e2m1 codes."""
    return f"wna16_moe<{CT[act]}, {E2M1}, 1, {shape.nt}, {shape.wn}, {gpc}, {shape.stages}, {shape.xr}, true, false>"


def mma_fp4_experts(
    w: torch.Tensor, sz: torch.Tensor, cs: torch.Tensor, weight: CanonicalExperts, act: torch.dtype
) -> MmaExperts:
    """The launch shapes of the device's table for the lane-layout experts (``lane_fp4_experts``),
    compiled now: the code-book rows of ``tunings/wna16_mma_<arch>.json`` for 1, 8 and 16 rows."""
    dev = w.device.index if w.device.index is not None else torch.cuda.current_device()
    cap = torch.cuda.get_device_capability(dev)
    table = tile_table.load(CUDA.package, "wna16_mma", f"sm_{cap[0]}{cap[1]}")
    gpc = groups_per_chunk(4, weight.scheme.group_size)
    rows = fp4_rows(table)
    shapes = []
    for m in TOKENS:
        row = next((r for r in rows if int(r["max_m"]) >= m), rows[-1])
        shapes.append((Shape.of({**row, "max_m": m, "swap": True}, 4, act, gpc, foldable=False), row))
    compile_all(SOURCE, [moe_expr(act, gpc, sh) for sh, _ in shapes], dev)
    return MmaExperts(
        w, sz, cs, weight.E, weight.N, weight.K, sz.shape[2], w.shape[2], gpc, act, dev, tuple(shapes),
        torch.cuda.get_device_properties(dev).multi_processor_count, smem_limit(dev), w[0].numel() // 16,
        sz[0].numel(),
    )  # fmt: skip
