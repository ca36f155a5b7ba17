"""What the native CPU kernel modules share: activation dtypes and their codes (csrc/common.h), the
verdict that the library can be built and the CPU has its instructions, the per-call checks that
keep the C code inside its buffers, and the one ``ctypes`` call of the wint/lut libraries.

torch.compile: the kernels call their C code through ``ctypes`` with raw data pointers, which
torch.compile cannot trace. The prepared layer (:class:`quantrt.prepared.Prepared`) owns the one
traced op (``quantrt::linear``) whose implementation runs these eager strategies outside the graph,
so nothing here registers an op or checks ``torch.compiler.is_compiling()``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec

from .native import build

CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: dtype codes of csrc/common.h
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: strategy codes of the wint/lut libraries' linear entry points
GEMV, PANEL_GEMM, PANEL_GEMM_TILES = 0, 1, 2


def round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def native_verdict(caps: Any, features: tuple[str, ...]) -> Verdict:
    """The library can be built here and the CPU has the instructions it is compiled for."""
    ok, why = build.status()
    missing = [f for f in features if f not in caps.features]
    return check(
        (ok, "native CPU kernels can be built", {"build": why}),
        (not missing, "CPU features " + " ".join(features), {"missing": " ".join(missing)}),
    )


def check_call(x: torch.Tensor, bias: torch.Tensor | None, N: int) -> None:
    """The checks that keep the C code inside its buffers beyond the prepared layer's own (the shape
    and dtype of ``x``): CPU activations, and a CPU bias [N] of a known dtype."""
    if not x.is_cpu:
        raise ValueError(f"expected CPU activations, found them on {x.device}")
    if bias is not None and (bias.shape != (N,) or bias.dtype not in DTYPE_CODE or not bias.is_cpu):
        raise ValueError(
            f"expected a CPU bias [{N}] in fp32, bf16 or fp16, found {bias.dtype} {list(bias.shape)}"
        )


#: the C signature of the wint/lut libraries' linear entry points (see :func:`run_linear`)
LINEAR_ARGTYPES = [
    ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
    ctypes.c_int32, ctypes.c_int32,
]  # fmt: skip


def linear_library(name: str, isa: str, entry: str) -> ctypes.CDLL:
    """The library ``csrc/<name>.cpp`` built for ``isa``, its linear entry point ``entry`` typed for
    :func:`run_linear` (built on first use, once per process)."""
    lib = build.library(name, isa)
    fn = getattr(lib, entry)
    if fn.argtypes is None:
        fn.restype = ctypes.c_int32
        fn.argtypes = LINEAR_ARGTYPES
    return lib


class IsaGemv(Kernel):
    """A weight-only kernel whose one strategy is a GEMV of another kernel's prepared layout, built
    for one ISA (the AVX2 and NEON builds): its source (``csrc/<source>.cpp``), ISA level, entry
    point, CPU architecture and features; ``scheme_verdict`` is the layout's own scheme check."""

    act_dtypes = CPU_DTYPES
    source = ""
    isa = "native"
    entry = ""
    arch = ""
    features: tuple[str, ...] = ()
    scheme_verdict: Callable[[LayerSpec, Any, tuple[str, ...]], Verdict]

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return check(
            (caps.arch.startswith(cls.arch), f"an {cls.arch} CPU", {"arch": caps.arch}),
        ) and cls.scheme_verdict(spec, caps, cls.features)

    def entry_point(self) -> Any:
        """The build's linear entry point (built on first use)."""
        return getattr(linear_library(self.source, self.isa, self.entry), self.entry)


def check_rc(rc: int, name: str) -> None:
    """A native call's return code as an error naming the kernel (0 is success)."""
    if rc:
        why = "the library was built without the instructions it needs" if rc == 1 else "out of memory"
        raise RuntimeError(f"{name}: native kernel failed ({why})")


def run_linear(
    name: str, layout: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
    strategy: int, extra: tuple = (),
) -> torch.Tensor:  # fmt: skip
    """One call of a native linear entry point with the C ABI the wint/lut libraries share:
    ``fn(desc, x, x dtype, M, x strides, *extra, bias, bias dtype, y, y dtype, y row stride,
    threads, strategy)`` (:data:`GEMV`, :data:`PANEL_GEMM` or :data:`PANEL_GEMM_TILES`), into ``out``
    when given (the prepared layer hands it over in the output dtype with unit column stride).

    ``layout`` carries ``fn``, ``desc``, ``N`` and ``out_dtype``."""
    N = layout.N
    check_call(x, bias, N)
    M = x.shape[0]
    y = torch.empty((M, N), dtype=layout.out_dtype) if out is None else out
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    rc = layout.fn(
        layout.desc, x.data_ptr(), DTYPE_CODE[x.dtype], M, x.stride(0), x.stride(1), *extra,
        0 if bias is None else bias.data_ptr(), 0 if bias is None else DTYPE_CODE[bias.dtype],
        y.data_ptr(), DTYPE_CODE[y.dtype], y.stride(0), torch.get_num_threads(), strategy,
    )  # fmt: skip
    check_rc(rc, name)
    return y


def check_rows(N: int, K: int, n0: int, n1: int, out: torch.Tensor) -> None:
    """The checks of an exact row dequantization into ``out`` [n1 - n0, K]."""
    if not 0 <= n0 <= n1 <= N:
        raise ValueError(f"rows [{n0}, {n1}) are not within [0, {N})")
    if (
        out.dim() != 2
        or tuple(out.shape) != (n1 - n0, K)
        or out.dtype not in DTYPE_CODE
        or out.device.type != "cpu"
        or (out.numel() and out.stride(1) != 1)
    ):
        raise ValueError(
            f"out must be a CPU fp32/bf16/fp16 [{n1 - n0}, {K}] with unit column stride, "
            f"found {out.dtype} {list(out.shape)} strides {out.stride()} on {out.device}"
        )
