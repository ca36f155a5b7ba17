"""Timing shared by the CPU micro-benchmarks (``bench/cpu_*.py``): every method of one row runs in
the same process, interleaved repeat by repeat, so noise from other work on the machine hits them
alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def median_ms(fns: dict[str, Callable[[], object]], repeats: int, warmups: int = 2) -> dict[str, float]:
    """Median wall time of each function in ms, run round-robin ``repeats`` times after the warm-ups."""
    for f in fns.values():
        for _ in range(warmups):
            f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def time_row(layers: dict[str, tuple[object, object]], K: int, M: int, repeats: int) -> dict[str, float]:
    """Median ms of every method on one bf16 batch of M rows, run side by side; a method is
    (kernel, state), or (None, dense weight) for ``F.linear``."""
    x = torch.randn(M, K).to(torch.bfloat16)
    fns: dict[str, Callable[[], object]] = {}
    for name, (k, st) in layers.items():
        if k is None:
            fns[name] = lambda st=st: F.linear(x, st)
        else:
            fns[name] = lambda k=k, st=st: k.apply(st, x)  # type: ignore[attr-defined]
    return median_ms(fns, repeats)
