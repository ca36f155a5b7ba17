"""Native CPU kernels: C++ sources in ``csrc/`` built on first use and cached.

Each ``csrc/<name>.cpp`` is one shared library of plain ``extern "C"`` functions taking raw
pointers, sizes and a thread count; Python calls them through ``ctypes`` with tensors' data
pointers. The sources include no torch header, so a build takes seconds, not minutes, and the C ABI
keeps the calls cheap. torch's ``cpp_extension`` does the building (ninja, its compiler checks)
and the caching (``TORCH_EXTENSIONS_DIR``, rebuilt when a source or a flag changes).

Built with ``-march=native`` by default: the library uses every ISA extension of the CPU it was built
on, so the build name carries a hash of that CPU's feature flags and a cache moved to another machine
is rebuilt, never run on a CPU without the instructions. A library may also be built for a lower ISA
level (``library(name, isa="avx2")``): the same source then compiles its paths for that level. The kernels themselves check the features
they need at run time through the probe (their ``supports``), not here.

Policy (issue: no silent fallbacks): when no C++ compiler exists, :func:`status` says so and the
native kernels answer ``supports`` with that reason, so dispatch picks the pure-torch kernels. When
a compiler exists and a build fails, :func:`library` raises :class:`NativeBuildError` with the
compiler's output, and a test that uses the kernel fails.

The build directory's name hashes the sources, the flags, the CPU's features and where quantrt and
torch are installed: the generated ``build.ninja`` names the sources and torch's libraries by their
paths, so two installs sharing a cache would otherwise rebuild each other's library under each other.
A build says so on stderr (the library, then the time it took: seconds, up to about 15 s). Builders of one
directory take turns through a ``flock`` on ``quantrt-build.lock`` there, which the kernel releases
when its holder dies; torch's own lock file (``lock``, created and removed around its build) is then
only ever left behind by a builder that was killed, and is removed with a warning instead of making
every later process wait on it forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
#: -fopenmp: the kernels' threads (the count is an argument)
BASE_CFLAGS = ("-O3", "-fopenmp", "-std=c++17", "-fno-math-errno")
#: the ISA a library is built for: ``native`` is the host's own (-march=native); a lower level builds
#: the same source for every CPU of that level, so its kernels run (and are tested) on a CPU above it.
#: ``avx2`` is x86-64-v3: AVX2, FMA, F16C, BMI2 (Haswell, Zen 1 and later), tuned for the host.
#: ``avx2_vnni`` adds AVX-VNNI (VEX VPDPBUSD on ymm: Alder Lake and later client cores, Sierra Forest,
#: Zen 5) for the gguf library only. ``avx2_vnni_twin`` is for tests and benchmarks: x86-64-v3 code
#: whose VPDPBUSD is the EVEX (AVX-512 VNNI) encoding, so an AVX-512 CPU runs what an AVX-VNNI one
#: would (csrc/gguf.cpp's QRT_VNNI_EVEX_TWIN); it needs AVX-512 VNNI and VL at run time.
ISA_CFLAGS = {
    "native": ("-march=native",),
    "avx2": ("-march=x86-64-v3", "-mtune=native"),
    "avx2_vnni": ("-march=x86-64-v3", "-mavxvnni", "-mtune=native"),
    "avx2_vnni_twin": ("-march=x86-64-v3", "-mtune=native", "-DQRT_VNNI_EVEX_TWIN"),
}
LDFLAGS = ("-fopenmp",)
#: our lock file in a build directory (a flock, with its holder's pid and host written in it)
LOCK_NAME = "quantrt-build.lock"
#: torch's lock file in a build directory (cpp_extension's FileBaton)
TORCH_LOCK_NAME = "lock"
#: a torch lock whose writer may still run is taken as stale once this old (a build takes ~15 s)
STALE_LOCK_S = 300.0
#: how long a process waits for another, running one to finish building the same library
LOCK_WAIT_S = 900.0

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


class NativeBuildError(RuntimeError):
    """A native CPU kernel library failed to build although a compiler is present."""


def compiler() -> str | None:
    """The C++ compiler torch's cpp_extension would use ($CXX, else c++), if it exists."""
    cxx = os.environ.get("CXX", "c++")
    return shutil.which(cxx)


def status() -> tuple[bool, str]:
    """(native kernels can be built here, why not). Cheap: no build happens."""
    if not sys.platform.startswith("linux"):
        return False, f"native CPU kernels are built for Linux only (platform {sys.platform})"
    if compiler() is None:
        return False, f"no C++ compiler ({os.environ.get('CXX', 'c++')} not on PATH)"
    if shutil.which("ninja") is None:
        return False, "ninja not on PATH (torch's cpp_extension builds with it)"
    return True, "a C++ compiler and ninja are present"


def _cpu_flags_hash() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "nocpuinfo"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def cflags(isa: str = "native") -> tuple[str, ...]:
    """The compiler flags of a library built for ``isa`` (a key of :data:`ISA_CFLAGS`)."""
    if isa not in ISA_CFLAGS:
        raise ValueError(
            f"unknown ISA {isa!r} for native CPU kernels; expected one of {', '.join(ISA_CFLAGS)}"
        )
    return (*BASE_CFLAGS, *ISA_CFLAGS[isa])


def build_dir(name: str, isa: str = "native") -> Path:
    """Where ``csrc/<name>.cpp`` is built for ``isa``: ``quantrt_<name>_<key>`` (``<name>-<isa>`` for
    a level below native) in ``TORCH_EXTENSIONS_DIR`` (else torch's default root), the key a hash of
    the sources, the flags, the CPU's features and the install locations of quantrt and torch."""
    import torch
    from torch.utils import cpp_extension

    source = CSRC / f"{name}.cpp"
    digest = hashlib.sha1()
    for p in (source, *sorted(CSRC.glob("*.h"))):
        digest.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in (
        *cflags(isa), "|", *LDFLAGS, "|", _cpu_flags_hash(), str(CSRC.resolve()),
        str(Path(torch.__file__).resolve().parent), torch.__version__, os.environ.get("CXX", "c++"),
    ):  # fmt: skip
        digest.update(part.encode() + b"\0")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())
    stem = name if isa == "native" else f"{name}-{isa}"
    return root / f"quantrt_{stem}_{digest.hexdigest()[:12]}"


def _say(message: str) -> None:
    print(f"quantrt: {message}", file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _holder(text: str) -> tuple[int | None, str]:
    """The pid and host written in our lock file ("pid host"), pid None when unreadable."""
    parts = text.split()
    try:
        return int(parts[0]), parts[1] if len(parts) > 1 else ""
    except (IndexError, ValueError):
        return None, ""


def _who(text: str) -> str:
    pid, host = _holder(text)
    return "an unknown process" if pid is None else f"pid {pid}" + (f" on {host}" if host else "")


def _clear_stale_torch_lock(directory: Path, last_holder: str) -> None:
    """With our flock held, torch's lock file can only be a killed build's: remove it with a warning
    when the builder named in our lock file is gone (or none is named), or once it is
    ``STALE_LOCK_S`` old (a reused pid, another host), so this build does not wait on it forever."""
    lock = directory / TORCH_LOCK_NAME
    pid, host = _holder(last_holder)
    who = _who(last_holder)
    said = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        dead = pid is None or (host in ("", socket.gethostname()) and not _alive(pid))
        if dead or age > STALE_LOCK_S:
            why = "which is no longer running" if dead else f"older than {STALE_LOCK_S:.0f} s"
            warnings.warn(
                f"quantrt: removing the stale build lock {lock} ({age:.0f} s old, left by {who}, {why}: "
                "a build that was killed)",
                RuntimeWarning,
                stacklevel=2,
            )
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            return
        if not said:  # its writer may still run (or runs elsewhere): wait until the bound
            _say(f"waiting for torch's build lock {lock} ({who}; taken as stale at {STALE_LOCK_S:.0f} s old)")
            said = True
        time.sleep(0.5)


@contextlib.contextmanager
def build_lock(directory: Path, name: str, wait_s: float | None = None) -> Iterator[None]:
    """Hold the build directory's flock (waiting for a running builder at most ``wait_s``, by default
    ``LOCK_WAIT_S``), with torch's stale lock cleared; raises :class:`NativeBuildError` on timeout."""
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    with open(directory / LOCK_NAME, "a+") as f:
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                f.seek(0)
                holder = _who(f.read())
                if time.monotonic() > deadline:
                    raise NativeBuildError(
                        f"waited {wait_s:g} s for native CPU kernels {name!r} to be built by {holder} "
                        f"(lock {directory / LOCK_NAME}); it still runs"
                    ) from None
                if not said:
                    _say(
                        f"waiting for {holder}, which is building native CPU kernels {name!r} in {directory}"
                    )
                    said = True
                time.sleep(0.2)
        try:
            f.seek(0)
            last = f.read().strip()
            _clear_stale_torch_lock(directory, last)
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
            f.flush()
            yield
        finally:  # the file names a builder only while it builds (or after it was killed)
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def library(name: str, isa: str = "native") -> ctypes.CDLL:
    """The library built from ``csrc/<name>.cpp`` (and the headers beside it) for ``isa``, built once
    per process and cached on disk across processes."""
    key = name if isa == "native" else f"{name}-{isa}"
    lib = _libs.get(key)
    if lib is not None:
        return lib
    with _lock:
        if key in _libs:
            return _libs[key]
        ok, why = status()
        if not ok:
            raise NativeBuildError(f"cannot build native CPU kernels {name!r}: {why}")
        from torch.utils import cpp_extension

        source = CSRC / f"{name}.cpp"
        if not source.is_file():
            raise NativeBuildError(f"no source {source} for native CPU kernels {name!r}")
        flags = cflags(isa)
        directory = build_dir(name, isa)
        directory.mkdir(parents=True, exist_ok=True)
        with build_lock(directory, name):
            fresh = not (directory / f"{directory.name}.so").is_file()
            if fresh:
                _say(f"compiling native CPU kernels {key!r} ({source.name}) in {directory} ...")
            start = time.monotonic()
            try:
                path = cpp_extension.load(
                    directory.name,
                    [str(source)],
                    extra_cflags=list(flags),
                    extra_ldflags=list(LDFLAGS),
                    extra_include_paths=[str(CSRC)],
                    build_directory=str(directory),
                    is_python_module=False,
                    verbose=False,
                )
            except Exception as e:  # the compiler's own message says what went wrong
                raise NativeBuildError(f"building native CPU kernels {name!r} failed: {e}") from e
            if fresh:
                _say(f"built native CPU kernels {key!r} in {time.monotonic() - start:.1f} s")
        lib = ctypes.CDLL(str(path))
        _libs[key] = lib
        return lib
