"""CUDA C++ kernels of this folder, compiled by NVRTC through CuPy and launched on torch's stream.

Sources live in ``kernels/*.cu`` as templates; each instantiation is compiled once per process
and device (CuPy also caches the binary on disk), at ``prepare`` time, never inside a call.
Launches go to torch's current stream, so they order with torch's work and are captured by
``torch.cuda.graph``. The launch path is kept short on purpose (see DESIGN.md, hot path): raw
ints for pointers and sizes, the stream wrapper cached per raw stream handle.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import torch


@cache
def source(name: str) -> str:
    return (resources.files("quantrt.backends.cuda") / "kernels" / name).read_text()


@cache
def _module(name: str, expressions: tuple[str, ...], device: int) -> Any:
    import cupy

    with cupy.cuda.Device(device):
        mod = cupy.RawModule(code=source(name), options=("--std=c++17",), name_expressions=expressions)
        mod.compile()
    return mod


@cache
def function(name: str, expression: str, device: int) -> Any:
    """The compiled kernel ``expression`` (a template instantiation) of ``kernels/<name>``.

    Dynamic shared memory is raised to the device's opt-in limit once here.
    """
    import cupy

    mod = _module(name, (expression,), device)
    with cupy.cuda.Device(device):
        fn = mod.get_function(expression)
        optin = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
        if optin > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = optin - fn.shared_size_bytes
    return fn


def launcher(fn: Any) -> Any:
    """The object to call per launch: RawKernel launches on CuPy's current stream, its compiled
    Function takes ``stream=`` (torch's stream, without a context switch per call)."""
    return getattr(fn, "kernel", fn)


_streams: dict[int, Any] = {}


def _raw_stream(device: int) -> int:
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return int(getter(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


class _Stream:
    """What a CuPy Function launch reads from its ``stream`` argument: the raw handle."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def stream(device: int) -> Any:
    """torch's current stream on ``device``, as CuPy's launch wants it (cached per raw handle)."""
    handle = _raw_stream(device)
    s = _streams.get(handle)
    if s is None:
        s = _streams[handle] = _Stream(handle)
    return s
