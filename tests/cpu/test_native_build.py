"""The native CPU build (backends/cpu/native/build.py): a library builds here, runs on the caller's
thread count, targets the ISA the probe reports, and a broken source fails loudly."""

import ctypes

import pytest
import torch

from quantrt.backends.cpu.native import build
from quantrt.capability import probe


def test_builds_and_runs_with_the_threads_asked():
    ok, why = build.status()
    assert ok, why  # CI machines have a compiler: the native kernels must be tested, not skipped
    lib = build.library("smoke")
    lib.quantrt_smoke_scale.restype = ctypes.c_int32
    x = torch.randn(10_001)
    for threads in (1, 2):
        y = torch.full_like(x, float("nan"))
        ran = lib.quantrt_smoke_scale(
            ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel()),
            ctypes.c_float(-1.5), ctypes.c_int32(threads),
        )  # fmt: skip
        assert ran == threads
        assert torch.equal(y, x * -1.5)
    assert build.library("smoke") is lib  # once per process


def test_isa_matches_the_probe():
    lib = build.library("smoke")
    bits = lib.quantrt_smoke_isa()
    feats = probe().cpu.features
    assert bool(bits & 1) == ("avx2" in feats)
    assert bool(bits & 2) == ("avx512f" in feats)
    assert bool(bits & 4) == ("avx512_vnni" in feats)
    assert bool(bits & 8) == ("avx512_bf16" in feats)


def test_a_failing_build_names_the_library(tmp_path, monkeypatch):
    (tmp_path / "broken.cpp").write_text('extern "C" int f() { return undefined_name; }\n')
    monkeypatch.setattr(build, "CSRC", tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    with pytest.raises(build.NativeBuildError, match="building native CPU kernels 'broken' failed"):
        build.library("broken")
    with pytest.raises(build.NativeBuildError, match="no source"):
        build.library("missing")


def test_no_compiler_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-quantrt")
    ok, why = build.status()
    assert not ok and "no-such-compiler-quantrt" in why
