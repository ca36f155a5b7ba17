"""Grouped kernels composed from linear ones: each expert runs on a linear kernel's prepared
layer, with its tokens gathered.

This is how the CPU runs experts (its native GEMV/GEMM kernels per expert, tokens grouped so each
expert's weights stream once per call), how the reference runs them, and how any scheme without a
fused grouped kernel runs on a GPU. :func:`experts_loop` makes the grouped kernel class from a
linear one; a vendor folder lists it where its order says. The loop reads how many assignments
each expert got on the host (:meth:`ExpertBatch.counts`), so it synchronises once per call:
right for CPUs, a fallback on GPUs, where the fused kernels capture into CUDA graphs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..kernels import Kernel, Verdict
from ..prepared import ALL_M, Prepared
from ..specs import LayerSpec
from .batch import ExpertBatch
from .canonical import CanonicalExperts
from .prepared import ExpertsStrategy, PreparedExperts


def linear_spec(spec: LayerSpec) -> LayerSpec:
    """One expert of a grouped layer, as a linear layer."""
    return replace(spec, op="linear", num_experts=1)


def prepare_loop(kernel: Kernel, weight: CanonicalExperts, spec: LayerSpec) -> PreparedExperts:
    """Every expert prepared by a linear ``kernel``, run one after another by one strategy."""
    lin = linear_spec(spec)
    states = [kernel.prepare(weight.expert(e), lin) for e in range(weight.E)]
    name = f"loop over experts: {states[0].strategies[-1].name}" if states else "loop over experts"
    return PreparedExperts(
        states,
        [ExpertsStrategy(ALL_M, name, _run)],
        E=weight.E,
        K=spec.K_part,
        N=spec.N_part,
        out_dtype=spec.output_dtype,
        act_dtypes=kernel.act_dtypes,
        device=weight.device if weight.tensors else "cpu",
        kernel=kernel.name,
    )


def _run(
    states: list[Prepared],
    x: torch.Tensor,
    batch: ExpertBatch,
    gather: bool,
    weighted: bool,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    ws: Any,
) -> torch.Tensor:
    N = states[0].N if states else 0
    y = out if out is not None else x.new_empty((batch.A, N), dtype=states[0].out_dtype)
    if batch.M == 1:  # decode: each expert serves one row, written in place (no sort, gather or scatter)
        return _one_token(states, x, batch, weighted, bias, y)
    order, _ = batch.sorted()
    counts = batch.counts()
    if sum(counts) < batch.A:  # assignments to experts another rank holds give zero rows
        y.zero_()
    start = 0
    for e, c in enumerate(counts):
        if not c:
            continue
        a = order[start : start + c]
        start += c
        r = a // batch.top_k if gather else a
        ye = states[e](x.index_select(0, r), None if bias is None else bias[e])
        if weighted:
            assert batch.weights is not None
            ye = (ye.to(torch.float32) * batch.weights.index_select(0, a).unsqueeze(1)).to(y.dtype)
        y.index_copy_(0, a, ye.to(y.dtype))
    return y


def _one_token(
    states: list[Prepared],
    x: torch.Tensor,
    batch: ExpertBatch,
    weighted: bool,
    bias: torch.Tensor | None,
    y: torch.Tensor,
) -> torch.Tensor:
    """One token's ``top_k`` assignments, each expert run on its row with ``out=`` its output row."""
    for a, e in enumerate(batch.ids.tolist()):
        row = x[0:1] if x.shape[0] == 1 else x[a : a + 1]
        if e >= len(states):
            y[a].zero_()
        else:
            states[e](row, None if bias is None else bias[e], y[a : a + 1])
    if weighted:
        assert batch.weights is not None
        y.copy_(y.to(torch.float32) * batch.weights.unsqueeze(1))
    return y


def experts_loop(linear: type[Kernel], name: str | None = None) -> type[Kernel]:
    """The grouped kernel that runs each expert on ``linear`` (same schemes, shapes and dtypes;
    every verdict is ``linear``'s on one expert)."""

    class ExpertsLoop(Kernel):
        ops = ("grouped",)
        act_dtypes = linear.act_dtypes
        out_dtypes = linear.out_dtypes
        emulated = linear.emulated
        quantizes_activations = linear.quantizes_activations
        description = f"{linear.name} on each expert, its tokens gathered"

        def __init__(self, caps: Any = None) -> None:
            super().__init__(caps)
            self.linear = linear(caps)

        @classmethod
        def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
            return linear.supports(linear_spec(spec), caps)

        @classmethod
        def is_substitute(cls, spec: LayerSpec) -> bool:
            return linear.is_substitute(linear_spec(spec))

        def prepare(self, weight: Any, spec: LayerSpec) -> Any:
            return prepare_loop(self.linear, weight, spec)

    ExpertsLoop.name = name or f"{linear.name}_experts"
    ExpertsLoop.__name__ = ExpertsLoop.__qualname__ = f"{linear.__name__}Experts"
    ExpertsLoop.__module__ = linear.__module__
    return ExpertsLoop
