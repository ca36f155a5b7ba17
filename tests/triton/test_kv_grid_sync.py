"""How ``decode_kv`` hands the vendor's grid sync to its two launches, on the CPU with the launches
captured instead of run: the decode signals and the combine waits, compiled for a programmatic
dependent launch, only where there is a combine, a grid sync given, and no
``QUANTRT_KV_EARLY_COMBINE=0``. (That the compiled kernels hold the instructions is
tests/triton/test_kv_compiles.py's; that the pair runs right, tests/gpu/test_kv_cuda.py's. Here,
beside the other Triton tests, so this module's import of Triton comes after tests/triton's
conftest has chosen the interpreter for the process: an import from elsewhere first would leave
every later Triton test of the process compiling for a GPU that is not there.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from quantrt.backends.triton import kv
from quantrt.kv.pages import KVPages
from quantrt.schemes import parse_kv_scheme

SIGNAL, WAIT = object(), object()  # stand-ins: only their hand-over is checked here


def _launches(monkeypatch: pytest.MonkeyPatch, splits: int, grid_sync: Any) -> dict[str, dict]:
    got: dict[str, dict] = {}
    monkeypatch.setattr(kv, "_interpreted", lambda: False)
    monkeypatch.setattr(kv, "_decode_launch", lambda grid, *a, **meta: got.setdefault("decode", meta))
    monkeypatch.setattr(kv, "_combine_launch", lambda grid, *a, **meta: got.setdefault("combine", meta))
    scheme = parse_kv_scheme("kv-fp8")
    H, G, D, T = 2, 4, 64, 256
    pages = KVPages(scheme, T // 16, 16, H, D, dtype=torch.float16)
    kv.decode_kv(
        torch.randn(1, H * G, D, dtype=torch.float16), scheme, pages.flat(), 16,
        torch.arange(T // 16, dtype=torch.int32)[None], torch.full((1,), T, dtype=torch.int32), T,
        scale=D**-0.5, k_scale=torch.ones(1), v_scale=torch.ones(1),
        config=kv.DecodeConfig(32, splits), grid_sync=grid_sync,
    )  # fmt: skip
    return got


def test_the_combine_launches_early_with_a_grid_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    got = _launches(monkeypatch, 4, (SIGNAL, WAIT))
    assert got["decode"]["LAUNCH"] is SIGNAL
    assert got["combine"]["WAIT"] is WAIT and got["combine"]["launch_pdl"] is True


@pytest.mark.parametrize("case", ["no grid sync", "switched off", "one split"])
def test_the_combine_launches_after_otherwise(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    if case == "switched off":
        monkeypatch.setattr(kv, "_EARLY", False)
    got = _launches(
        monkeypatch, 1 if case == "one split" else 4, None if case == "no grid sync" else (SIGNAL, WAIT)
    )
    assert got["decode"]["LAUNCH"] is kv._no_grid_sync
    if case == "one split":  # the decode finishes itself: no combine to launch
        assert "combine" not in got
    else:
        assert got["combine"]["WAIT"] is kv._no_grid_sync and "launch_pdl" not in got["combine"]
