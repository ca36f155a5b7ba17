"""The one-launch routing preparation (``backends/triton/moe_align.py``) against ExpertBatch's torch
ops: ``order``, ``offsets``, ``sorted_ids``, ``block_expert`` and ``num_padded`` equal element for
element, dtype and shape (so every consumer reads the same orders, stable within an expert), on
random routings with ids held elsewhere (-1, E, beyond), E off every power of two, one assignment
and none, tiles of 1 to 64 rows, top_k 1/2/8, E = 128 with a few tokens (decode) and many tokens per
expert; and the fused MoE kernels taking it, cached on the batch for the second projection."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_moe import CudaTritonMoeWNA16
from quantrt.backends.triton import moe_align
from quantrt.backends.triton.moe_align import align_routing, padded_length
from quantrt.moe import CanonicalExperts, ExpertBatch, PreparedExperts
from quantrt.specs import LayerSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("order", "offsets", "sorted_ids", "block_expert", "num_padded")


def routing(M: int, k: int, E: int, g: torch.Generator, unheld: float, dtype: torch.dtype) -> torch.Tensor:
    """Distinct experts per token (as a router picks them), some replaced by ids held elsewhere."""
    ids = torch.stack([torch.randperm(E, generator=g)[: min(k, E)] for _ in range(M)]) if M else None
    if ids is None or k > E:  # more slots than experts: repeats
        ids = torch.randint(0, E, (M, k), generator=g)
    drop = torch.rand(M, k, generator=g) < unheld
    other = torch.tensor([-1, E, E + 1, 1 << 20])[torch.randint(0, 4, (M, k), generator=g)]
    return torch.where(drop, other, ids).to(dtype)


def check(ids: torch.Tensor, E: int, block: int) -> None:
    batch = ExpertBatch(ids.reshape(-1, ids.shape[-1]) if ids.dim() == 2 else ids.reshape(-1, 1), None, E)
    want = (*batch.sorted(), *batch.aligned(block))
    got = align_routing(ids.to(DEV), E, block)
    assert got[2].numel() == padded_length(batch.A, E, block)
    for name, x, y in zip(NAMES, got, want):
        assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x.cpu(), y), (name, x.cpu().tolist(), y.tolist())


# (M, top_k, E, block, unheld fraction)
CASES = [
    (1, 1, 1, 16, 0.0),  # one assignment, one expert
    (1, 1, 3, 16, 1.0),  # its expert held elsewhere
    (0, 2, 4, 16, 0.0),  # no assignment
    (1, 8, 128, 16, 0.0),  # decode on a Qwen3-30B-A3B-sized layer
    (3, 8, 128, 32, 0.2),
    (16, 8, 128, 64, 0.1),
    (5, 2, 7, 16, 0.3),
    (9, 1, 5, 32, 0.0),
    (13, 3, 33, 64, 0.25),  # E just past a power of two
    (4, 2, 32, 4, 0.0),  # E a power of two; a tile that is no power of two's multiple of 16
    (6, 8, 5, 1, 0.2),  # tiles of one row; top_k above E (repeated experts)
    (20, 4, 9, 3, 0.1),  # a block that is not a power of two
    (10, 2, 6, 2, 0.1),  # at most one padding slot per run
    (128, 2, 3, 16, 0.05),  # many assignments per expert
    (40, 8, 2, 64, 0.5),  # many per expert, half held elsewhere
]


@pytest.mark.parametrize(("M", "k", "E", "block", "unheld"), CASES, ids=[str(c) for c in CASES])
def test_matches_expert_batch(M: int, k: int, E: int, block: int, unheld: float) -> None:
    g = torch.Generator().manual_seed(M * 1009 + k * 101 + E * 7 + block)
    check(routing(M, k, E, g, unheld, torch.int32), E, block)


def test_ids_of_any_integer_dtype_and_layout() -> None:
    """int64 and int16 ids, a transposed (non-contiguous) view, and flat [A] ids read in place."""
    g = torch.Generator().manual_seed(11)
    E, block = 6, 16
    check(routing(7, 3, E, g, 0.2, torch.int64), E, block)
    check(routing(5, 2, E, g, 0.2, torch.int16), E, block)
    t = routing(4, 6, E, g, 0.2, torch.int32).t()  # [6, 4] with strides (1, 6)
    assert not t.is_contiguous()
    check(t, E, block)
    check(routing(9, 1, E, g, 0.2, torch.int32).reshape(-1), E, block)


def test_every_expert_full_and_all_unheld() -> None:
    """Runs that fill their tiles exactly (no padding) and a routing with nothing held here."""
    ids = torch.arange(4).repeat_interleave(16).reshape(-1, 2).to(torch.int32)  # 16 per expert
    check(ids, 4, 16)
    check(torch.full((3, 4), -1, dtype=torch.int32), 5, 16)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="integer ids"):
        align_routing(torch.zeros(2, 2), 3, 16)
    with pytest.raises(ValueError, match="E >= 1"):
        align_routing(torch.zeros(2, 2, dtype=torch.int32), 0, 16)
    with pytest.raises(ValueError, match="at most"):
        align_routing(torch.zeros(moe_align.MAX_A + 1, 1, dtype=torch.int32), 3, 16)
    assert not moe_align.takes(torch.zeros(moe_align.MAX_A + 1, 1, dtype=torch.int32, device=DEV))


def _layer(E: int, K: int, N: int, g: torch.Generator) -> PreparedExperts:
    ws = [reference.quantize(torch.randn(N, K, generator=g) * 0.05, "w4a16-int-g32-sym") for _ in range(E)]
    experts = CanonicalExperts.stack(ws)
    spec = LayerSpec(experts.scheme, K, N, act_dtype=torch.float16, op="grouped", num_experts=E)
    return CudaTritonMoeWNA16().prepare(experts.to(DEV), spec)


def test_fused_moe_takes_it_and_caches_on_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first projection launches it once and leaves the batch's caches filled with equal values;
    the second projection (and ``batch.sorted()``) reuses them; past MAX_A the torch ops run."""
    g = torch.Generator().manual_seed(5)
    E, K, N, M, top_k = 5, 64, 32, 3, 2
    state = _layer(E, K, N, g)
    calls = []
    takes, launch = state.layout.align

    def counted(*args: object, **kw: object) -> tuple:
        calls.append(args)
        return launch(*args, **kw)

    state.layout = dataclasses.replace(state.layout, align=(takes, counted))
    ids = routing(M, top_k, E, g, 0.2, torch.int32).to(DEV)
    batch = ExpertBatch(ids, torch.rand(M, top_k, generator=g).to(DEV), E)
    x = torch.randn(M, K, generator=g).to(DEV, torch.float16)
    y1 = state(x, batch, gather=True)
    assert len(calls) == 1 and batch._sorted is not None and len(batch._aligned) == 1
    (block,) = batch._aligned
    fresh = ExpertBatch(ids.cpu(), None, E)
    cached = (*batch.sorted(), *batch.aligned(block))
    for name, x_, y_ in zip(NAMES, cached, (*fresh.sorted(), *fresh.aligned(block))):
        assert torch.equal(x_.cpu(), y_), name
    y2 = state(x, batch, gather=True)
    assert len(calls) == 1 and torch.equal(y1, y2)

    monkeypatch.setattr(moe_align, "MAX_A", M * top_k - 1)
    other = ExpertBatch(ids, None, E)
    assert torch.equal(state(x, other, gather=True), y1)
    assert len(calls) == 1  # the torch ops served it
