"""GGUF q4_k and q6_k on NVIDIA GPUs: a CUDA GEMV on the native planes for single rows
(``kernels/gguf_gemv.cu``), the Triton GEMV of ``cuda.triton_gguf`` for a few rows, and its
dequantizer + cuBLAS above.

It reads the same planes as ``cuda.triton_gguf`` (:func:`quantrt.backends.triton.gguf.gguf_planes`:
llama.cpp's block bytes split by field, no re-quantization, no extra memory). The Triton GEMV
decodes in 2-D tiles and spends more instructions per weight than the bytes allow at M = 1 (q4_k
streamed at 21-34% of copy bandwidth on the H200, q6_k at 30-38%); here every lane decodes 16-byte
runs with byte permutes into fp32 (no integer-to-float conversions), keeps one sum per run, applies
the sub-block scale and min to the run sums, and each block's warps split K. Measured on the H200
(``bench/results/h200-2026-12-03-gguf-gemv.json``): q4_k 40-48% of copy, q6_k 59-77% at M = 1.

Where it does not win, it is not used: from 2 rows on, the kernel re-decodes each weight per row
of x and the Triton GEMV (which decodes once per tile) was faster at M = 4 and 8, so batches above
the table's CUDA bound take the Triton path; q8_0 (one byte per code, little to decode) streamed
slower here than in the Triton GEMV at every shape measured, so it was left out. q4_k and q8_0 now
rank first on the tensor-core kernel (``mma_gguf.py``: fewer instructions per weight, every M
faster on the H200), so this kernel serves q6_k, and q4_k when asked for by name.
Launch shapes and bounds come from ``tunings/gguf_gemv_<arch>.json``. The layer's strategies are
this GEMV's, one per launch shape, in front of the Triton GGUF strategies of the same layout
(``triton_gguf.gguf_strategies``) for the batches above its bound.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from quantrt.backends.triton import dense_slices
from quantrt.backends.triton.gguf_kernel import TABLE as TRITON_TABLE
from quantrt.backends.triton.gguf_kernel import (
    GGUFLayout,
    gemv_workspace,
    gguf_condition,
    gguf_layout,
    gguf_rows,
    gguf_strategies,
)
from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .cupy_kernels import Launch, compile_all, function, stream
from .policy import CUDA

SOURCE = "gguf_gemv.cu"
TABLE = "gguf_gemv"
#: the kernel's type ids (backends/triton/gguf.py's order of BLOCKS)
TYPE_ID = {"q4_k": 7, "q6_k": 9}
CT = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
ARGS = 12  # x, four planes, bias, y, M, K, N, x row stride, y row stride
#: weights one warp decodes per step (32 lanes, one 16-byte run of codes per row each)
STEP_WEIGHTS = {"q4_k": 1024, "q6_k": 2048}


@dataclass(frozen=True)
class GemvShape:
    """One launch shape: ``rows`` weight rows and ``xm`` rows of x per block, ``warps`` splitting K."""

    max_m: int
    rows: int
    xm: int
    warps: int

    def expr(self, act: torch.dtype, gguf_type: str) -> str:
        return f"gguf_gemv<{CT[act]}, {TYPE_ID[gguf_type]}, {self.rows}, {self.xm}>"


@dataclass(frozen=True)
class GemvLayout(GGUFLayout):
    """The Triton GGUF layout (the same planes) plus this kernel's launch shapes."""

    shapes: tuple[GemvShape, ...] = ()  # ascending max_m; batches above the last take the Triton strategies
    launches: tuple[Launch, ...] = ()  # the compiled kernel of each shape
    device: int = 0


def shapes_for(doc: dict[str, Any], gguf_type: str, K: int) -> tuple[GemvShape, ...]:
    """The table's shapes for this type (its ``types`` row over ``gemv``), ascending batch bound,
    with no more warps than K has steps (a warp without a step would only wait)."""
    rows = doc.get("types", {}).get(gguf_type, doc["gemv"])
    steps = -(-K // STEP_WEIGHTS[gguf_type])
    out = []
    for m, c in sorted(rows.items(), key=lambda kv: int(kv[0])):
        s = GemvShape(int(m), int(c["rows"]), int(c["xm"]), int(c["warps"]))
        if s.rows < 1 or s.xm < 1 or s.rows * s.xm > 32 or not 1 <= s.warps <= 8:
            raise ValueError(f"tunings/{TABLE}: bad shape for {gguf_type} up to M={m}: {c}")
        out.append(GemvShape(s.max_m, s.rows, s.xm, min(s.warps, steps)))
    return tuple(out)


def launch(
    lay: GemvLayout, shape: GemvShape, fn: Launch, x: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor
) -> None:
    """``y = x @ W.T (+ bias)`` on one launch shape (x rows 16-byte aligned, y rows contiguous)."""
    M = x.shape[0]
    p = lay.plane_list + [lay.plane_list[0]] * (4 - len(lay.plane_list))
    args = (x.data_ptr(), p[0].data_ptr(), p[1].data_ptr(), p[2].data_ptr(), p[3].data_ptr())
    args += (
        0 if bias is None else bias.data_ptr(),
        y.data_ptr(),
        M,
        lay.K,
        lay.N,
        x.stride(0),
        y.stride(0),
    )
    fn((-(-lay.N // shape.rows), -(-M // shape.xm), 1), (32, shape.warps, 1), args, 0, stream(lay.device))


def _gemv(
    shape: GemvShape,
    fn: Launch,
    lay: GemvLayout,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    ws: Any,
) -> torch.Tensor:
    """The small-batch call: x in the activation dtype, rows moved to 16-byte boundaries if needed."""
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        buf = torch.empty(x.shape[0], -(-lay.K // 8) * 8, dtype=x.dtype, device=x.device)
        buf[:, : lay.K] = x
        x = buf
    y = torch.empty(x.shape[0], lay.N, dtype=lay.act, device=x.device) if out is None else out
    launch(lay, shape, fn, x, bias, y)
    return y


def strategies(layout: GemvLayout) -> list[Strategy]:
    """The CUDA GEMV per launch shape, then the Triton GGUF strategies for the batches above its
    bound, named "triton ..." (dequant + cuBLAS keeps its name). Their ``fn`` takes x, bias and
    ``out`` in the activation dtype."""
    cuda = [
        Strategy(s.max_m, f"cuda gemv R{s.rows} XM{s.xm} W{s.warps}", functools.partial(_gemv, s, fn))
        for s, fn in zip(layout.shapes, layout.launches)
    ]
    bound = layout.shapes[-1].max_m if layout.shapes else 0
    triton = [
        s if s.max_m == ALL_M else Strategy(s.max_m, "triton " + s.name, s.fn)
        for s in gguf_strategies(layout)
        if s.max_m > bound
    ]
    return [*cuda, *triton]


def build(kernel: Kernel, layout: GemvLayout, spec: LayerSpec) -> Prepared:
    """The prepared layer over ``layout`` with :func:`strategies` and exact row access (tools
    rebuild one from a replaced layout)."""
    s = dense_slices.in_act_dtype(strategies(layout), layout.act, spec.output_dtype)
    return kernel.prepared(
        layout, s, spec, layout.plane_list[0].device, rows=gguf_rows, workspace=gemv_workspace(layout)
    )


class CudaGemvGGUF(Kernel):
    """GGUF q4_k/q6_k: CUDA GEMV on the native planes for one row, Triton GEMV for a few, dequant + cuBLAS above."""

    name = "cuda.gemv_gguf"
    description = (
        "GGUF q4_k/q6_k: CUDA GEMV on llama.cpp's blocks split into aligned planes (byte-permute decode to fp32, "
        "scales on run sums) at M=1; the Triton GEMV for a few rows; Triton dequant + cuBLAS (bounded slices) above"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        t = spec.scheme.gguf_type
        return check(
            *CUDA.device_conditions(caps),
            gguf_condition(spec),
            (
                "cupy" in caps.libraries,
                "cupy importable (NVRTC compiles the kernel)",
                {"libraries": caps.libraries},
            ),
            (t in TYPE_ID, f"GGUF type one of {', '.join(TYPE_ID)}", {"gguf_type": t}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        target = CUDA.target(weight["qweight"].device)
        base = gguf_layout(weight, spec, CUDA.table(TRITON_TABLE, target))
        dev = base.plane_list[0].device.index or 0
        doc = CUDA.table(TABLE, target)
        shapes = shapes_for(doc, base.gguf_type, base.K)
        exprs = [s.expr(base.act, base.gguf_type) for s in shapes]
        compile_all(SOURCE, exprs, dev)
        launches = tuple(Launch(function(SOURCE, e, dev), ARGS) for e in exprs)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return build(self, GemvLayout(**fields, shapes=shapes, launches=launches, device=dev), spec)
