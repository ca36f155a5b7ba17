"""A native GEMV for dense 16-bit linear layers on the CPU (``native/csrc/dense.cpp``).

Why it exists: at M=1 torch's bf16 ``F.linear`` runs at about half the memory bandwidth on Zen 4
and its fp16 one far below that, while a dense layer at small batch is a stream over the weights;
the unquantized lm_head and the modules a quantized checkpoint leaves dense are such layers. The
native kernel reads the bf16/fp16 weight in place (no second copy, fp32 activations are converted
inside the kernel), and torch's ``F.linear`` takes over from the batch size where it is faster.

The layer is a plain ``nn.Module`` (dense layers are not dispatched), but its calls go through one
:class:`~quantrt.prepared.Prepared` per activation dtype, whose strategies are the native GEMV and
torch's ``F.linear``: torch.compile traces the prepared layer's one op (``quantrt::linear``), not the
``ctypes`` call.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quantrt.prepared import ALL_M, Prepared, Strategy

from .native import build

WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
#: dtype codes of csrc/common.h
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: the first M at which torch is used, by (weight dtype, activation dtype), measured with
#: bench/cpu_dense.py on Zen 4 with 2 threads (the seven linears of a llama layer). Pairs not listed
#: never fall back: torch's CPU fp32 matmul (MKL on AMD) and fp16 matmul were slower than the native
#: GEMV at every M measured (1 to 64), and their fp32 path needs the weight widened.
TORCH_FROM_M = {
    (torch.bfloat16, torch.bfloat16): 32,
    (torch.bfloat16, torch.float16): 16,
}
NEVER = 1 << 62
#: fp32 weight elements per chunk when torch multiplies fp32 activations by a 16-bit weight
#: (the weight is widened a chunk at a time: no fp32 copy of a whole lm_head)
FP32_CHUNK = 1 << 21


@functools.cache
def cpu_features() -> frozenset[str]:
    """The CPU's instruction set extensions, from /proc/cpuinfo (empty when unreadable)."""
    from quantrt.capability.cpu import cpu_from_cpuinfo

    try:
        dev = cpu_from_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()
    return dev.features if dev is not None else frozenset()


def required_features(weight_dtype: torch.dtype) -> tuple[str, ...]:
    """fp16 weights need AVX-512 F/BW (cvtph + FMA); bf16 weights also AVX-512 BF16 (dpbf16)."""
    base = ("avx512f", "avx512bw")
    return (*base, "avx512_bf16") if weight_dtype == torch.bfloat16 else base


def native_status(weight: torch.Tensor) -> tuple[bool, str]:
    """(the native GEMV can run this weight here, why not); builds nothing."""
    if weight.device.type != "cpu":
        return False, f"weight on {weight.device.type}"
    if weight.dtype not in WEIGHT_DTYPES:
        return False, f"weight dtype {weight.dtype} (native GEMV takes bf16 or fp16)"
    ok, why = build.status()
    if not ok:
        return False, why
    missing = [f for f in required_features(weight.dtype) if f not in cpu_features()]
    if missing:
        return False, "CPU lacks " + " ".join(missing)
    return True, "native kernels can be built and the CPU has " + " ".join(required_features(weight.dtype))


def _library() -> ctypes.CDLL:
    lib = build.library("dense")
    if not getattr(lib, "_quantrt_typed", False):
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
        lib.quantrt_dense_isa.restype = i32
        lib.quantrt_dense_linear.restype = i32
        lib.quantrt_dense_linear.argtypes = [
            ptr, i32, i64, i64, i64, ptr, i32, i64, i64, i64, ptr, i32, ptr, i32, i64, i32,
        ]  # fmt: skip
        lib._quantrt_typed = True
    return lib


class DenseLinear(nn.Module):
    """``y = x @ weight.T + bias`` with a bf16/fp16 weight kept as given, through the native GEMV
    below the measured crossover batch size and torch's ``F.linear`` from it (or always, where the
    native kernel cannot run here: ``reason`` says why). The output has the activations' dtype."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        act_dtype: torch.dtype = torch.bfloat16,
        *,
        torch_from_m: int | None = None,
    ) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"expected a weight [N, K], found {list(weight.shape)}")
        if weight.stride(1) != 1:  # the kernel reads rows with unit stride
            weight = weight.contiguous()
        N, K = weight.shape
        if bias is not None and bias.shape != (N,):
            raise ValueError(f"expected a bias [{N}], found {list(bias.shape)}")
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = K, N
        self.act_dtype = act_dtype
        native, why = native_status(weight)
        self._fn = None
        if native:
            lib = _library()  # a build failure with a compiler present raises (build.py's policy)
            need = 2 if weight.dtype == torch.bfloat16 else 1
            if lib.quantrt_dense_isa() & need:
                self._fn = lib.quantrt_dense_linear
            else:
                native, why = False, "the library was built without the AVX-512 instructions it needs"
        self._torch_from_m = torch_from_m
        #: the first M at which torch runs for the declared act_dtype
        self.torch_from_m = self._threshold(act_dtype)
        self._why_not = None if native else why
        #: activation dtype -> the prepared layer calls in that dtype take (native only)
        self._prepared = {act: self._prepare(act) for act in DTYPE_CODE} if native else {}
        if native:
            above = (
                "at every M (faster than torch's at every M measured)"
                if self.torch_from_m >= NEVER
                else f"below M = {self.torch_from_m}, torch F.linear from it (measured crossover)"
            )
            self.reason = f"{self._native_name(act_dtype)} {above}; {why}"
        else:
            self.reason = f"torch F.linear: {why}"

    def _threshold(self, act: torch.dtype) -> int:
        if self._torch_from_m is not None:
            return self._torch_from_m
        return TORCH_FROM_M.get((self.weight.dtype, act), NEVER)

    def _native_name(self, act: torch.dtype) -> str:
        if self.weight.dtype == torch.float16:
            return "native fp16 GEMV (AVX-512 F16C + FMA)"
        if act == torch.float32:
            return "native bf16 GEMV (AVX-512 F, fp32 FMA)"
        return "native bf16 GEMV (AVX-512 BF16)"

    def _prepare(self, act: torch.dtype) -> Prepared:
        """The native GEMV below the threshold, torch's F.linear from it, outputs in ``act``."""
        t = self._threshold(act)
        strategies = []
        if t > 1:
            strategies.append(Strategy(t - 1 if t < NEVER else ALL_M, self._native_name(act), _native))
        if t < NEVER:
            strategies.append(Strategy(ALL_M, f"torch F.linear: M >= {t}", _torch_path))
        return Prepared(
            self, strategies, K=self.in_features, N=self.out_features, out_dtype=act, act_dtypes=(act,),
            kernel="cpu dense GEMV",
        )  # fmt: skip

    def strategy(self, m: int, act: torch.dtype | None = None) -> str:
        """Which path a batch of m rows takes, and why (``act`` defaults to the declared act_dtype)."""
        act = self.act_dtype if act is None else act
        if self._why_not is not None:
            return f"torch F.linear: {self._why_not}"
        p = self._prepared.get(act)
        return f"torch F.linear: activations {act}" if p is None else p.strategy(m).name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K, N = self.in_features, self.out_features
        if x.shape[-1] != K:
            raise ValueError(f"expected activations [..., {K}], found {list(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K)
        p = self._prepared.get(x.dtype) if x.is_cpu and self.weight.is_cpu else None
        y = self._torch(x2, self.bias) if p is None else p(x2, self.bias)
        return y.reshape(*lead, N)

    def _torch(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """On the CPU: torch's bf16 F.linear for 16-bit activations of a bf16 weight (fp16 activations
        rounded to bf16); otherwise fp32 F.linear over chunks of the weight widened in turn (torch's
        CPU fp16 matmul is several times slower than fp32, and fp32 activations keep their precision)."""
        w, out = self.weight, x.dtype
        if w.device != x.device:
            raise ValueError(f"activations on {x.device}, weight on {w.device}")
        if x.device.type != "cpu" or out not in DTYPE_CODE:
            return F.linear(x, w.to(out), None if b is None else b.to(out))
        if w.dtype == torch.bfloat16 and out != torch.float32:
            y = F.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype))
            return y.to(out)
        xf = x.float()
        M, N, K = x.shape[0], self.out_features, self.in_features
        y = torch.empty((M, N), dtype=torch.float32)
        step = max(16, FP32_CHUNK // max(K, 1))
        for n0 in range(0, N, step):
            y[:, n0 : n0 + step] = F.linear(xf, w[n0 : n0 + step].float())
        if b is not None:
            y += b.float()
        return y.to(out)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"weight={self.weight.dtype}, act_dtype={self.act_dtype}"
        )


def _gemv(
    fn: Any, w: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One call of ``quantrt_dense_linear`` (``fn``): ``x @ w.T + b`` in the activations' dtype
    (into ``out`` when given: [M, N] in that dtype, unit column stride)."""
    M, N = x.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype) if out is None else out
    if M == 0:
        return y
    if b is not None and b.dtype not in DTYPE_CODE:
        b = b.float()
    if b is not None and b.stride(0) != 1:
        b = b.contiguous()
    rc = fn(
        w.data_ptr(), DTYPE_CODE[w.dtype], N, w.shape[1], w.stride(0),
        x.data_ptr(), DTYPE_CODE[x.dtype], M, x.stride(0), x.stride(1),
        0 if b is None else b.data_ptr(), 0 if b is None else DTYPE_CODE[b.dtype],
        y.data_ptr(), DTYPE_CODE[y.dtype], y.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        why = "the library was built without the instructions it needs" if rc == 1 else "out of memory"
        raise RuntimeError(f"dense native GEMV failed ({why})")
    return y


def _native(
    lin: DenseLinear, x: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    return _gemv(lin._fn, lin.weight, x, b, out)


def _torch_path(
    lin: DenseLinear, x: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    y = lin._torch(x, b)
    return y if out is None else out.copy_(y)


def make_dense_linear(weight: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype) -> nn.Module:
    """A dense layer for float checkpoint weights: :class:`DenseLinear` for a 16-bit weight on the
    CPU (the weight kept as read), else a plain ``nn.Linear`` in ``act_dtype``."""
    if weight.device.type == "cpu" and weight.dtype in WEIGHT_DTYPES:
        return DenseLinear(weight, bias, act_dtype)
    N, K = weight.shape
    lin = nn.Linear(K, N, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight.to(act_dtype), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.to(act_dtype), requires_grad=False)
    return lin
