"""The reference kernel: dequantize-then-matmul in fp32, on any device, in bounded memory.

It is the oracle's arithmetic run as a kernel, so every scheme runs somewhere: it is the last
fallback on every device, and the only one on a CPU without a C++ compiler (where the native
kernels of ``quantrt.backends.cpu`` cannot be built). Dequantizing the whole weight per call, as
:func:`quantrt.reference.linear` does, would need ``4*N*K`` bytes of scratch on every call
(4.7 GB for a 57344x8192 layer), so ``prepare`` cuts the canonical weight into slices of output
rows whose fp32 dequantization fits in a bounded scratch budget (:data:`SCRATCH_BYTES`), and
``apply`` dequantizes one slice at a time and multiplies it into its output columns.

The cuts use the same layout rules as tensor parallelism (:func:`quantrt.canonical.canonical_specs`,
``TensorSpec.index_range``): every row-indexed tensor is narrowed (views, no copies), per-slice
tensors of a fused layer (NVFP4 ``global_scale``, bnb ``offset``, tensor scales) are indexed for
the fused slices a chunk overlaps (the chunk gets its own ``output_sizes``), and replicated tensors
(code books, ``g_idx``) stay whole. A scheme whose layout cannot be cut by rows (bitsandbytes with
K not a multiple of its blocksize: blocks straddle rows) runs as one chunk, the whole weight:
correct, not bounded, and the strategy's name says so. Activations are quantized once
per call exactly as the reference does, and every output column is the same fp32 dot product as in
:func:`quantrt.reference.linear`. MoE experts (``op="grouped"``) run one expert at a time on this
same path (:func:`quantrt.moe.loop.prepare_loop`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import ShardError
from ..kernels import Kernel, Verdict
from ..prepared import ALL_M, Strategy
from ..schemes import Scheme
from ..specs import LayerSpec, TensorSpec
from . import dequantize, quantize_activations

#: default bound on one chunk's fp32 dequantized weight (bytes)
SCRATCH_BYTES = 64 << 20
#: preferred row step of a chunk (a multiple of BLAS' register blocking along N)
ROW_STEP = 64


@dataclass(frozen=True)
class ChunkPlan:
    """How a [N, K] weight is cut into row slices: ``bounds`` [(start, stop)], and why."""

    bounds: tuple[tuple[int, int], ...]
    align: int
    bounded: bool  # False when the layout could not be cut and the whole weight is one chunk
    reason: str = ""

    @property
    def rows(self) -> int:
        """The most rows of any chunk."""
        return max((b - a for a, b in self.bounds), default=0)


def _row_align(specs: dict[str, TensorSpec]) -> int:
    """The smallest row step at which every row-indexed tensor can be cut (lcm of their needs)."""
    align = 1
    for spec in specs.values():
        if spec.output_dim is None or spec.per_slice:
            continue
        unit = Fraction(spec.output_unit)
        # rows r map onto r / unit stored indices: whole when r is a multiple of unit's numerator
        align = math.lcm(align, spec.output_align, unit.numerator)
    return align


def plan_chunks(
    scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...] = (), scratch_bytes: int = SCRATCH_BYTES
) -> ChunkPlan:
    """Row slices of at most ``scratch_bytes // (4*K)`` rows (rounded to the layout's alignment)."""
    whole = ((0, N),)
    if N <= 0 or K <= 0:
        return ChunkPlan(whole, 1, True)
    num_slices = len(output_sizes) or 1
    try:
        specs = canonical_specs(scheme, N, K, num_slices)
    except Exception as e:  # pragma: no cover - every catalog scheme has specs
        return ChunkPlan(whole, N, False, f"no tensor layout to cut by: {e}")
    refused = [s for s in specs.values() if s.output_dim is not None and s.mode("column") == "refuse"]
    if refused:
        return ChunkPlan(
            whole, N, False, refused[0].refuse_reason or f"{refused[0].name} cannot be cut by rows"
        )
    align = _row_align(specs)
    rows = scratch_bytes // (4 * K)
    # whole multiples of 64 rows when the budget allows: BLAS then takes the same per-column path
    # as for the whole weight (bit-for-bit equal outputs in practice)
    step = math.lcm(align, ROW_STEP) if rows >= math.lcm(align, ROW_STEP) else align
    rows = max(align, rows // step * step)
    if rows >= N:
        return ChunkPlan(whole, align, True)
    bounds = tuple((a, min(a + rows, N)) for a in range(0, N, rows))
    try:  # the same checks tensor parallelism makes, at every cut
        for spec in specs.values():
            if spec.output_dim is not None and spec.mode("column") == "split":
                for a, b in bounds:
                    spec.index_range(spec.output_dim, a, b, N)
    except ShardError as e:
        return ChunkPlan(whole, N, False, str(e))
    return ChunkPlan(bounds, align, True)


def _cut(weight: CanonicalWeight, specs: dict[str, TensorSpec], a: int, b: int) -> CanonicalWeight:
    """Rows [a, b) of a canonical weight, as views of its tensors."""
    N = weight.N
    # the fused slices rows [a, b) overlap, and how many of their rows fall inside
    first, sizes, edge = None, [], 0
    for i, size in enumerate(weight.output_sizes):
        lo, hi = max(a, edge), min(b, edge + size)
        if lo < hi:
            first = i if first is None else first
            sizes.append(hi - lo)
        edge += size
    assert first is not None
    S = len(weight.output_sizes)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in weight.tensors.items():
        spec = specs[name]
        if spec.per_slice:
            # an activation scale already reduced to one value at load stays whole
            tensors[name] = t.narrow(0, first, len(sizes)) if t.shape[0] == S else t
        elif spec.output_dim is not None and spec.mode("column") == "split":
            lo, hi = spec.index_range(spec.output_dim, a, b, N)
            tensors[name] = t.narrow(spec.output_dim, lo, hi - lo)
        else:
            tensors[name] = t
    return CanonicalWeight(weight.scheme, b - a, weight.K, tensors, tuple(sizes))


@dataclass
class ReferenceState:
    weight: CanonicalWeight
    plan: ChunkPlan
    chunks: list[tuple[int, int, CanonicalWeight]]
    out_dtype: torch.dtype


FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class ReferenceKernel(Kernel):
    """The fallback of every device kind (``Registry.set_fallback``), tried after every list."""

    name = "reference"
    ops = ("linear", "grouped")
    act_dtypes = FLOATS
    out_dtypes = FLOATS
    description = "pure-torch dequantize-then-matmul in fp32 (the test oracle)"

    def __init__(self, caps: Any = None, scratch_bytes: int | None = None) -> None:
        super().__init__(caps)
        #: bound on one chunk's fp32 dequantized weight
        self.scratch_bytes = SCRATCH_BYTES if scratch_bytes is None else int(scratch_bytes)

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return Verdict.yes()

    def prepare(self, weight: Any, spec: LayerSpec) -> Any:
        if spec.op == "grouped":  # MoE experts: each expert as a linear layer, its tokens gathered
            from ..moe.loop import prepare_loop

            return prepare_loop(self, weight, spec)
        plan = plan_chunks(weight.scheme, weight.N, weight.K, weight.output_sizes, self.scratch_bytes)
        if len(plan.bounds) == 1:
            chunks = [(0, weight.N, weight)]
        else:
            specs = canonical_specs(weight.scheme, weight.N, weight.K, len(weight.output_sizes))
            if set(weight.tensors) - set(specs):  # tensors of unknown layout: do not cut them
                extra = sorted(set(weight.tensors) - set(specs))
                plan = ChunkPlan(((0, weight.N),), weight.N, False, f"tensors of unknown layout {extra}")
                chunks = [(0, weight.N, weight)]
            else:
                chunks = [(a, b, _cut(weight, specs, a, b)) for a, b in plan.bounds]
        state = ReferenceState(weight, plan, chunks, spec.output_dtype)
        device = next(iter(weight.tensors.values())).device if weight.tensors else "cpu"
        return self.prepared(state, [Strategy(ALL_M, _describe(state), _linear)], spec, device)

    def scratch_bytes_of(self, spec: LayerSpec, max_m: int) -> int:
        """The memory one call allocates and frees (the oracle allocates per call: it is no hot
        path): one chunk's fp32 weight, plus the fp32 activations and outputs."""
        N, K = spec.N_part, spec.K_part
        rows = plan_chunks(spec.scheme, N, K, spec.output_sizes, self.scratch_bytes).rows
        return 4 * (rows * K + max_m * (K + N))


def _describe(state: ReferenceState) -> str:
    plan, n = state.plan, len(state.plan.bounds)
    if not plan.bounded:
        why = f"cannot cut rows: {plan.reason}"
        return f"dequantize the whole weight ({state.weight.N} rows, fp32; {why}) + matmul"
    if n == 1:
        return f"dequantize the whole weight ({state.weight.N} rows, fp32) + matmul"
    return f"dequantize {plan.rows}-row slices (fp32, {n} chunks) + matmul"


def _linear(
    state: ReferenceState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    weight = state.weight
    x32 = x.to(torch.float32)
    if weight.scheme.act is not None:  # once per call, as quantrt.reference.linear does
        x32 = quantize_activations(x32, weight)
    y = torch.empty(x32.shape[0], weight.N, dtype=torch.float32, device=x32.device)
    for a, b, chunk in state.chunks:
        w = dequantize(chunk).to(x32.device)
        y[:, a:b] = x32 @ w.T
        del w
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(state.out_dtype) if out is None else out.copy_(y)
