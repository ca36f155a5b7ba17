"""AMX-aware kernels over the native weight-only CPU layouts (Sapphire Rapids and later).

Why: a prefill-sized batch is compute-bound, and on CPUs with AMX the fastest bf16 multiplier is
AMX's tile unit. Each ``cpu.amx_*`` kernel prepares the native module's layout with that module's
prepare function, keeps the module's own strategies for small batches (a GEMV is bandwidth-bound,
AMX does not help it) and adds one AMX strategy from some batch size on:

- the native panel GEMM with its products on AMX tiles (``qrt::amx_block``: the decoded L2 panels
  are AMX's weight operand as they are), where the library has the tiles and K makes whole 32-k
  tiles (int and code-book/float layouts), or GGUF's own tile kernel over bf16 panels decoded from
  the 16-row groups (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 with whole groups);
- otherwise the prepared weight dequantized in row slices into a bounded bf16 scratch buffer
  (native ``dequant_rows``, exact: the fp32 dequantized weight rounded once to bf16), each slice
  multiplied with ``torch.mm`` in bf16 (oneDNN drives AMX, or AVX-512 BF16 where there is none, so
  the numbers are the same everywhere).

The tile strategies keep fp32 and fp16 activations exact (one bf16 A tile per part); the dequant
path rounds weights and activations to bf16, so layers planned with fp32 activations do not take it
(their native strategies serve every M). The dequant path's scratch is one buffer per thread, shared
by every layer and reused across calls (:func:`reused_scratch`, at most ``SCRATCH_BYTES``): a
prepared layer's own workspace would hold 32 MiB per layer. The kernels win dispatch just ahead
of the native ones only when the probe reports AMX bf16 tiles (``amx_bf16`` and ``amx_tile``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from . import gguf_native, lut_native, wint_native
from .native_common import CPU_DTYPES, check_call, round_up

#: probe features the AMX path needs (AMX tile registers and the bf16 tile multiply)
AMX_FEATURES = ("amx_bf16", "amx_tile")
#: batch sizes from which the dequant + oneDNN path runs, unless a kernel class sets its own
#: ``amx_from_m``. Below, the native kernels decode the weight once into L2-resident panels; this path
#: writes and re-reads 16-bit weights, which only pays once the matmul dominates. Measured on this
#: project's Xeon with AMX (2 threads, bench/results/cpu-2026-12-03-amx-crossover-*.json, both paths of
#: one prepared weight timed round by round): int4 g128 and NF4 cross over at M = 20-24 on 4096x4096
#: and 4096x14336 (at M=256 the AMX path is 4x faster: 9.2 against 40 ms), GGUF q4_k, whose native
#: GEMM runs on 8-bit activations with VNNI and whose dequantization is slower, only at M = 384.
AMX_FROM_M = 24
#: the bf16 scratch of one row slice stays within this many bytes (32 MiB)
SCRATCH_BYTES = 32 << 20
#: output rows per tile of every native layout (wint/lut tiles, GGUF groups): slices are multiples
ROW_TILE = 16

#: ``dequant(layout, n0, n1, out) -> out``: a native module's exact row dequantization
DequantFn = Callable[[Any, int, int, torch.Tensor], torch.Tensor]


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


def over_native(native: Verdict, caps: Any, note: str) -> Verdict:
    """An AMX kernel's verdict: the native kernel's, then the AMX features; yes names both paths."""
    if not native:
        return native
    amx = amx_verdict(caps)
    if not amx:
        return amx
    return Verdict.yes(f"{note}; below: {native.reason}")


# -- composing strategies -------------------------------------------------------------------------


def below(strategies: Sequence[Strategy], m: int) -> list[Strategy]:
    """The strategies that serve batches of fewer than ``m`` rows, the last one cut at ``m - 1``."""
    out: list[Strategy] = []
    for s in sorted(strategies, key=lambda s: s.max_m):
        if m <= 1 or (out and out[-1].max_m >= m - 1):
            break
        out.append(s if s.max_m < m - 1 else Strategy(m - 1, s.name, s.fn))
    return out


def dequant_matmul(
    layout: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any, *,
    dequant: DequantFn, rows: int,
) -> torch.Tensor:  # fmt: skip
    """Slices of ``rows`` weight rows dequantized to bf16 into the thread's scratch, each multiplied
    with the bf16 activations by ``torch.mm`` (oneDNN: AMX tiles where the CPU has them)."""
    check_call(x, bias, layout.N)
    M, N = x.shape[0], layout.N
    y = torch.empty((M, N), dtype=layout.out_dtype) if out is None else out
    xb = x.to(torch.bfloat16)
    scratch = reused_scratch(rows, layout.K)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        w = dequant(layout, n0, n1, scratch[: n1 - n0])
        y[:, n0:n1] = torch.mm(xb, w.t())
    if bias is not None:
        y.add_(bias)
    return y


def dequant_strategy(dequant: DequantFn, N: int, K: int, rows: int | None = None) -> Strategy:
    """The dequant + oneDNN path for every batch size (``rows`` per slice: ``slice_rows`` by default)."""
    rows = slice_rows(N, K) if rows is None else rows
    name = f"amx: dequant bf16 slices of {rows} rows + oneDNN matmul (activations rounded to bf16)"
    return Strategy(ALL_M, name, functools.partial(dequant_matmul, dequant=dequant, rows=rows))


def amx_strategies(
    native: Sequence[Strategy], from_m: int, tiles: Strategy | None, dequant: DequantFn, layout: Any,
    rows: int | None = None, exact: bool = False,
) -> list[Strategy]:  # fmt: skip
    """The native strategies below ``from_m`` rows, then ``tiles`` (a strategy for every M) where the
    layer runs on AMX tiles, else the dequant + oneDNN path; with ``exact`` (a layer planned with fp32
    activations) no dequant path: its bf16 weights and activations would lose what fp32 promises, so
    the native strategies serve every M."""
    if tiles is None and exact:
        return list(native)
    top = tiles if tiles is not None else dequant_strategy(dequant, layout.N, layout.K, rows)
    return [*below(native, from_m), top]


def _pick(tiles: bool, from_m: int | None, tiles_from: int, amx_from: int) -> int:
    if from_m is not None:
        return from_m
    return tiles_from if tiles else amx_from


# -- the kernels ----------------------------------------------------------------------------------


class AmxWint(Kernel):
    """Integer weight-only layers: the native GEMV below ``TILES_FROM_M`` rows, the native panel GEMM
    on AMX tiles from there; without whole 32-k tiles, bf16 dequant slices through oneDNN from
    ``amx_from_m`` rows.

    Measured on this project's Xeon with AMX (2 threads, bench/results/cpu-2026-12-03-amx-tiles-*.json):
    at 4096x4096 and M=64, 1.74 ms against 10.2 ms on AVX-512 BF16, 4.2 ms for dequant + oneDNN and
    2.6 ms for dense bf16 ``F.linear``; the tiles beat the GEMV from M=4."""

    name = "cpu.amx_wint"
    act_dtypes = CPU_DTYPES
    description = "int2/3/4/8 weight-only: native GEMV (M < 4), native panel GEMM on AMX tiles above"
    #: batch sizes from which the panel GEMM runs on AMX tiles
    TILES_FROM_M: ClassVar[int] = 4
    #: batch sizes from which the dequant + oneDNN path runs (layers without whole 32-k tiles)
    amx_from_m: ClassVar[int] = AMX_FROM_M

    @classmethod
    def amx_note(cls) -> str:
        """Which batches take AMX, as ``explain`` reports it."""
        return (
            f"native panel GEMM on AMX tiles from M >= {cls.TILES_FROM_M} (without whole 32-k tiles: "
            f"AMX bf16 via oneDNN from M >= {cls.amx_from_m})"
        )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return over_native(wint_native.can_run(spec, caps), caps, cls.amx_note())

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = wint_native.prepare_wint(weight, spec)
        exact = spec.act_dtype == torch.float32
        return self.prepared(layout, self.strategies(layout, exact=exact), spec)

    def strategies(
        self, layout: wint_native.WintLayout, *, tiles: bool | None = None, from_m: int | None = None,
        rows: int | None = None, exact: bool = False,
    ) -> list[Strategy]:  # fmt: skip
        """What ``prepare`` composes: the AMX tiles where the library runs them (``tiles`` None: ask
        it), from ``from_m`` rows (default by path), dequant slices of ``rows``; benchmarks and tests
        force a path through these."""
        tiles = wint_native.tiles_ready(layout) if tiles is None else tiles
        top = Strategy(ALL_M, "panel-gemm on AMX tiles", wint_native.panel_gemm_tiles) if tiles else None
        m = _pick(tiles, from_m, self.TILES_FROM_M, self.amx_from_m)
        return amx_strategies(
            wint_native.wint_strategies(layout), m, top, wint_native.dequant_rows, layout, rows, exact
        )


class AmxLut(Kernel):
    """NF4/FP4, fp8, NVFP4, MXFP4 weight-only layers as :class:`AmxWint` runs integers (measured: NF4,
    NVFP4 and fp8 tiles ahead of the GEMV at M=3). W8A8 fp8 schemes stay on cpu.native_lut (their
    activations are fp8, not bf16)."""

    name = "cpu.amx_lut"
    act_dtypes = CPU_DTYPES
    description = (
        "NF4/FP4/fp8/NVFP4/MXFP4 weight-only: native GEMV (M < 3), native panel GEMM on AMX tiles above"
    )
    TILES_FROM_M: ClassVar[int] = 3
    amx_from_m: ClassVar[int] = AMX_FROM_M

    @classmethod
    def amx_note(cls) -> str:
        return (
            f"native panel GEMM on AMX tiles from M >= {cls.TILES_FROM_M} (without whole 32-k tiles: "
            f"AMX bf16 via oneDNN from M >= {cls.amx_from_m})"
        )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        weight_only = check(
            (s.act is None, "weight-only scheme (the AMX path multiplies bf16 activations)", {"act": s.act})
        )
        return weight_only and over_native(lut_native.can_run(spec, caps), caps, cls.amx_note())

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = lut_native.prepare_lut(weight, spec)
        exact = spec.act_dtype == torch.float32
        return self.prepared(layout, self.strategies(layout, exact=exact), spec)

    def strategies(
        self, layout: lut_native.LutLayout, *, tiles: bool | None = None, from_m: int | None = None,
        rows: int | None = None, exact: bool = False,
    ) -> list[Strategy]:  # fmt: skip
        """As :meth:`AmxWint.strategies`, over the lut layout."""
        tiles = lut_native.tiles_ready(layout) if tiles is None else tiles
        top = Strategy(ALL_M, "panel-gemm on AMX tiles", lut_native.panel_gemm_tiles) if tiles else None
        m = _pick(tiles, from_m, self.TILES_FROM_M, self.amx_from_m)
        return amx_strategies(
            lut_native.lut_strategies(layout), m, top, lut_native.dequant_rows, layout, rows, exact
        )


class AmxGGUF(Kernel):
    """GGUF block types: llama.cpp's 8-bit-activation GEMV/GEMM for small batches. From ``TILES_FROM``
    rows, Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 layers whose rows fill 16-row groups run on AMX tiles over
    bf16 panels decoded from those groups with the scales multiplied in; the other types (and layers
    with ragged rows) take the exactly dequantized weights times bf16 activations on AMX (oneDNN)
    from ``amx_from_m`` rows."""

    name = "cpu.amx_gguf"
    act_dtypes = CPU_DTYPES
    quantizes_activations = True  # below the AMX path: the native 8-bit activation blocks
    description = (
        "GGUF: native 8-bit-activation GEMV (small M); bf16 panels decoded from the row groups on AMX tiles "
        "(Q4_K/Q5_K/Q6_K/Q8_0/Q4_0), else exact bf16 dequant slices + AMX matmul"
    )
    amx_from_m: ClassVar[int] = 384
    #: Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 layers whose rows are all in 16-row groups: from this many rows, bf16
    #: panels decoded from the group planes (scales multiplied in) on AMX tiles
    #: (``quantrt_gguf_linear_tiles``), where they overtake the 8-bit-activation VNNI GEMM (measured on
    #: 4096x4096, 4096x14336, 14336x4096: Q6_K ahead from 16 rows, Q4_K/Q5_K even at 24 and 1.7x faster
    #: at 48, Q8_0/Q4_0 even at 24 and ahead from 32)
    TILES_FROM: ClassVar[dict[str, int]] = {"q4_k": 24, "q5_k": 24, "q6_k": 16, "q8_0": 32, "q4_0": 32}
    TILES_NAME: ClassVar[str] = (
        "amx tiles: bf16 panels decoded from the GGUF groups (scales in), activations rounded to bf16"
    )

    @classmethod
    def amx_note(cls) -> str:
        types = ", ".join(f"{t.upper()} from M >= {m}" for t, m in cls.TILES_FROM.items())
        return (
            f"AMX tiles on bf16 panels decoded from the 16-row groups ({types}); other types and ragged "
            f"rows: AMX bf16 via oneDNN from M >= {cls.amx_from_m}"
        )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return over_native(gguf_native.can_run(spec, caps), caps, cls.amx_note())

    @classmethod
    def tiles_from(cls, gguf_type: str, N: int) -> int | None:
        """The batch size from which a layer of this type and row count runs on the GGUF tile kernel
        (None: its type has none, or some rows are outside the 16-row groups, or no tiles here)."""
        lib = gguf_native.native_library()
        group = lib.quantrt_gguf_group_rows_of(gguf_native.TYPE_CODES[gguf_type])
        if gguf_type in cls.TILES_FROM and group and N % group == 0 and lib.quantrt_gguf_tiles_ready():
            return cls.TILES_FROM[gguf_type]
        return None

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        layout = gguf_native.prepare_layout(weight, spec)
        return self.prepared(layout, self.strategies(layout), spec, rows=gguf_native.rows)

    def strategies(
        self, layout: gguf_native.GGUFLayout, *, tiles: bool | None = None, from_m: int | None = None,
        rows: int | None = None,
    ) -> list[Strategy]:  # fmt: skip
        """What ``prepare`` composes (see :meth:`AmxWint.strategies` for the arguments)."""
        if tiles is None:
            tiles = self.tiles_from(layout.gguf_type, layout.N) is not None
        top = Strategy(ALL_M, self.TILES_NAME, gguf_native.linear_tiles) if tiles else None
        m = _pick(tiles, from_m, self.TILES_FROM.get(layout.gguf_type, 1), self.amx_from_m)
        return amx_strategies(
            gguf_native.gguf_strategies(layout), m, top, gguf_native.dequant_rows, layout, rows
        )

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        """The native GEMV/GEMM's activation blocks, for the batches below the AMX path (which needs
        none): bounded by that path's first M, whatever the largest batch."""
        first = self.tiles_from(spec.scheme.gguf_type or "", spec.N_part) or self.amx_from_m
        return gguf_native.workspace_bytes(spec, min(max_m, first - 1))
