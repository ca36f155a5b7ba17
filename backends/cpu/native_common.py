"""What the native CPU kernel modules share: activation dtypes and their codes (csrc/common.h), the
verdict that the library can be built and the CPU has its instructions, the per-call checks
that keep the C code inside its buffers, and the registration of their torch ops.

torch.compile: the kernels call their C code through ``ctypes`` with raw data pointers, which
torch.compile cannot trace (a graph break, where tensors of the traced graph, a workspace among them,
may be freed before the C code writes them). So every native entry point is also a ``quantrt_cpu::``
torch op with a fake implementation, and a kernel takes the op only while torch.compile traces it
(``torch.compiler.is_compiling()``, one call of about 0.1 us): eager calls keep the direct ``ctypes``
call. The op allocates its own output and workspace. The ops are registered through a
``torch.library.Library`` (the dispatcher calls the Python implementation: about 4 us per call on Zen
4, against 17 us through ``torch.library.custom_op``), in their own namespace: the CUDA kernels' ops
are ``quantrt::``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantrt.kernels import Verdict, check

from .native import build

CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: the CPU kernels' torch ops (``torch.ops.quantrt_cpu``)
OPS_NAMESPACE = "quantrt_cpu"
OPS = torch.library.Library(OPS_NAMESPACE, "DEF")
#: dtype codes of csrc/common.h
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


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


def check_call(x: torch.Tensor, K: int, bias: torch.Tensor | None, N: int) -> int:
    """M, after the checks that keep the C code inside its buffers (shapes, dtypes, device)."""
    if x.dim() != 2 or x.shape[1] != K or x.dtype not in DTYPE_CODE or x.device.type != "cpu":
        raise ValueError(
            f"expected CPU activations [M, {K}] in fp32, bf16 or fp16, found {x.dtype} {list(x.shape)} on {x.device}"
        )
    if bias is not None and (bias.shape != (N,) or bias.dtype not in DTYPE_CODE or bias.device.type != "cpu"):
        raise ValueError(
            f"expected a CPU bias [{N}] in fp32, bf16 or fp16, found {bias.dtype} {list(bias.shape)}"
        )
    return x.shape[0]


def output_buffer(out: torch.Tensor | None, M: int, N: int, dtype: torch.dtype) -> torch.Tensor:
    """``out`` itself when the kernel can write it (dtype, unit column stride), else a fresh tensor."""
    if out is None:
        return torch.empty((M, N), dtype=dtype)
    if out.shape != (M, N):
        raise ValueError(f"out must have shape [{M}, {N}], found {list(out.shape)}")
    if out.dtype == dtype and out.stride(1) == 1 and out.device.type == "cpu":
        return out
    return torch.empty((M, N), dtype=dtype)


def finish(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The result: ``y`` itself, or ``out`` filled with it when the kernel could not write ``out``."""
    if out is None or y is out:
        return y
    return out.copy_(y)


def check_rc(rc: int, name: str) -> None:
    """A native call's return code as an error naming the kernel (0 is success)."""
    if rc:
        why = "the library was built without the instructions it needs" if rc == 1 else "out of memory"
        raise RuntimeError(f"{name}: native kernel failed ({why})")


def run_linear(
    name: str, fn: Any, desc: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
    N: int, out_dtype: torch.dtype, large_m: int, extra: tuple = (), tiles_m: int = 1 << 62,
) -> torch.Tensor:  # fmt: skip
    """One call of a native linear entry point with the C ABI the wint/lut libraries share:
    ``fn(desc, x, x dtype, M, x strides, *extra, bias, bias dtype, y, y dtype, y row stride,
    threads, strategy)``, strategy 0 the GEMV, 1 the panel GEMM from ``large_m`` rows, 2 the panel
    GEMM on AMX tiles from ``tiles_m`` rows; output into ``out`` when given, the rc checked."""
    M = x.shape[0]
    y = output_buffer(out, M, N, out_dtype)
    if M:
        if bias is not None and bias.stride(0) != 1:
            bias = bias.contiguous()
        rc = fn(
            desc, x.data_ptr(), DTYPE_CODE[x.dtype], M, x.stride(0), x.stride(1), *extra,
            0 if bias is None else bias.data_ptr(), 0 if bias is None else DTYPE_CODE[bias.dtype],
            y.data_ptr(), DTYPE_CODE[y.dtype], y.stride(0), torch.get_num_threads(),
            2 if M >= tiles_m else int(M >= large_m),
        )  # fmt: skip
        check_rc(rc, name)
    return finish(y, out)


def define_op(schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``quantrt_cpu::<schema>`` with ``impl`` as its CPU kernel and ``fake`` for tracing (shapes and
    dtypes only), returned as the op to call. ``impl`` must return a fresh tensor (no alias of an input)."""
    name = schema.split("(", 1)[0]
    OPS.define(schema)
    OPS.impl(name, impl, "CPU")
    torch.library.register_fake(f"{OPS_NAMESPACE}::{name}", fake, lib=OPS)
    return getattr(getattr(torch.ops, OPS_NAMESPACE), name)


def traced_result(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A traced op's fresh result, or ``out`` filled with it."""
    return y if out is None else out.copy_(y)


def fake_rows(x: torch.Tensor, N: int, dtype: torch.dtype) -> torch.Tensor:
    """The fake output [M, N] of a linear op for activations ``x`` [M, K]."""
    return x.new_empty((x.shape[0], N), dtype=dtype)
