"""Shared helpers for the reference tests: seeded random inputs and the agreed error measure."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref||_F / ||ref||_F`` in float64, the project's output-error measure."""
    y64, r64 = y.detach().to(torch.float64), ref.detach().to(torch.float64)
    return float(torch.linalg.vector_norm(y64 - r64) / torch.linalg.vector_norm(r64))


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded CPU generator per test, so every test sees the same random inputs."""
    return torch.Generator().manual_seed(20240531)


@pytest.fixture
def rel_err() -> Callable[[torch.Tensor, torch.Tensor], float]:
    return _rel_err


def _fp8_round(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round-to-nearest-even onto the fp8 grid, saturating, computed from the format's definition.

    e4m3fn: 3 mantissa bits, smallest normal exponent -6, max 448; e5m2: 2 bits, -14, 57344.
    Works in float64 from frexp (no fp8 dtype involved), so it checks torch's casts independently.
    """
    mant, emin, fmax = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}[fmt]
    x = v.to(torch.float64)
    a = x.abs()
    _, ex = torch.frexp(a)  # a = m * 2^ex with m in [0.5, 1): the leading bit is 2^(ex - 1)
    e = torch.clamp(ex.to(torch.float64) - 1, min=emin)
    step = torch.exp2(e - mant)
    r = torch.clamp(torch.round(a / step) * step, max=fmax)  # torch.round is round-half-even
    return torch.where(torch.isnan(x), x, torch.copysign(r, x))


@pytest.fixture
def fp8_round() -> Callable[[torch.Tensor, str], torch.Tensor]:
    return _fp8_round
