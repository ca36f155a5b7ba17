"""Giving the host memory a loaded layer freed back to the system.

A layer's read buffers and its quantizer's temporaries (tens of MB each) are freed once its kernel
is prepared, but glibc's allocator keeps such blocks in its heap once its dynamic mmap threshold
has grown past their size, so a process loading layer after layer holds every freed layer's
memory it never reuses: on a 1B-shaped checkpoint quantized at load, 0.3-0.8 GB above the model
(docs/performance.md). ``malloc_trim(0)`` after each layer returns those pages; elsewhere than
glibc (macOS, musl, Windows) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed() -> None:
    """Return the heap's free pages to the system (glibc), so peak memory stays the model's."""
    fn = _trim()
    if fn is not None:
        fn(0)
