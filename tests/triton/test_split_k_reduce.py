"""Split-K reduced inside the launch (``common.reduce_tile``) by the W8A8 GEMMs: the tile's last
program sums the partials and resets its arrival counter. Checked against an fp64 reference of the
same codes, against the same launch without split-K, across repeated calls that share one set of
counters (a counter left non-zero would make the wrong program finish the next call's tile), and on
the counter set itself. CPU: TRITON_INTERPRET=1 (programs one at a time); the GPU run (ci/gpu.sh
runs tests/triton) is where programs race for the counters.
"""

from __future__ import annotations

import threading

import pytest
import torch

from quantrt.backends.triton.common import TileConfig, TileCounters, split_k_tiles
from quantrt.backends.triton.fp8_mm import fp8_block_matmul, fp8_rowwise_matmul
from quantrt.backends.triton.int8_mm import int8_matmul
from quantrt.backends.triton.tile_table import BUCKETS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E4M3 = torch.float8_e4m3fn


def _operands(kind: str, M: int, N: int, K: int, g: torch.Generator) -> tuple:
    """(call(cfg, out_dtype, bias, counters), fp64 reference without bias) for one kernel."""
    if kind == "int8":
        xq = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        a = torch.rand(M, 1, generator=g) / 127 + 1e-3
        ws = torch.rand(N, generator=g) / 127 + 1e-3
        ref = (xq.double() * a.double()) @ (w.double() * ws.double()[:, None]).T
        args = [t.to(DEV) for t in (xq, a, w, ws)]
        return lambda cfg, dt, bias, cnt: int8_matmul(*args, bias, dt, cfg, counters=cnt), ref
    xq = (torch.randn(M, K, generator=g) * 40).to(E4M3)
    w = (torch.randn(N, K, generator=g) * 40).to(E4M3)
    if kind == "rowwise":
        a = torch.rand(M, 1, generator=g) / 448 + 1e-4
        ws = torch.rand(N, generator=g) / 448 + 1e-4
        ref = (xq.double() * a.double()) @ (w.double() * ws.double()[:, None]).T
        args = [t.to(DEV) for t in (xq, a, w, ws)]
        return lambda cfg, dt, bias, cnt: fp8_rowwise_matmul(*args, bias, dt, cfg, counters=cnt), ref
    xs = torch.rand(M, -(-K // 64), generator=g) / 448 + 1e-4
    wsb = torch.rand(-(-N // 64), -(-K // 64), generator=g) / 448 + 1e-4
    xd = xq.double() * xs.double().repeat_interleave(64, 1)[:, :K]
    wd = w.double() * wsb.double().repeat_interleave(64, 0)[:N].repeat_interleave(64, 1)[:, :K]
    args = [t.to(DEV) for t in (xq, xs, w, wsb)]
    return lambda cfg, dt, bias, cnt: fp8_block_matmul(
        *args, (64, 64), bias, dt, cfg, counters=cnt
    ), xd @ wd.T


@pytest.mark.parametrize("kind", ["rowwise", "block", "int8"])
def test_reduce_in_launch_repeats_with_shared_counters(kind: str) -> None:
    """Several M (one and two M-tiles, ragged N and K) through one counter set, twice each: every
    result matches the reference and the split_k=1 launch, and the counters are zero after each."""
    g = torch.Generator().manual_seed(31)
    N, K = 72, 320  # 3 n-tiles of 32 (the last ragged); 5 k-tiles of 64
    counters = TileCounters(2, torch.device(DEV))  # fewer than the launches need: grows
    for M in (1, 5, 19):
        call, ref = _operands(kind, M, N, K, g)
        bias = torch.randn(N, generator=g)
        ref = ref + bias.double()
        for dt in (torch.float32, torch.float16):
            one = call(TileConfig(16, 32, 64), dt, bias.to(DEV), None)
            for split in (2, 5):
                cfg = TileConfig(16, 32, 64, split_k=split)
                for _ in range(2):
                    y = call(cfg, dt, bias.to(DEV), counters)
                    err = float((y.double().cpu() - ref).norm() / ref.norm())
                    assert err < (1e-3 if dt == torch.float16 else 1e-6), (M, dt, split, err)
                    assert float((y.double() - one.double()).abs().max().cpu()) <= (
                        1e-3 * float(one.double().abs().max()) if dt == torch.float16 else 1e-4
                    )
                    assert int(counters.get(0).abs().sum()) == 0, "a counter was not reset"


@pytest.mark.parametrize("kind", ["rowwise", "int8"])
def test_reduce_in_launch_is_deterministic(kind: str) -> None:
    """The last program sums the partials in pid_k order: the same call gives the same bits."""
    g = torch.Generator().manual_seed(32)
    call, _ = _operands(kind, 3, 96, 512, g)
    cfg = TileConfig(16, 32, 64, split_k=4)
    counters = TileCounters(0, torch.device(DEV))
    first = call(cfg, torch.float32, None, counters)
    for _ in range(3):
        assert torch.equal(call(cfg, torch.float32, None, counters), first)


def test_counters_grow_keep_old_sets_and_are_per_thread() -> None:
    c = TileCounters(4, torch.device(DEV))
    t = c.get(3)
    assert t.numel() == 4 and t.dtype == torch.int32 and int(t.abs().sum()) == 0
    assert c.get(4) is t
    bigger = c.get(5)
    assert bigger.numel() >= 8 and int(bigger.abs().sum()) == 0 and bigger is not t
    assert any(k is t for k in c._kept)  # a graph captured with the old set still has it
    other: list[torch.Tensor] = []
    th = threading.Thread(target=lambda: other.append(c.get(2)))
    th.start()
    th.join()
    assert other[0] is not bigger and int(other[0].abs().sum()) == 0


def test_split_k_tiles_sizes_the_largest_split_launch() -> None:
    cfg = [
        TileConfig(16, 64, 128, split_k=4),  # M <= 1: 1 x 16 tiles for N = 1000
        TileConfig(16, 64, 128, split_k=2),  # M <= 16: 1 x 16
        TileConfig(64, 64, 128, split_k=2),  # M <= 64: 1 x 16
        TileConfig(64, 128, 128),  # no split: not counted
        TileConfig(128, 128, 128),
    ]
    assert split_k_tiles(BUCKETS, cfg, 1000) == 16
    cfg[1] = TileConfig(16, 32, 128, split_k=2)  # 1 x 32 tiles
    assert split_k_tiles(BUCKETS, cfg, 1000) == 32
    cfg[4] = TileConfig(128, 128, 128, split_k=2)  # unbounded: its first 256 rows, 2 x 8
    assert split_k_tiles(BUCKETS, cfg, 1000) == 32
    assert split_k_tiles(BUCKETS, [TileConfig(16, 16, 32)] * 5, 1000) == 0
