"""Native CPU kernels: C++ sources in ``csrc/`` built on first use and cached.

Each ``csrc/<name>.cpp`` is one shared library of plain ``extern "C"`` functions taking raw
pointers, sizes and a thread count; Python calls them through ``ctypes`` with tensors' data
pointers. The sources include no torch header, so a build takes seconds, not minutes, and the C ABI
keeps the calls cheap. torch's ``cpp_extension`` does the building (ninja, its compiler checks)
and the caching (``TORCH_EXTENSIONS_DIR``, rebuilt when a source or a flag changes).

Built with ``-march=native``: the library uses every ISA extension of the CPU it was built on, so
the build name carries a hash of that CPU's feature flags and a cache moved to another machine is
rebuilt, never run on a CPU without the instructions. The kernels themselves check the features
they need at run time through the probe (their ``supports``), not here.

Policy (issue: no silent fallbacks): when no C++ compiler exists, :func:`status` says so and the
native kernels answer ``supports`` with that reason, so dispatch picks the pure-torch kernels. When
a compiler exists and a build fails, :func:`library` raises :class:`NativeBuildError` with the
compiler's output, and a test that uses the kernel fails.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
#: -march=native: the host's ISA; -fopenmp: the kernels' threads (the count is an argument)
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-fno-math-errno")
LDFLAGS = ("-fopenmp",)

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


def library(name: str) -> ctypes.CDLL:
    """The library built from ``csrc/<name>.cpp`` (and the headers beside it), built once per
    process and cached on disk across processes."""
    lib = _libs.get(name)
    if lib is not None:
        return lib
    with _lock:
        if name in _libs:
            return _libs[name]
        ok, why = status()
        if not ok:
            raise NativeBuildError(f"cannot build native CPU kernels {name!r}: {why}")
        from torch.utils import cpp_extension

        source = CSRC / f"{name}.cpp"
        if not source.is_file():
            raise NativeBuildError(f"no source {source} for native CPU kernels {name!r}")
        headers = sorted(CSRC.glob("*.h"))
        digest = hashlib.sha1()
        for p in (source, *headers):
            digest.update(p.read_bytes())
        digest.update(_cpu_flags_hash().encode())
        build_name = f"quantrt_{name}_{digest.hexdigest()[:12]}"
        root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())
        build_dir = root / build_name
        build_dir.mkdir(parents=True, exist_ok=True)
        try:
            path = cpp_extension.load(
                build_name,
                [str(source)],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                extra_include_paths=[str(CSRC)],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        except Exception as e:  # the compiler's own message says what went wrong
            raise NativeBuildError(f"building native CPU kernels {name!r} failed: {e}") from e
        lib = ctypes.CDLL(str(path))
        _libs[name] = lib
        return lib
