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
Launch shapes and bounds come from ``tunings/gguf_gemv_<arch>.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight
from quantrt.kernels import Verdict, check
from quantrt.specs import LayerSpec

from . import tile_table
from .cupy_kernels import Launch, compile_all, function, stream
from .triton_gguf import CudaTritonGGUF, GGUFState

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


@dataclass
class GemvGGUFState(GGUFState):
    shapes: tuple[GemvShape, ...] = ()  # ascending max_m; batches above the last take the Triton GEMV
    launches: tuple[Launch, ...] = ()
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


def launch(state: GemvGGUFState, x: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> None:
    """``y = x @ W.T (+ bias)`` on the shape for ``x``'s rows (x rows 16-byte aligned, y rows contiguous)."""
    M = x.shape[0]
    i = 0
    while i + 1 < len(state.shapes) and M > state.shapes[i].max_m:
        i += 1
    shape = state.shapes[i]
    p = state.plane_list + [state.plane_list[0]] * (4 - len(state.plane_list))
    args = (x.data_ptr(), p[0].data_ptr(), p[1].data_ptr(), p[2].data_ptr(), p[3].data_ptr())
    args += (
        0 if bias is None else bias.data_ptr(),
        y.data_ptr(),
        M,
        state.K,
        state.N,
        x.stride(0),
        y.stride(0),
    )
    state.launches[i]((-(-state.N // shape.rows), -(-M // shape.xm), 1), (32, shape.warps, 1), args, 0,
                      stream(state.device))  # fmt: skip


def run(
    state: GemvGGUFState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> torch.Tensor:
    """The small-batch call: x in the activation dtype, rows moved to 16-byte boundaries if needed."""
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        buf = torch.empty(x.shape[0], -(-state.K // 8) * 8, dtype=x.dtype, device=x.device)
        buf[:, : state.K] = x
        x = buf
    if out is not None and out.stride(1) != 1:
        out.copy_(run(state, x, bias, None))
        return out
    y = torch.empty(x.shape[0], state.N, dtype=state.act, device=x.device) if out is None else out
    if x.shape[0]:
        launch(state, x, bias, y)
    return y


class CudaGemvGGUF(CudaTritonGGUF):
    """GGUF q4_k/q6_k: CUDA GEMV on the native planes for one row, Triton GEMV for a few, dequant + cuBLAS above."""

    name = "cuda.gemv_gguf"
    priority = 39  # before the Triton GEMV of the same planes (40)
    table = TABLE
    description = (
        "GGUF q4_k/q6_k: CUDA GEMV on llama.cpp's blocks split into aligned planes (byte-permute decode to fp32, "
        "scales on run sums) at M=1; the Triton GEMV for a few rows; Triton dequant + cuBLAS (bounded slices) above"
    )

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        base = super().supports(spec, caps)
        if not base:
            return base
        t = spec.scheme.gguf_type
        return check(
            (
                "cupy" in caps.libraries,
                "cupy importable (NVRTC compiles the kernel)",
                {"libraries": caps.libraries},
            ),
            (t in TYPE_ID, f"GGUF type one of {', '.join(TYPE_ID)}", {"gguf_type": t}),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> GemvGGUFState:
        base = super().prepare(weight, spec)
        dev = base.plane_list[0].device.index or 0
        doc = tile_table.load(TABLE, tile_table.arch_of(base.plane_list[0]))
        shapes = shapes_for(doc, base.gguf_type, base.K)
        exprs = [s.expr(base.act, base.gguf_type) for s in shapes]
        compile_all(SOURCE, exprs, dev)
        launches = tuple(Launch(function(SOURCE, e, dev), ARGS) for e in exprs)
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        fields["gemv_max_m"] = max(base.gemv_max_m, shapes[-1].max_m)
        return GemvGGUFState(**fields, shapes=shapes, launches=launches, device=dev)

    def strategy(self, state: GemvGGUFState, m: int) -> str:
        if m <= state.shapes[-1].max_m:
            s = next(s for s in state.shapes if m <= s.max_m)
            return f"cuda gemv R{s.rows} XM{s.xm} W{s.warps}"
        s = super().strategy(state, m)
        return s if self.use_dense(state, m) else "triton " + s

    def small(
        self, state: GemvGGUFState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        if x.shape[0] > state.shapes[-1].max_m:
            return super().small(state, x, bias, out)
        if torch.compiler.is_compiling():  # traced: the registered op with its fake
            y = torch.ops.quantrt.gguf_gemv(x, state.plane_list, bias, meta(state))
            return y if out is None else out.copy_(y)
        return run(state, x, bias, out)


def meta(state: GemvGGUFState) -> list[int]:
    """The state's integers for the traced op: type, N, K, device, then (max_m, rows, xm, warps) per shape."""
    flat = [TYPE_ID[state.gguf_type], state.N, state.K, state.device]
    for s in state.shapes:
        flat += [s.max_m, s.rows, s.xm, s.warps]
    return flat


@torch.library.custom_op("quantrt::gguf_gemv", mutates_args=())
def gguf_gemv_op(
    x: torch.Tensor, planes: list[torch.Tensor], bias: torch.Tensor | None, meta: list[int]
) -> torch.Tensor:
    """The GEMV as a torch op, so torch.compile traces through it (eager calls skip the op layer)."""
    tid, N, K, dev = meta[:4]
    t = next(k for k, v in TYPE_ID.items() if v == tid)
    shapes = tuple(GemvShape(*meta[i : i + 4]) for i in range(4, len(meta), 4))
    launches = tuple(Launch(function(SOURCE, s.expr(x.dtype, t), dev), ARGS) for s in shapes)
    state = GemvGGUFState(
        planes={},
        plane_list=list(planes),
        gguf_type=t,
        N=N,
        K=K,
        configs=(),
        gemv_max_m=shapes[-1].max_m,
        gemm_configs=(),
        gemm_max_m=0,
        slice_rows=N,
        act=x.dtype,
        out_dtype=x.dtype,
        matmul=None,
        dequant=None,
        gemm=None,
        shapes=shapes,
        launches=launches,
        device=dev,
    )
    return run(state, x, bias, None)


gguf_gemv_op.register_fake(lambda x, planes, bias, meta: x.new_empty(x.shape[0], meta[1]))
