"""AITER's kernels plan only where ``aiter`` is importable, rank first for the fp8 schemes they take,
and hand AITER the operands its API takes (shapes, the device's fp8 flavour, scale layouts). The
``aiter`` here is a fake with AITER's function names that records its calls and returns zeros: it
tests the registration and plumbing, never numerics (no AMD GPU here)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from quantrt import reference
from quantrt.backends.rocm.aiter_ops import RocmAiterBlockFp8, RocmAiterFp8
from quantrt.backends.rocm.policy import RocmPolicy, arch_target
from quantrt.capability import load_preset
from quantrt.dispatch import select
from quantrt.env import Overrides
from quantrt.plans import layer_spec


def _with_aiter(preset: str):
    caps = load_preset(preset)
    dev = dataclasses.replace(caps.default_device, libraries=caps.default_device.libraries | {"aiter"})
    return dataclasses.replace(caps, accelerators=[dev])


@pytest.fixture
def fake_aiter(monkeypatch):
    calls: list[tuple[str, tuple, dict]] = []

    def gemm_a8w8_CK(xq, wq, x_scale, w_scale, bias=None, dtype=torch.bfloat16):
        calls.append(("gemm_a8w8_CK", (xq, wq, x_scale, w_scale, bias), {"dtype": dtype}))
        return torch.zeros(xq.shape[0], wq.shape[0], dtype=dtype)

    def gemm_a8w8_blockscale(xq, wq, x_scale, w_scale, dtype=torch.bfloat16):
        calls.append(("gemm_a8w8_blockscale", (xq, wq, x_scale, w_scale), {"dtype": dtype}))
        return torch.zeros(xq.shape[0], wq.shape[0], dtype=dtype)

    mod = types.SimpleNamespace(gemm_a8w8_CK=gemm_a8w8_CK, gemm_a8w8_blockscale=gemm_a8w8_blockscale)
    monkeypatch.setitem(sys.modules, "aiter", mod)
    return calls


@pytest.mark.parametrize("preset", ["mi300x", "mi355x"])
def test_plans_aiter_only_where_importable(preset: str) -> None:
    ov = Overrides.from_env({})
    for scheme, aiter in (("w8a8-fp8-ch", "rocm.aiter_fp8"), ("w8a8-fp8-block128", "rocm.aiter_block_fp8")):
        spec = layer_spec(scheme, 4096, 4096)
        without = select(spec, "cuda:0", load_preset(preset), ov)
        assert not without.kernel.name.startswith("rocm.aiter")
        rejected = {c.name: c.verdict for c in without.candidates}[aiter]
        assert not rejected.ok and "aiter importable" in rejected.predicate
        assert select(spec, "cuda:0", _with_aiter(preset), ov).kernel.name == aiter
    # weight-only schemes are not AITER's
    spec = layer_spec("w4a16-int-g128-asym", 4096, 4096)
    assert select(spec, "cuda:0", _with_aiter(preset), ov).kernel.name == "rocm.triton_w4a16"


def test_block_fp8_needs_aiters_block() -> None:
    spec = layer_spec("w8a8-fp8-block128", 4096, 4096)
    spec = dataclasses.replace(spec, scheme=dataclasses.replace(spec.scheme, block=(64, 128), act_group=128))
    v = RocmAiterBlockFp8.supports(spec, _with_aiter("mi300x").default_device)
    assert not v.ok and "128x128" in v.predicate


def _pinned(cls: type, arch: str) -> type:
    return type(cls.__name__ + "Pinned", (cls,), {"policy": RocmPolicy(arch_target(arch))})


def test_operands_handed_to_aiter_on_gfx942(fake_aiter) -> None:
    g = torch.Generator().manual_seed(0)
    canon = reference.quantize(torch.randn(64, 256, generator=g), "w8a8-fp8-ch")
    k = _pinned(RocmAiterFp8, "gfx942")()
    state = k.prepare(canon, layer_spec("w8a8-fp8-ch", 256, 64, act_dtype=torch.bfloat16, bias=True))
    y = k.apply(state, torch.randn(5, 256, generator=g).bfloat16(), torch.ones(64).bfloat16())
    name, (xq, wq, xs, ws, bias), kw = fake_aiter[-1]
    assert name == "gemm_a8w8_CK" and bias is None and kw["dtype"] == torch.bfloat16
    assert xq.dtype == wq.dtype == torch.float8_e4m3fnuz and xq.shape == (5, 256) and wq.shape == (64, 256)
    assert xs.shape == (5, 1) and ws.shape == (1, 64) and xs.dtype == ws.dtype == torch.float32
    assert torch.equal(ws.reshape(-1), canon["scales"].float().reshape(-1) * 2)  # fnuz: doubled
    assert torch.equal(y, torch.ones(5, 64, dtype=torch.bfloat16))  # the bias added after AITER's GEMM

    canon = reference.quantize(torch.randn(256, 384, generator=g), "w8a8-fp8-block128")
    k = _pinned(RocmAiterBlockFp8, "gfx950")()
    state = k.prepare(canon, layer_spec("w8a8-fp8-block128", 384, 256, act_dtype=torch.bfloat16))
    k.apply(state, torch.randn(3, 384, generator=g).bfloat16())
    name, (xq, wq, xs, ws), kw = fake_aiter[-1]
    assert name == "gemm_a8w8_blockscale" and xq.dtype == torch.float8_e4m3fn  # gfx950: OCP
    assert xs.shape == (3, 3) and ws.shape == (2, 3)
