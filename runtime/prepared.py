"""What ``Kernel.prepare`` returns: one layout, the strategies that run it, and the shared call path.

A kernel prepares a weight once into its own opaque ``layout`` and names the ways it runs a batch
as :class:`Strategy` entries ``(max_m, name, fn)``, compared by the batch size M at call time: the
first with ``M <= max_m`` runs. A GEMV below a bound and a GEMM above it, AMX tiles from some batch
size, dequantize + dense matmul for large batches: each is a strategy composed onto one kernel
from functions, never a subclass.

:class:`Prepared` owns what every kernel used to restate: the checks on ``x`` and ``out=``, the
M=0 case, the workspace (sized by ``Kernel.workspace_bytes``: one buffer per thread and device that
every layer shares, since layers run one after another, grown when a layer needs more than it
holds and never allocated per call), and the torch op that torch.compile traces. That op is
one for every kernel, CPU and CUDA alike (``quantrt::linear``, its fake computing the output
shape from the prepared layer's declared ``N`` and output dtype): a traced graph calls it with the
activations, the bias and the prepared layer's number, and its implementation runs the eager path
outside the graph, so no kernel carries its own ``is_compiling`` branch or custom op. The weight
tensors are not op arguments: they are constants of the layer, read by the implementation.

The workspace is shared like a cuBLAS handle's: the layers of one thread run on one stream at a
time. A buffer a growth replaces is kept alive, so a CUDA graph captured before the growth stays
valid; ``Prepared.reserve(max_m)`` grows it ahead of a capture.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: ``max_m`` of a strategy that serves every batch size
ALL_M = sys.maxsize

#: ``fn(layout, x, bias, out, workspace) -> y``: ``x`` [M, K] (an accepted dtype, any strides),
#: ``out`` None or an [M, N] tensor in the output dtype with unit column stride for ``fn`` to fill,
#: ``workspace`` None or a uint8 tensor of at least ``workspace_bytes(spec, M)`` bytes
StrategyFn = Callable[
    [Any, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"], torch.Tensor
]
#: ``rows(layout, n0, n1) -> w``: rows [n0, n1) of the weight, exactly dequantized, fp32 [n1-n0, K]
RowsFn = Callable[[Any, int, int], torch.Tensor]


@dataclass(frozen=True)
class Strategy:
    """One way a prepared layer runs batches of ``M <= max_m`` rows."""

    max_m: int
    name: str
    fn: StrategyFn


def ordered(strategies: Sequence[Strategy]) -> tuple[Strategy, ...]:
    """Strategies by ascending ``max_m``, the last serving every M (checked: no batch unserved)."""
    out = tuple(sorted(strategies, key=lambda s: s.max_m))
    if not out:
        raise ValueError("a prepared layer needs at least one strategy")
    if out[-1].max_m != ALL_M:
        raise ValueError(
            f"strategy {out[-1].name!r} stops at M={out[-1].max_m}: the last one must serve every M"
        )
    return out


_LIVE: weakref.WeakValueDictionary[int, Prepared] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)
_IDS_LOCK = threading.Lock()


class Prepared:
    """A prepared layer: the kernel's layout, its strategies and the declared call shape.

    ``K``/``N`` are this rank's input and output features, ``out_dtype`` the output's dtype,
    ``act_dtypes`` the activation dtypes a call may pass. ``workspace`` is
    ``Kernel.workspace_bytes`` bound to the layer's spec (None: no scratch).
    """

    __slots__ = (
        "K",
        "N",
        "__weakref__",
        "_anchor",
        "_ws_bytes",
        "_ws_m",
        "_ws_need",
        "act_dtypes",
        "device",
        "id",
        "kernel",
        "layout",
        "out_dtype",
        "rows",
        "strategies",
    )

    def __init__(
        self,
        layout: Any,
        strategies: Sequence[Strategy],
        *,
        K: int,
        N: int,
        out_dtype: torch.dtype,
        act_dtypes: Sequence[torch.dtype],
        device: torch.device | str = "cpu",
        workspace: Callable[[int], int] | None = None,
        rows: RowsFn | None = None,
        kernel: str = "",
    ) -> None:
        self.layout = layout
        self.strategies = ordered(strategies)
        self.K, self.N, self.out_dtype = int(K), int(N), out_dtype
        self.act_dtypes = tuple(act_dtypes)
        self.device = torch.device(device)
        self.rows = rows
        self.kernel = kernel
        self._ws_bytes = workspace
        self._ws_m, self._ws_need = -1, 0
        self._anchor = torch.empty(0, device=self.device)  # the rows op's device, as a tensor argument
        with _IDS_LOCK:
            self.id = next(_IDS)
        _LIVE[self.id] = self

    # -- the call ------------------------------------------------------------------------------
    def __call__(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``y = x @ W.T + bias`` for ``x`` [M, K]; into ``out`` when given."""
        if torch.compiler.is_compiling():
            y = torch.ops.quantrt.linear(x, bias, self.id)
            return y if out is None else out.copy_(y)
        if x.dim() != 2 or x.shape[1] != self.K or x.dtype not in self.act_dtypes:
            raise ValueError(self._bad_x(x))
        m = x.shape[0]
        if out is not None and (out.dim() != 2 or out.shape[0] != m or out.shape[1] != self.N):
            raise ValueError(f"{self.kernel}: out must have shape [{m}, {self.N}], found {list(out.shape)}")
        if m == 0:
            return x.new_empty((0, self.N), dtype=self.out_dtype) if out is None else out
        for s in self.strategies:
            if m <= s.max_m:
                break
        ws = None if self._ws_bytes is None else self.workspace(m)
        if out is not None and (out.dtype != self.out_dtype or out.stride(1) != 1 or out.device != x.device):
            return out.copy_(s.fn(self.layout, x, bias, None, ws))
        return s.fn(self.layout, x, bias, out, ws)

    def strategy(self, m: int) -> Strategy:
        """The strategy that serves a batch of ``m`` rows."""
        for s in self.strategies:
            if m <= s.max_m:
                return s
        return self.strategies[-1]

    def workspace(self, m: int) -> torch.Tensor | None:
        """Scratch for a batch of ``m`` rows: this thread's shared buffer for the device, grown only
        when a layer needs more than it holds (never allocated per call)."""
        if self._ws_bytes is None:
            return None
        buf = _buffers().get(self.device)
        if m <= self._ws_m and buf is not None and buf.numel() >= self._ws_need:
            return buf
        need = int(self._ws_bytes(m))
        if m > self._ws_m:
            self._ws_m, self._ws_need = m, need
        if not need:
            return None
        if buf is None or buf.numel() < need:
            buf = _grow(self.device, need)
        return buf

    def reserve(self, max_m: int) -> None:
        """Allocate the workspace for batches up to ``max_m`` now (before a CUDA graph capture)."""
        self.workspace(max_m)

    def dequant_rows(self, n0: int, n1: int) -> torch.Tensor:
        """Rows [n0, n1) of the weight, exactly dequantized (fp32), from the prepared layout."""
        if self.rows is None:
            raise RuntimeError(f"{self.kernel}: this layout keeps no row access")
        if not 0 <= n0 <= n1 <= self.N:
            raise ValueError(f"{self.kernel}: rows [{n0}, {n1}) are outside [0, {self.N})")
        if torch.compiler.is_compiling():
            return torch.ops.quantrt.rows(self._anchor, self.id, n0, n1)
        return self.rows(self.layout, n0, n1)

    def _bad_x(self, x: torch.Tensor) -> str:
        dts = ", ".join(str(d).replace("torch.", "") for d in self.act_dtypes)
        return (
            f"{self.kernel}: expected activations [M, {self.K}] in {dts}, "
            f"found {str(x.dtype).replace('torch.', '')} {list(x.shape)}"
        )


#: per thread, per device: the workspace every prepared layer shares (layers run one after another)
_SHARED = threading.local()
#: buffers a growth replaced, kept alive: a CUDA graph captured before the growth still writes them
_RETIRED: list[torch.Tensor] = []


def _grow(device: torch.device, need: int) -> torch.Tensor:
    """A larger shared buffer (at least twice the old one, so growth stops after a few steps)."""
    old = _buffers().get(device)
    size = max(need, 2 * old.numel()) if old is not None else need
    if old is not None:
        _RETIRED.append(old)
    buf = _buffers()[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return buf


def _buffers() -> dict[torch.device, torch.Tensor]:
    bufs = getattr(_SHARED, "bufs", None)
    if bufs is None:
        bufs = _SHARED.bufs = {}
    return bufs


def live(prepared_id: int) -> Prepared:
    """The prepared layer a traced graph names by number."""
    p = _LIVE.get(prepared_id)
    if p is None:
        raise RuntimeError(f"quantrt: prepared layer #{prepared_id} no longer exists (its layer was freed)")
    return p


# -- the one traced op ----------------------------------------------------------------------------

_LIB = torch.library.Library("quantrt", "FRAGMENT")
_LIB.define("linear(Tensor x, Tensor? bias, int prepared) -> Tensor")
_LIB.define("rows(Tensor anchor, int prepared, SymInt n0, SymInt n1) -> Tensor")


def _linear_impl(x: torch.Tensor, bias: torch.Tensor | None, prepared: int) -> torch.Tensor:
    y = live(prepared)(x, bias)
    # the op returns a fresh tensor: a strategy may hand back a view of its input (M=0 paths)
    return y.clone() if y is x or y is bias else y


def _linear_fake(x: torch.Tensor, bias: torch.Tensor | None, prepared: int) -> torch.Tensor:
    p = live(prepared)
    return x.new_empty((x.shape[0], p.N), dtype=p.out_dtype)


def _rows_impl(anchor: torch.Tensor, prepared: int, n0: int, n1: int) -> torch.Tensor:
    return live(prepared).dequant_rows(n0, n1)


def _rows_fake(anchor: torch.Tensor, prepared: int, n0: Any, n1: Any) -> torch.Tensor:
    return anchor.new_empty((n1 - n0, live(prepared).K), dtype=torch.float32)


_LIB.impl("linear", _linear_impl, "CompositeExplicitAutograd")
_LIB.impl("rows", _rows_impl, "CompositeExplicitAutograd")
torch.library.register_fake("quantrt::linear", _linear_fake, lib=_LIB)
torch.library.register_fake("quantrt::rows", _rows_fake, lib=_LIB)
