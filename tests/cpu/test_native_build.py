"""The native CPU build (backends/cpu/native/build.py): a library builds here, runs on the caller's
thread count, targets the ISA the probe reports, and a broken source fails loudly; a build says so on
stderr, a killed build's lock does not block later ones, and the cache key covers the install."""

import ctypes
import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import time

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


# -- the build cache, its lock, and what a build says ------------------------------------------------


def _build_smoke(env: dict[str, str]) -> subprocess.CompletedProcess:
    """build.library("smoke") in a fresh process (bounded: a wait on a lock fails the test, not hangs it)."""
    code = "from quantrt.backends.cpu.native import build; build.library('smoke')"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_fresh_build_says_so_and_a_killed_builders_lock_is_cleared(tmp_path, monkeypatch):
    """A build dir left as a killed build leaves it (torch's lock file, our lock naming a dead pid):
    the next process warns, removes the lock and builds, saying so on stderr; a lock whose writer
    still runs is cleared once older than the bound; a cached build says nothing."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    d = build.build_dir("smoke")
    d.mkdir(parents=True)
    (d / build.TORCH_LOCK_NAME).touch()
    (d / build.LOCK_NAME).write_text(f"{_dead_pid()} {socket.gethostname()}\n")
    r = _build_smoke(env)
    assert r.returncode == 0, r.stderr
    assert "removing the stale build lock" in r.stderr and "no longer running" in r.stderr, r.stderr
    assert f"quantrt: compiling native CPU kernels 'smoke' (smoke.cpp) in {d}" in r.stderr, r.stderr
    assert re.search(r"quantrt: built native CPU kernels 'smoke' in \d+\.\d s", r.stderr), r.stderr
    assert not (d / build.TORCH_LOCK_NAME).exists() and (d / f"{d.name}.so").is_file()

    lock = d / build.TORCH_LOCK_NAME
    lock.touch()
    old = time.time() - build.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    (d / build.LOCK_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live (reused) pid
    r = _build_smoke(env)
    assert r.returncode == 0, r.stderr
    assert "removing the stale build lock" in r.stderr and "older than" in r.stderr, r.stderr
    assert "compiling" not in r.stderr, r.stderr  # cached
    assert not lock.exists()


def test_a_running_build_is_waited_for_within_a_bound(tmp_path):
    """Another process's build (a held flock) is waited for, then reported, not waited on forever."""
    with open(tmp_path / build.LOCK_NAME, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242 builder-host\n")
        held.flush()
        with pytest.raises(
            build.NativeBuildError, match=r"waited 0.3 s .* 'smoke' .* by pid 4242 on builder-host"
        ):
            with build.build_lock(tmp_path, "smoke", wait_s=0.3):
                pass
    with build.build_lock(tmp_path, "smoke", wait_s=0.3):  # released: taken at once, naming its holder
        assert (tmp_path / build.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    assert (tmp_path / build.LOCK_NAME).read_text() == ""  # names no builder once done


def test_the_build_key_covers_sources_flags_and_install_location(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    here = build.build_dir("smoke")
    assert here.parent == tmp_path / "ext" and here.name.startswith("quantrt_smoke_")
    assert build.build_dir("smoke") == here
    copies = []
    for name in ("a", "b"):
        shutil.copytree(build.CSRC, tmp_path / name)
        monkeypatch.setattr(build, "CSRC", tmp_path / name)
        copies.append(build.build_dir("smoke"))
    assert len({here, *copies}) == 3  # same sources, three install locations
    (tmp_path / "b" / "smoke.cpp").write_text((tmp_path / "b" / "smoke.cpp").read_text() + "\n// changed\n")
    assert build.build_dir("smoke") != copies[1]
    monkeypatch.setattr(build, "CSRC", tmp_path / "a")
    avx2 = build.build_dir("smoke", "avx2")  # another ISA level: another library, named for it
    assert avx2 != copies[0] and avx2.name.startswith("quantrt_smoke-avx2_")
    monkeypatch.setattr(build, "BASE_CFLAGS", (*build.BASE_CFLAGS, "-DQUANTRT_TEST_FLAG"))
    assert build.build_dir("smoke") != copies[0]
