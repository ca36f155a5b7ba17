"""CUDA C++ kernels of this folder, compiled by NVRTC through CuPy and launched on torch's stream.

Sources live in ``kernels/*.cu`` as templates; each instantiation is compiled once per process
and device (CuPy also caches the binary on disk), at ``prepare`` time, never inside a call.
Launches go to torch's current stream, so they order with torch's work and are captured by
``torch.cuda.graph``. The launch path is kept short on purpose (see DESIGN.md, hot path): raw
ints for pointers and sizes written into a reused argument block, the driver's launch called
directly (``Launch``).
"""

from __future__ import annotations

import ctypes
import re
import struct
import threading
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import torch


@cache
def source(name: str) -> str:
    """The text of ``kernels/<name>`` with its local ``#include "*.cuh"`` lines replaced by the
    headers themselves: CuPy's on-disk cache keys a binary by the source text, so a header edit
    must change that text (an include path would let a stale binary load)."""
    text = (resources.files("quantrt.backends.cuda") / "kernels" / name).read_text()
    return re.sub(r'^#include "([\w.]+\.cuh)"$', lambda m: source(m.group(1)), text, flags=re.M)


_functions: dict[tuple[str, str, int], Any] = {}

# sources that use instructions of one architecture only: wgmma needs the sm_90a target
ARCH_OPTIONS = {"wna16_wgmma.cu": ("-arch=sm_90a",)}


def compile_all(name: str, expressions: Sequence[str], device: int) -> None:
    """Compile the instantiations ``expressions`` of ``kernels/<name>`` not yet compiled, in one
    NVRTC run (parsing the source and the fp16/bf16 headers dominates a run, so a layer's kernels
    are built together). Dynamic shared memory is raised to the device's opt-in limit here."""
    import cupy

    todo = tuple(dict.fromkeys(e for e in expressions if (name, e, device) not in _functions))
    if not todo:
        return
    optin = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    with cupy.cuda.Device(device):
        options = ("--std=c++17", *ARCH_OPTIONS.get(name, ()))
        mod = cupy.RawModule(code=source(name), options=options, name_expressions=todo)
        mod.compile()
        for e in todo:
            fn = mod.get_function(e)
            if optin > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = optin - fn.shared_size_bytes
            _functions[(name, e, device)] = fn


def function(name: str, expression: str, device: int) -> Any:
    """The compiled kernel ``expression`` (a template instantiation) of ``kernels/<name>``."""
    fn = _functions.get((name, expression, device))
    if fn is None:
        compile_all(name, (expression,), device)
        fn = _functions[(name, expression, device)]
    return fn


class Launch:
    """One compiled kernel, launched through the driver with a reused argument block.

    Every argument of our kernels is 8 bytes (a pointer or a ``long long``), so the arguments of
    a call are packed into a block of int64 slots whose addresses were laid out once; CuPy's
    generic launch would build a converter object per argument per call, which is most of a small
    layer's host time. One block per thread keeps concurrent callers apart; the driver copies the
    arguments at launch, so the block is free again when ``__call__`` returns.
    """

    __slots__ = ("_launch", "_local", "_pack", "nargs", "ptr")

    def __init__(self, fn: Any, nargs: int) -> None:
        from cupy.cuda import driver

        self.ptr = int(getattr(fn, "kernel", fn).ptr)
        self.nargs = nargs
        self._local = threading.local()
        self._launch = driver.launchKernel
        self._pack = struct.Struct(f"{nargs}q").pack_into

    def _block(self) -> tuple[Any, int, Any]:
        """This thread's block: the int64 slots, the address of their pointer array (what the
        driver takes), and that array itself (kept alive with the slots)."""
        vals = (ctypes.c_int64 * self.nargs)()
        base = ctypes.addressof(vals)
        ptrs = (ctypes.c_void_p * self.nargs)(*[base + 8 * i for i in range(self.nargs)])
        block = self._local.block = (vals, ctypes.addressof(ptrs), ptrs)
        return block

    def __call__(
        self,
        grid: tuple[int, int, int],
        threads: tuple[int, int, int],
        args: tuple[int, ...],
        smem: int,
        stream: int,
    ) -> None:
        try:
            vals, addr, _ = self._local.block
        except AttributeError:
            vals, addr, _ = self._block()
        self._pack(vals, 0, *args)
        self._launch(self.ptr, *grid, *threads, smem, stream, addr, 0)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(device: int) -> int:
    """torch's current stream on ``device`` as a raw handle (what the driver's launch takes)."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return int(torch.cuda.current_stream(device).cuda_stream)
