"""``reference.quantize(w, scheme, search="mse")``: each group's range shrunk by the grid factor whose
round trip has the least squared error. Checked against a brute force written here in numpy
(float64, its own fp16 round-up of the scales), never worse than plain round to nearest, and
refused where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantrt import reference
from quantrt.errors import ReferenceInputError

GRID = [1 - i / 100 for i in range(21)]


def round_up_f16(x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float16)
    low = h.astype(np.float64) < x
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h.astype(np.float64)


def brute_force_scales(w: np.ndarray, bits: int, group: int, sym: bool) -> np.ndarray:
    """The per-group scale of the grid factor with the least squared round-trip error."""
    n, k = w.shape
    g = w.reshape(n, k // group, group).astype(np.float64)
    out = np.zeros((n, k // group))
    for r in range(n):
        for j in range(k // group):
            x = g[r, j].astype(np.float32).astype(np.float64)
            best = (np.inf, None)
            for p in GRID:
                hi, lo = np.float32(x.max() * np.float32(p)), np.float32(x.min() * np.float32(p))
                if sym:
                    half = 2 ** (bits - 1)
                    amax = max(abs(hi), abs(lo))
                    s = round_up_f16(np.array([amax / (half - 1) if amax > 0 else 1.0]))[0]
                    y = np.clip(np.round(np.float32(x / s)), 1 - half, half - 1) * s
                else:
                    qmax = 2**bits - 1
                    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
                    s = round_up_f16(np.array([(hi - lo) / qmax if hi > lo else 1.0]))[0]
                    z = np.clip(np.round(np.float32(-lo / s)), 0, qmax)
                    y = (np.clip(np.round(np.float32(x / s)) + z, 0, qmax) - z) * s
                err = float(np.square(np.float32(y) - x).sum())
                if err < best[0]:
                    best = (err, s)
            out[r, j] = best[1]
    return out


@pytest.mark.parametrize(("scheme", "bits", "group", "sym"), [("w4a16-int-g32-sym", 4, 32, True), ("w4a16-int-g64-asym", 4, 64, False), ("w3a16-int-g128-asym", 3, 128, False)])  # fmt: skip
def test_scales_equal_a_brute_force_search(scheme: str, bits: int, group: int, sym: bool) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 256, generator=g) * 0.03
    w[:, 7] *= 6  # outliers the search may clip
    w[2, :] = torch.distributions.StudentT(2.0).sample((256,)) * 0.01
    got = reference.quantize(w, scheme, search="mse")["scales"].double().numpy()
    want = brute_force_scales(w.numpy(), bits, group, sym)
    assert np.array_equal(got.reshape(want.shape), want)


@pytest.mark.parametrize(
    "scheme", ["w4a16-int-g128-asym", "w4a16-int-g128-sym", "w8a16-int-ch-sym", "w4a16-int-ch-asym"]
)
def test_never_worse_than_round_to_nearest(scheme: str) -> None:
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 512, generator=g) * 0.02
    w[:, ::61] *= 10
    G = 512 if "-ch-" in scheme else 128

    def group_err(c: torch.Tensor) -> torch.Tensor:
        return (reference.dequantize(c) - w).square().reshape(64, -1, G).sum(-1)

    plain, searched = reference.quantize(w, scheme), reference.quantize(w, scheme, search="mse")
    assert bool((group_err(searched) <= group_err(plain)).all())
    assert float(group_err(searched).sum()) < float(group_err(plain).sum())


def test_refusals() -> None:
    w = torch.randn(8, 128)
    with pytest.raises(ReferenceInputError, match="integer schemes"):
        reference.quantize(w, "w8a16-fp8-ch", search="mse")
    with pytest.raises(ReferenceInputError, match="without act-order"):
        reference.quantize(w, "w4a16-int-g128-sym-actorder", search="mse")
    with pytest.raises(ReferenceInputError, match="'mse'"):
        reference.quantize(w, "w4a16-int-g128-sym", search="hqq")
