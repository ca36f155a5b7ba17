"""TensorSpec (one stored tensor, and how tensor parallelism cuts it) and LayerSpec (what
dispatch decides on).

Sharding is data, not code per format: a TensorSpec says which dim runs along K (input) and
which along N (output), how many K or N elements one index along that dim covers (a packing
factor, a group size, a block), and what a column- or row-parallel split does to it. One
slicing routine then serves every format, and a cut that would split a group, a block or a
packed byte is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from .errors import ShardError
from .schemes import Scheme

Split = str  # "split" | "replicate" | "refuse"


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor of a quantized layer.

    ``input_unit`` / ``output_unit``: K (resp. N) elements covered by one index along
    ``input_dim`` / ``output_dim`` (2 for int4 codes two per byte, G for group scales,
    a Fraction for bit streams and flat layouts). ``input_align`` / ``output_align``: a cut
    must fall on a multiple of this many elements (a GGUF block, a scale block).
    ``per_slice``: dim 0 indexes the output slices of a fused layer (per-shard scalars).
    ``column`` / ``row``: what a column- (N) or row-parallel (K) split does to this tensor;
    ``refuse_reason`` explains a ``refuse``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    input_dim: int | None = None
    output_dim: int | None = None
    input_unit: Fraction = Fraction(1)
    output_unit: Fraction = Fraction(1)
    input_align: int = 1
    output_align: int = 1
    per_slice: bool = False
    column: Split = "split"
    row: Split = "split"
    refuse_reason: str = ""
    ceil_end: bool = False  # block scales: a ragged last block still has its own row/column

    def mode(self, parallel: str) -> Split:
        """What a ``column`` or ``row`` split does to this tensor."""
        m = self.column if parallel == "column" else self.row
        dim = self.output_dim if parallel == "column" else self.input_dim
        if m == "split" and dim is None:
            return "replicate"
        return m

    def index_range(self, dim: int, start: int, stop: int, total: int) -> tuple[int, int]:
        """Storage indices along ``dim`` that hold elements [start, stop) of ``total``."""
        is_in = dim == self.input_dim
        unit = self.input_unit if is_in else self.output_unit
        align = self.input_align if is_in else self.output_align
        axis = "K (input)" if is_in else "N (output)"
        for edge in (start, stop):
            if edge % align and not (edge == total and self.ceil_end):
                raise ShardError(
                    f"{self.name}: a cut at {axis} element {edge} is not a multiple of {align}: "
                    f"it would split a group/block of this tensor"
                )
        lo = Fraction(start) / unit
        hi = Fraction(stop) / unit
        if self.ceil_end and stop == total:
            hi = Fraction(self.shape[dim])
        if lo.denominator != 1 or hi.denominator != 1:
            raise ShardError(
                f"{self.name}: {axis} elements [{start}, {stop}) do not map onto whole stored elements "
                f"({unit} elements per stored index along dim {dim}): the cut would fall inside a packed "
                "element, group or block"
            )
        return int(lo), int(hi)

    def local_shape(self, parallel: str | None, rank: int, world: int, k: int, n: int) -> tuple[int, ...]:
        """The per-rank shape of this tensor; ``k`` and ``n`` are the full K and N."""
        shape = list(self.shape)
        if parallel is None or world == 1:
            return tuple(shape)
        mode = self.mode(parallel)
        if mode == "refuse":
            raise ShardError(f"{self.name}: cannot be split {parallel}-parallel: {self.refuse_reason}")
        if mode == "replicate":
            return tuple(shape)
        dim = self.output_dim if parallel == "column" else self.input_dim
        if dim is None:  # per_slice tensors under column split stay whole
            return tuple(shape)
        total = n if parallel == "column" else k
        if total % world:
            raise ShardError(f"{self.name}: {total} is not divisible by {world} ranks")
        part = total // world
        lo, hi = self.index_range(dim, rank * part, (rank + 1) * part, total)
        shape[dim] = hi - lo
        return tuple(shape)

    def shard(
        self, tensor: torch.Tensor, parallel: str | None, rank: int, world: int, k: int, n: int
    ) -> torch.Tensor:
        """The part of a full stored tensor that rank ``rank`` of ``world`` holds."""
        self.check_shape(tensor)
        if parallel is None or world == 1:
            return tensor
        mode = self.mode(parallel)
        if mode == "refuse":
            raise ShardError(f"{self.name}: cannot be split {parallel}-parallel: {self.refuse_reason}")
        dim = self.output_dim if parallel == "column" else self.input_dim
        if mode == "replicate" or dim is None:
            return tensor
        total = n if parallel == "column" else k
        part = total // world
        lo, hi = self.index_range(dim, rank * part, (rank + 1) * part, total)
        return tensor.narrow(dim, lo, hi - lo)

    def check_shape(self, tensor: torch.Tensor, where: str = "") -> None:
        if tuple(tensor.shape) != tuple(self.shape):
            raise ShardError(
                f"{where or self.name}: expected shape {list(self.shape)}, found {list(tensor.shape)}"
            )


@dataclass(frozen=True)
class LayerSpec:
    """What dispatch decides on for one linear (or grouped-expert) layer on one rank.

    ``K``/``N`` are the full layer; ``K_part``/``N_part`` this rank's part. ``output_sizes``
    lists the per-rank widths of a fused layer's slices (q, k, v), which all share ``scheme``
    (a fused layer whose slices differ gets one LayerSpec per run of equal schemes).
    ``m_hint`` is the expected batch size, when the caller knows it.
    """

    scheme: Scheme
    K: int
    N: int
    K_part: int = -1
    N_part: int = -1
    act_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype | None = None
    bias: bool = False
    op: str = "linear"
    num_experts: int = 1
    m_hint: int | None = None
    output_sizes: tuple[int, ...] = field(default=())
    parallel: str | None = None
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.K_part < 0:
            object.__setattr__(self, "K_part", self.K)
        if self.N_part < 0:
            object.__setattr__(self, "N_part", self.N)
        if not self.output_sizes:
            object.__setattr__(self, "output_sizes", (self.N_part,))
        if sum(self.output_sizes) != self.N_part:
            raise ValueError(f"output_sizes {self.output_sizes} do not add up to N_part={self.N_part}")
        if self.op not in ("linear", "grouped"):
            raise ValueError(f"op must be 'linear' or 'grouped', found {self.op!r}")

    @property
    def k_full(self) -> bool:
        """False when this rank holds only part of K (row-parallel)."""
        return self.K_part == self.K

    @property
    def output_dtype(self) -> torch.dtype:
        return self.out_dtype or self.act_dtype

    def describe(self) -> str:
        extra = (
            f" (rank part {self.K_part}x{self.N_part})"
            if (self.K_part, self.N_part) != (self.K, self.N)
            else ""
        )
        experts = f" x {self.num_experts} experts" if self.op == "grouped" else ""
        return (
            f"{self.scheme} K={self.K} N={self.N}{experts}{extra} act={str(self.act_dtype).replace('torch.', '')}"
            + (" bias" if self.bias else "")
        )
