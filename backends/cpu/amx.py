"""AMX-aware large-M path for the native weight-only CPU kernels (Sapphire Rapids and later).

Why: a prefill-sized batch is compute-bound, and on CPUs with AMX the fastest bf16 multiplier is
AMX's tile unit, which torch's CPU bf16 matmul (oneDNN) already drives (and which falls back to
AVX-512 BF16 where there is no AMX, so the numbers are the same everywhere). So from ``amx_from_m`` rows on
these kernels dequantize the prepared weight in row slices into a bounded bf16 scratch buffer
(``SCRATCH_BYTES``, native code: ``dequant_rows`` of the parent's module, exact: the fp32 dequantized
weight rounded once to bf16) and multiply each slice with ``torch.mm`` in bf16 (fp32 accumulation
inside oneDNN). Activations are rounded to bf16 on that path (bf16 is what AMX multiplies), so fp32
activations lose their low bits there. Small batches keep the parent's native GEMV: a GEMV is
bandwidth-bound, and AMX does not help it. One prepared layout (the parent's) serves both paths;
the bf16 scratch is one buffer per thread, reused across calls and layers
(:func:`reused_scratch`), and declared in ``workspace_bytes``.

The kernels subclass the native weight-only kernels and win dispatch just ahead of them only when
the probe reports AMX bf16 tiles (``amx_bf16`` and ``amx_tile``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec

from . import gguf_native, lut_native, wint_native
from .native_common import check_call, finish, output_buffer, round_up, traced_result

#: probe features the AMX path needs (AMX tile registers and the bf16 tile multiply)
AMX_FEATURES = ("amx_bf16", "amx_tile")
#: batch sizes from which the AMX path runs, unless a kernel class sets its own ``amx_from_m``. Below,
#: the native kernels decode the weight once into L2-resident panels; this path writes and re-reads
#: 16-bit weights, which only pays once the matmul dominates. Measured on this project's Xeon with
#: AMX (2 threads, bench/results/cpu-2026-12-03-amx-crossover-*.json, both paths of one prepared weight
#: timed round by round): int4 g128 and NF4 cross over at M = 20-24 on 4096x4096 and 4096x14336
#: (at M=256 the AMX path is 4x faster: 9.2 against 40 ms), GGUF q4_k, whose native GEMM runs on
#: 8-bit activations with VNNI and whose dequantization is slower, only at M = 384.
AMX_FROM_M = 24
#: the bf16 scratch of one row slice stays within this many bytes (32 MiB)
SCRATCH_BYTES = 32 << 20
#: output rows per tile of every parent layout (wint/lut tiles, GGUF groups): slices are multiples
ROW_TILE = 16


def slice_rows(N: int, K: int, budget: int = SCRATCH_BYTES) -> int:
    """Rows per slice: a multiple of the layout's row tile whose bf16 rows fit ``budget`` (at least one
    tile), no more than the layer's rows rounded up to a tile."""
    rows = max(ROW_TILE, budget // (2 * max(K, 1)) // ROW_TILE * ROW_TILE)
    return min(rows, round_up(max(N, 1), ROW_TILE))


_local = threading.local()


def reused_scratch(rows: int, K: int) -> torch.Tensor:
    """A bf16 [rows, K] buffer kept per thread across calls and layers (at most ``SCRATCH_BYTES``).

    A fresh 32 MiB tensor per call comes from the OS untouched, and faulting its pages in cost more
    than the dequantization itself (measured on a Sapphire Rapids class Xeon, 4096x4096 int4: 9.6 ms
    into a fresh buffer, 2.0 ms into a reused one). One buffer per thread keeps concurrent callers
    apart; every AMX layer of the thread shares it."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < rows * K:
        buf = _local.scratch = torch.empty(rows * K, dtype=torch.bfloat16)
    return buf[: rows * K].view(rows, K)


def amx_verdict(caps: Any) -> Verdict:
    missing = [f for f in AMX_FEATURES if f not in caps.features]
    found = sorted(f for f in caps.features if f.startswith("amx"))
    return check(
        (
            not missing,
            "AMX bf16 tiles (amx_bf16, amx_tile)",
            {"amx_features": " ".join(found) or "none", "missing": " ".join(missing)},
        )
    )


@dataclass
class AmxState:
    """The parent's prepared state, and what the AMX path adds to it."""

    inner: Any  # the parent kernel's state (its one prepared layout)
    N: int
    K: int
    rows: int  # rows per bf16 scratch slice (a multiple of ROW_TILE)
    amx_from: int  # batch sizes from which the AMX path runs
    out_dtype: torch.dtype
    dequant: Any  # dequant_rows(inner, n0, n1, out)
    tiles: bool = False  # the parent's panel GEMM runs on AMX tiles (it serves every M itself)
    gguf_tiles_from: int = 1 << 62  # cpu.amx_gguf: batch sizes its own GGUF tile kernel serves

    @property
    def nbytes(self) -> int:
        return getattr(self.inner, "nbytes", 0)


class _AmxPath:
    """The AMX path, mixed in ahead of a native weight-only kernel class."""

    _parent: type[Kernel]
    _module: Any
    #: batch sizes from which this kernel takes the AMX path (see AMX_FROM_M)
    amx_from_m: int = AMX_FROM_M

    def tiles_ready(self, inner: Any) -> bool:
        """Whether the parent's own panel GEMM runs on AMX tiles for this weight (then it serves
        every batch size, and the dequant + oneDNN path is not used)."""
        return False

    @classmethod
    def amx_note(cls) -> str:
        """Which batches take AMX, as ``explain`` reports it."""
        return f"AMX bf16 via oneDNN from M >= {cls.amx_from_m}"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        v = cls._parent.supports(spec, caps)  # type: ignore[attr-defined]
        if not v:
            return v
        amx = amx_verdict(caps)
        if not amx:
            return amx
        return Verdict.yes(f"{cls.amx_note()}; below: {v.reason}")

    def _inner_prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Any:
        return self._parent.prepare(self, weight, spec)  # type: ignore[arg-type]

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> AmxState:
        inner = self._inner_prepare(weight, spec)
        return AmxState(
            inner,
            inner.N,
            inner.K,
            slice_rows(inner.N, inner.K),
            self.amx_from_m,
            spec.output_dtype,
            self._module.dequant_rows,
            self.tiles_ready(inner),
        )

    def strategy(self, state: AmxState, m: int) -> str:
        if state.tiles:
            return self._parent.strategy(self, state.inner, m)  # type: ignore[arg-type]
        if m >= state.amx_from:
            return (
                f"amx: dequant bf16 slices of {state.rows} rows + oneDNN matmul (activations rounded to bf16)"
            )
        return self._parent.strategy(self, state.inner, m)  # type: ignore[arg-type]

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        small = self._parent.workspace_bytes(self, spec, min(max_m, self.amx_from_m - 1))  # type: ignore[arg-type]
        if max_m < self.amx_from_m:
            return small
        K, N = spec.K_part, spec.N_part
        rows = slice_rows(N, K)
        # the bf16 scratch slice, bf16 activations, and one bf16 product slice before the copy out
        return max(small, 2 * rows * K + 2 * max_m * K + 2 * max_m * rows + 4 * max_m * N)

    def apply(
        self,
        state: AmxState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if state.tiles or x.dim() != 2 or x.shape[0] < state.amx_from:
            return self._parent.apply(self, state.inner, x, bias, out)  # type: ignore[arg-type]
        M = check_call(x, state.K, bias, state.N)
        N = state.N
        # traced by torch.compile: each slice dequantized into a fresh tensor by the parent's op
        traced = torch.compiler.is_compiling()
        y = torch.empty(M, N, dtype=state.out_dtype) if traced else output_buffer(out, M, N, state.out_dtype)
        xb = x.to(torch.bfloat16)
        scratch = None if traced else reused_scratch(state.rows, state.K)
        for n0 in range(0, N, state.rows):
            n1 = min(N, n0 + state.rows)
            if scratch is None:
                w = self._module.traced_dequant_rows(state.inner, n0, n1, torch.bfloat16)
            else:
                w = state.dequant(state.inner, n0, n1, scratch[: n1 - n0])
            y[:, n0:n1] = torch.mm(xb, w.t())
        if bias is not None:
            y.add_(bias)
        return traced_result(y, out) if traced else finish(y, out)


class _PanelTiles(_AmxPath):
    """The native panel GEMM with its products on AMX tiles (``qrt::amx_block``: the decoded L2 panels
    are AMX's weight operand as they are): the parent's GEMV below ``TILES_FROM_M`` rows, the tiles
    from there. Where K or the group is not a multiple of 32 (no whole 32-k tiles), bf16 dequant
    slices through oneDNN from ``amx_from_m`` rows instead."""

    #: batch sizes from which the panel GEMM runs on AMX tiles
    TILES_FROM_M: int = 4
    #: the parent library's function saying whether a prepared weight can take the tiles
    _ready_symbol: str = ""

    @classmethod
    def amx_note(cls) -> str:
        return (
            f"native panel GEMM on AMX tiles from M >= {cls.TILES_FROM_M} (without whole 32-k tiles: "
            f"{super().amx_note()})"
        )

    def tiles_ready(self, inner: Any) -> bool:
        if not getattr(self._module._library(), self._ready_symbol)(inner.desc):
            return False
        inner.tiles_m = self.TILES_FROM_M
        return True


class AmxWint(_PanelTiles, wint_native.NativeWint):
    """Integer weight-only layers on AMX tiles (see ``_PanelTiles``).

    Measured on this project's Xeon with AMX (2 threads, bench/results/cpu-2026-12-03-amx-tiles-*.json):
    at 4096x4096 and M=64, 1.74 ms against 10.2 ms on AVX-512 BF16, 4.2 ms for dequant + oneDNN and
    2.6 ms for dense bf16 ``F.linear``; the tiles beat the GEMV from M=4."""

    name = "cpu.amx_wint"
    priority = wint_native.NativeWint.priority - 1
    description = "int2/3/4/8 weight-only: native GEMV (M < 4), native panel GEMM on AMX tiles above"
    _parent = wint_native.NativeWint
    _module = wint_native
    TILES_FROM_M = 4
    _ready_symbol = "quantrt_wint_amx_ready"


class AmxLut(_PanelTiles, lut_native.NativeLut):
    """NF4/FP4, fp8, NVFP4, MXFP4 weight-only layers on AMX tiles (see ``_PanelTiles``; measured: NF4,
    NVFP4 and fp8 ahead of the GEMV at M=3). W8A8 fp8 schemes stay on the parent (their activations
    are fp8, not bf16)."""

    name = "cpu.amx_lut"
    priority = lut_native.NativeLut.priority - 1
    description = (
        "NF4/FP4/fp8/NVFP4/MXFP4 weight-only: native GEMV (M < 3), native panel GEMM on AMX tiles above"
    )
    _parent = lut_native.NativeLut
    _module = lut_native
    TILES_FROM_M = 3
    _ready_symbol = "quantrt_lut_amx_ready"

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        weight_only = check(
            (s.act is None, "weight-only scheme (the AMX path multiplies bf16 activations)", {"act": s.act})
        )
        return weight_only and super().supports(spec, caps)

    def _inner_prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Any:
        inner = super()._inner_prepare(weight, spec)
        if weight.scheme.family == "bnb4":  # the code book is exact only in fp32
            inner.tensors["code32"] = weight["code"].float().cpu().contiguous()
        return inner


class AmxGGUF(_AmxPath, gguf_native.CpuNativeGGUF):
    """GGUF block types: llama.cpp's 8-bit-activation GEMV/GEMM for small batches. From ``TILES_FROM``
    rows, Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 layers whose rows fill 16-row groups run on AMX tiles over
    bf16 panels decoded from those groups with the scales multiplied in; the other types (and layers
    with ragged rows) take the exactly dequantized weights times bf16 activations on AMX (oneDNN)
    from ``amx_from_m`` rows."""

    name = "cpu.amx_gguf"
    priority = gguf_native.CpuNativeGGUF.priority - 1
    description = (
        "GGUF: native 8-bit-activation GEMV (small M); bf16 panels decoded from the row groups on AMX tiles "
        "(Q4_K/Q5_K/Q6_K/Q8_0/Q4_0), else exact bf16 dequant slices + AMX matmul"
    )
    _parent = gguf_native.CpuNativeGGUF
    _module = gguf_native
    amx_from_m = 384
    #: Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 layers whose rows are all in 16-row groups: from this many rows, bf16
    #: panels decoded from the group planes (scales multiplied in) on AMX tiles
    #: (``quantrt_gguf_linear_tiles``), where they overtake the 8-bit-activation VNNI GEMM (measured on
    #: 4096x4096, 4096x14336, 14336x4096: Q6_K ahead from 16 rows, Q4_K/Q5_K even at 24 and 1.7x faster
    #: at 48, Q8_0/Q4_0 even at 24 and ahead from 32)
    TILES_FROM: ClassVar[dict[str, int]] = {"q4_k": 24, "q5_k": 24, "q6_k": 16, "q8_0": 32, "q4_0": 32}

    @classmethod
    def amx_note(cls) -> str:
        types = ", ".join(f"{t.upper()} from M >= {m}" for t, m in cls.TILES_FROM.items())
        return (
            f"AMX tiles on bf16 panels decoded from the 16-row groups ({types}); other types and ragged "
            f"rows: {super().amx_note()}"
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> AmxState:
        state = super().prepare(weight, spec)
        inner = state.inner
        if (
            inner.gguf_type in self.TILES_FROM
            and inner.groups * 16 == inner.N
            and gguf_native.native_library().quantrt_gguf_tiles_ready()
        ):
            state.gguf_tiles_from = self.TILES_FROM[inner.gguf_type]
        return state

    def strategy(self, state: AmxState, m: int) -> str:
        if m >= state.gguf_tiles_from:
            return (
                "amx tiles: bf16 panels decoded from the GGUF groups (scales in), activations rounded to bf16"
            )
        return super().strategy(state, m)

    def apply(
        self,
        state: AmxState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.dim() != 2 or x.shape[0] < state.gguf_tiles_from:
            return super().apply(state, x, bias, out)
        inner = state.inner
        check_call(x, state.K, bias, state.N)
        if torch.compiler.is_compiling():  # traced: the op
            y = gguf_native.TILES_OP(
                inner.weight, x, bias, inner.type_code, state.N, state.K, inner.groups, state.out_dtype
            )
            return traced_result(y, out)
        return gguf_native.linear_tiles(
            inner.weight, inner.type_code, state.N, state.K, inner.groups, state.out_dtype, x, bias, out
        )


KERNELS: tuple[type[Kernel], ...] = (AmxWint, AmxLut, AmxGGUF)
