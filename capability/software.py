"""Libraries importable for kernels, and the torch quantized ops this torch build has kernels for.

Libraries are found with ``importlib.util.find_spec`` and versioned with ``importlib.metadata``:
nothing is imported, so the probe stays fast (importing triton or cupy alone costs seconds).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

from .kinds import kind_of

#: library name used in Capabilities/DeviceCaps -> (top-level module, distribution names to try)
LIBRARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "triton": ("triton", ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")),
    "cupy": ("cupy", ()),
    "aiter": ("aiter", ("amd-aiter", "aiter")),
    "ipex": ("intel_extension_for_pytorch", ("intel-extension-for-pytorch",)),
    "neural_compressor": ("neural_compressor", ("neural-compressor", "neural-compressor-pt")),
    "bitsandbytes": ("bitsandbytes", ("bitsandbytes",)),
    "amdsmi": ("amdsmi", ("amdsmi",)),
    "pynvml": ("pynvml", ("nvidia-ml-py", "pynvml")),
    "flashinfer": ("flashinfer", ("flashinfer-python", "flashinfer")),
    "deep_gemm": ("deep_gemm", ("deep-gemm", "deep_gemm")),
    "gguf": ("gguf", ("gguf",)),
    "transformers": ("transformers", ("transformers",)),
    "compressed_tensors": ("compressed_tensors", ("compressed-tensors",)),
}

#: torch ops (without the ``aten::`` prefix) whose kernels quantized paths rely on.
TORCH_OPS = (
    "_weight_int4pack_mm",
    "_weight_int4pack_mm_for_cpu",
    "_weight_int8pack_mm",
    "_int_mm",
    "_scaled_mm",
    "_scaled_grouped_mm",
    "_dyn_quant_matmul_4bit",
    "_weight_int4pack_mm_with_scales_and_zeros",
    "_convert_weight_to_int4pack",
    "_convert_weight_to_int4pack_for_cpu",
)


def real_find_spec(module: str) -> bool:
    """Whether a top-level module is importable, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def real_version(module: str) -> str | None:
    """The installed version of the distribution that ships ``module``, or None when unknown."""
    for name, (mod, dists) in LIBRARIES.items():
        if mod != module:
            continue
        if name == "cupy":
            return _prefixed_version("cupy")
        for dist in dists:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return None


def _prefixed_version(prefix: str) -> str | None:
    """Version of the first distribution named ``prefix`` or ``prefix-*`` (cupy-cuda12x, cupy-rocm-6-0)."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == prefix or name.startswith(prefix + "-"):
            return dist.version
    return None


def probe_libraries(
    find_spec: Callable[[str], Any] | None, version: Callable[[str], str | None] | None
) -> tuple[dict[str, str], list[str]]:
    """Importable libraries -> version ("" when the version is unknown), plus notes."""
    if find_spec is None:
        return {}, ["software: no module finder given, no library reported"]
    found: dict[str, str] = {}
    notes: list[str] = []
    for name, (module, _) in LIBRARIES.items():
        try:
            if not find_spec(module):
                continue
        except Exception as e:
            notes.append(f"software: looking for {module} failed: {type(e).__name__}: {e}")
            continue
        ver = None
        if version is not None:
            try:
                ver = version(module)
            except Exception as e:
                notes.append(f"software: version of {module} unknown: {type(e).__name__}: {e}")
        found[name] = ver or ""
    return found, notes


def device_libraries(kind: str, found: Iterable[str]) -> frozenset[str]:
    """The importable libraries that have kernels or runtimes for this device kind."""
    have = set(found)
    k = kind_of(kind)
    return frozenset(n for n in (k.libraries if k is not None else ()) if n in have)


def torch_ops(torch: Any, dispatch_key: str) -> frozenset[str]:
    """Ops of TORCH_OPS that this torch build registers a kernel for under ``dispatch_key``."""
    if torch is None:
        return frozenset()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = set()
    for op in TORCH_OPS:
        try:
            if has(f"aten::{op}", dispatch_key):
                out.add(op)
        except RuntimeError:
            continue
    return frozenset(out)
