"""Launching a compiled Triton kernel again without Triton's per-call machinery.

``fn[grid](*args, **meta)`` in Triton 3.6 binds every argument, builds a cache key from the
specialization and the options (a string), looks the kernel up, asks the driver for the device and
stream, computes launch metadata and runs the hooks, each call: tens of microseconds of host time,
per launch, which an eager decode step pays for every layer (``quantrt bench``'s host figure; the
hot-path rule in DESIGN.md). :class:`Launcher` keeps the compiled kernel per specialization key and
calls its launcher directly from the second call on.

The key is exactly Triton's own specialization of the runtime arguments (``native_specialize_impl``,
the function Triton's binder calls: dtype, 16-byte alignment, ints equal to 1 or divisible by 16,
32 or 64 bits) plus every constexpr and option, so a hit always runs the binary Triton itself would
have picked. Anything unusual takes Triton's own path: the interpreter (``TRITON_INTERPRET=1``),
launch hooks (profilers) being set, a Triton without this launcher layout, or a torch without CUDA
streams (Intel's XPU: its streams are not torch.cuda's; ROCm torch answers torch.cuda's calls).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from triton import knobs

try:  # the binder's own specialization function (Triton >= 3.4)
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
except ImportError:  # pragma: no cover - older or newer Triton: every call takes Triton's path
    native_specialize_impl = None


#: torch's current stream on a device as a raw handle (what Triton's driver asks for), without a
#: Stream object; None in a torch without CUDA, where nothing launches directly
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host code: Triton 3.6 makes it a constexpr function, microseconds a call."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (the same reason as :func:`cdiv`)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class Launcher:
    """``launcher(grid, *args, **meta)`` launches ``fn`` as ``fn[grid](*args, **meta)`` does.

    ``args`` are the kernel's runtime parameters in order; ``meta`` its constexprs (all of them,
    by name) and Triton options (``num_warps``, ``num_stages``)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._hits: dict[tuple, tuple[Any, Any, Any, tuple]] = {}
        self.direct_launches = 0  # calls served from the cache (tests check the fast path runs)
        self._direct = (
            native_specialize_impl is not None
            and hasattr(fn, "params")  # not interpreted
            and torch.cuda.is_available()  # CUDA or ROCm streams, which the direct call passes
        )
        if not self._direct:
            return
        names = fn.arg_names
        self._nargs = len(names) - sum(p.is_constexpr for p in fn.params)
        if any(p.is_constexpr for p in fn.params[: self._nargs]):
            raise TypeError(
                f"Launcher: {fn.__name__} must declare its constexprs after its runtime parameters"
            )
        self._consts = [(p.name, p.default) for p in fn.params[self._nargs :]]
        self._flags = [
            (p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment) for p in fn.params
        ]

    def __call__(self, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        if not self._direct or knobs.runtime.interpret or len(args) != self._nargs:
            self.fn[grid](*args, **meta)
            return
        key = self._key(args, meta)
        hit = self._hits.get(key)
        if hit is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            kernel = self.fn[grid](*args, **meta)
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            consts = tuple(meta[n] if n in meta else d for n, d in self._consts)
            self._hits[key] = (*_entry(kernel), kernel.function, kernel.packed_metadata, consts)
            return
        run, head, function, packed, consts = hit
        device = key[0]
        self.direct_launches += 1
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        run(grid[0], g1, g2, raw_stream(device), function, *head, packed, None, None, None, *args, *consts)

    def _key(self, args: tuple, meta: dict[str, Any]) -> tuple:
        """The cache key: the current device (Triton launches there; read without torch's lazy-init
        check), Triton's specialization of every runtime argument, the constexprs and options."""
        spec = tuple(
            native_specialize_impl(BaseBackend, a, c, s, al) for a, (c, s, al) in zip(args, self._flags)
        )
        return (torch._C._cuda_getDevice(), spec, tuple(meta.items()))

    def bind(self, grid: tuple[int, ...], pointers: int, *args: Any, **meta: Any) -> Bound | None:
        """The launch ``self(grid, *args, **meta)`` made after such a call, as a :class:`Bound` that
        takes its first ``pointers`` arguments per call as raw addresses: the binary, the grid, the
        other arguments and the constexprs are fixed here. None where this launcher does not launch
        directly (interpreter, hooks, another Triton) or has not launched these arguments yet.

        A bound launch skips the per-call specialization, so its caller answers for what the key
        held: each address has the alignment (16 bytes or not) and the element type of the tensor
        passed here, on the same device. It also skips the launch hooks: a profiler's hook set
        after binding does not see these launches (one set before binding prevents it)."""
        if not self._direct or knobs.runtime.interpret or len(args) != self._nargs:
            return None
        key = self._key(args, meta)
        hit = self._hits.get(key)
        if hit is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            return None
        run, head, function, packed, consts = hit
        full = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        return Bound(run, full, function, head, packed, (*args[pointers:], *consts), key[0])


class Bound:
    """One compiled Triton kernel with its grid and every argument but the leading pointers fixed:
    ``bound(stream, *addresses)`` launches it on ``stream`` (a raw handle of ``device``). Addresses
    as ints also skip the driver's pointer query that a tensor argument costs per launch."""

    __slots__ = ("_grid", "_mid", "_run", "_tail", "device")

    def __init__(
        self,
        run: Any,
        grid: tuple[int, int, int],
        function: Any,
        head: tuple,
        packed: Any,
        tail: tuple,
        device: int,
    ) -> None:
        self._run, self._grid, self._tail, self.device = run, grid, tail, device
        self._mid = (function, *head, packed, None, None, None)  # between the stream and the arguments

    def __call__(self, stream: int, *pointers: int) -> None:
        g = self._grid
        self._run(g[0], g[1], g[2], stream, *self._mid, *pointers, *self._tail)


class Call(NamedTuple):
    """One launch spelled as data: ``call()`` launches it through its :class:`Launcher`;
    ``call.bind(pointers)`` is :meth:`Launcher.bind` of the same launch."""

    launcher: Launcher
    grid: tuple[int, ...]
    args: tuple
    meta: dict[str, Any]

    def __call__(self) -> None:
        self.launcher(self.grid, *self.args, **self.meta)

    def bind(self, pointers: int) -> Bound | None:
        return self.launcher.bind(self.grid, pointers, *self.args, **self.meta)


def _entry(kernel: Any) -> tuple[Any, tuple]:
    """The launch function of a compiled kernel and the arguments it takes before ``function``'s
    successors. Triton 3.6's CUDA launcher wraps its C ``launch`` in a Python ``__call__`` that
    only allocates the global and profile scratch a kernel may ask for; a kernel that asks for
    neither goes straight to ``launch`` with what ``__call__`` would pass (cooperative grid, PDL,
    no scratch). Any other launcher (HIP, another Triton) keeps its ``__call__``."""
    run = kernel.run
    if (
        type(run).__name__ == "CudaLauncher"
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
        and getattr(run.launch, "__name__", "")
        == "launch"  # the C function, not the tensor-descriptor wrapper
    ):
        return run.launch, (run.launch_cooperative_grid, run.launch_pdl, None, None)
    return run, ()


def _hooked(hook: Any) -> bool:
    """A launch hook is installed. Triton 3.6 keeps an always-present chain (``HookChain``) whose
    ``calls`` are the hooks, so ``is not None`` is always true there; older Triton keeps None or a
    function."""
    return hook is not None and bool(getattr(hook, "calls", True))
