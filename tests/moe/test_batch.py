"""ExpertBatch's orders, checked element by element against their definitions on random routings
(ids outside [0, E) are experts another rank holds)."""

from __future__ import annotations

import pytest
import torch

from quantrt.moe import ExpertBatch


def routing(M: int, k: int, E: int, seed: int, unheld: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E + 3, generator=g)[:k] for _ in range(M)]) if M else torch.empty(0, k)
    ids = ids.long() % (E + 3)  # some land on E, E+1, E+2: not held here
    if unheld:
        drop = torch.rand(ids.shape, generator=g) < unheld
        ids = torch.where(drop, torch.full_like(ids, -1), ids)
    return ids.to(torch.int32)


@pytest.mark.parametrize(
    ("M", "k", "E"), [(1, 1, 1), (1, 2, 5), (7, 2, 3), (33, 4, 9), (64, 8, 16), (0, 2, 4)]
)
def test_sorted(M: int, k: int, E: int) -> None:
    ids = routing(M, k, E, M * 31 + k)
    b = ExpertBatch(ids, None, E)
    order, offsets = b.sorted()
    flat = ids.reshape(-1).long()
    held = (flat >= 0) & (flat < E)
    assert sorted(order.tolist()) == list(range(M * k))
    for e in range(E):
        mine = order[offsets[e] : offsets[e + 1]].tolist()
        assert mine == sorted(mine) == torch.nonzero(flat == e).reshape(-1).tolist()
    assert int(offsets[E]) == int(held.sum())
    assert b.counts() == [int((flat == e).sum()) for e in range(E)]


@pytest.mark.parametrize("block", [1, 4, 16, 64])
@pytest.mark.parametrize(("M", "k", "E"), [(1, 2, 5), (13, 3, 7), (40, 8, 16), (3, 2, 50)])
def test_aligned(M: int, k: int, E: int, block: int) -> None:
    ids = routing(M, k, E, M + k + E + block, unheld=0.2)
    b = ExpertBatch(ids, torch.rand(M, k), E)
    sorted_ids, block_expert, num_padded = b.aligned(block)
    A = M * k
    flat = ids.reshape(-1).long()
    P = sorted_ids.numel()
    assert P % block == 0 and P >= A + E * (block - 1) and block_expert.numel() == P // block
    n = int(num_padded)
    assert n % block == 0 and n <= P
    seen = []
    for t in range(P // block):
        tile = sorted_ids[t * block : (t + 1) * block].tolist()
        real = [a for a in tile if a != A]
        if t * block >= n:
            assert not real and int(block_expert[t]) == E
            continue
        e = int(block_expert[t])
        assert 0 <= e < E and real, (t, tile)
        assert all(int(flat[a]) == e for a in real)
        assert tile[: len(real)] == real  # padding only at a run's end
        seen += real
    held = [a for a in range(A) if 0 <= int(flat[a]) < E]
    assert sorted(seen) == held
    assert b.aligned(block)[0] is sorted_ids  # cached for the second projection


def test_bad_batches() -> None:
    with pytest.raises(ValueError, match=r"topk_ids \[M, top_k\]"):
        ExpertBatch(torch.zeros(4, dtype=torch.int32), None, 2)
    with pytest.raises(ValueError, match="must match topk_ids"):
        ExpertBatch(torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, 3), 2)
