"""The CPU benchmark: ``QuantLinear.__call__`` with the dispatcher's choice beside what a CPU user
runs today, dense fp32 and bf16 ``F.linear`` and torch's packed int4/int8 ops, in one process and
one run on the threads torch is set to use.

Times are medians of repeated calls (after warm-up), each repeat long enough to be timed by
``perf_counter``. Within a row, quantrt and every baseline run interleaved repeat by repeat
(:func:`interleaved_ms`), so a co-tenant slowing the machine for a few seconds moves them alike
and the ratios hold; timing the dense baselines once per shape and the schemes minutes later let
such noise through (2026-12-03: the same cell's dense bf16 time moved between 7.6 and 10.7 ms). Every row records kernel, strategy, threads, git SHA and versions; load figures
give the prepared weight's bytes (from the storages the kernel's state holds) against the bytes the
checkpoint stores, the issue's memory rule (within 1.10x).
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .bench import git_sha, versions

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # K x N
MS = (1, 8, 64)
SCHEMES = (
    "w4a16-int-g128-sym",
    "w4a16-int-g128-asym",
    "w8a16-int-ch-sym",
    "w4a16-nf4-g64",
    "w8a16-fp8-ch",
    "w4a16-nvfp4",
    "w4a16-mxfp4",
)
#: baselines timed per scheme family: torch's packed op through its registered kernel
TORCH_PACKED = {("int", 4): "cpu.torch_int4pack", ("int", 8): "cpu.torch_int8pack"}


def interleaved_ms(fns: dict[str, Callable[[], Any]], min_s: float = 0.25, reps: int = 7) -> dict[str, float]:
    """Per function, the median over ``reps`` rounds of the mean time of back-to-back calls (ms);
    each round runs every function in turn, each for about ``min_s / reps`` seconds."""
    inner = {}
    for k, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        inner[k] = max(1, int(min_s / reps / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                fn()
            times[k].append((time.perf_counter() - t0) / inner[k])
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def state_bytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages reachable from a kernel state (dataclasses, tuples,
    lists, dicts): what the prepared weight occupies."""
    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        elif isinstance(o, (tuple, list)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
    return total


def packed_baseline(canon: Any, act_dtype: torch.dtype) -> tuple[str, Callable[[torch.Tensor], Any]] | None:
    """torch's own packed op on the same weights, through the kernel that wraps it, if it applies."""
    from .capability import probe
    from .kernels import registry
    from .specs import LayerSpec

    s = canon.scheme
    name = TORCH_PACKED.get((s.weight, s.bits)) if s.weight_only else None
    kernel = registry().get(name) if name else None
    if kernel is None:
        return None
    spec = LayerSpec(s, canon.K, canon.N, act_dtype=act_dtype)
    if not kernel.supports(spec, probe().cpu).ok:
        return None
    k = kernel()
    state = k.prepare(canon, spec)
    return name, lambda x: k.apply(state, x)


def run_cpu(
    schemes: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    ms: Sequence[int],
    act_dtype: torch.dtype = torch.bfloat16,
    progress: Callable[[str], None] = print,
    seed: int = 0,
) -> dict[str, Any]:
    """Benchmark every scheme x shape x M on the CPU with torch's current thread count."""
    from .capability import probe
    from .layers import QuantLinear
    from .reference import quantize

    cpu = probe().cpu
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": f"{cpu.name} ({cpu.microarch})",
        "features": sorted(cpu.features),
        "threads": torch.get_num_threads(),
        "act_dtype": str(act_dtype).replace("torch.", ""),
        "git_sha": git_sha(),
        "versions": {**versions(), "platform": platform.platform()},
        "rows": [],
        "load": [],
    }
    g = torch.Generator().manual_seed(seed)
    for K, N in shapes:
        w = torch.randn(N, K, generator=g) * 0.02
        xs = {m: torch.randn(m, K, generator=g) for m in ms}
        w16 = w.to(torch.bfloat16)
        for scheme in schemes:
            progress(f"{scheme} {K}x{N}: quantizing")
            canon = quantize(w, scheme)
            t0 = time.perf_counter()
            layer = QuantLinear.from_canonical(canon, device="cpu", act_dtype=act_dtype)
            prep = time.perf_counter() - t0
            prepared = state_bytes(layer._state.layout)
            doc["load"].append(
                {
                    "scheme": scheme,
                    "K": K,
                    "N": N,
                    "kernel": layer.kernel_name,
                    "prepare_s": round(prep, 4),
                    "stored_MB": round(canon.nbytes / 2**20, 2),
                    "prepared_MB": round(prepared / 2**20, 2),
                    "prepared_vs_stored": round(prepared / canon.nbytes, 3),
                }
            )
            base = packed_baseline(canon, act_dtype)
            for m in ms:
                row = _row(scheme, K, N, m, layer, base, xs[m], act_dtype, w, w16)
                doc["rows"].append(row)
                progress(
                    f"  M={m}: {row['quantrt_ms']:.3f} ms, {row['vs_dense_bf16']}x dense bf16 "
                    f"({row['kernel']}: {row['strategy']})"
                )
    return doc


def _row(
    scheme: str,
    K: int,
    N: int,
    m: int,
    layer: Any,
    base: Any,
    x32: torch.Tensor,
    act_dtype: torch.dtype,
    w: torch.Tensor,
    w16: torch.Tensor,
) -> dict[str, Any]:
    """One cell: quantrt, dense fp32 and bf16 ``F.linear`` and the packed baseline, interleaved."""
    import torch.nn.functional as F

    x, x16 = x32.to(act_dtype), x32.to(torch.bfloat16)
    fns: dict[str, Callable[[], Any]] = {
        "quantrt_ms": lambda: layer(x),
        "dense_fp32_ms": lambda: F.linear(x32, w),
        "dense_bf16_ms": lambda: F.linear(x16, w16),
    }
    if base is not None:
        name, fn = base
        fns[f"{name}_ms"] = lambda: fn(x)
    row: dict[str, Any] = {
        "scheme": scheme,
        "K": K,
        "N": N,
        "M": m,
        "kernel": layer.kernel_name,
        "strategy": layer._kernel.strategy(layer._state, m),
        **interleaved_ms(fns),
    }
    if base is not None:
        row[f"vs_{name}"] = round(row[f"{name}_ms"] / row["quantrt_ms"], 3)
    row["vs_dense_bf16"] = round(row["dense_bf16_ms"] / row["quantrt_ms"], 3)
    row["vs_dense_fp32"] = round(row["dense_fp32_ms"] / row["quantrt_ms"], 3)
    return row


def markdown_cpu(doc: dict[str, Any]) -> str:
    """The table docs/performance.md keeps for one CPU benchmark file."""
    head = (
        f"{doc['date']}, {doc['device']}, {doc['threads']} threads, activations {doc['act_dtype']}, "
        f"git {doc['git_sha']}, torch {doc['versions']['torch']}\n\n"
        "| scheme | K x N | M | kernel / strategy | quantrt ms | dense bf16 ms | vs dense bf16 "
        "| vs dense fp32 | vs torch packed op |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in doc["rows"]:
        packed = next((f"{k[3:]} {v}" for k, v in r.items() if k.startswith("vs_cpu.")), "-")
        lines.append(
            f"| {r['scheme']} | {r['K']}x{r['N']} | {r['M']} | {r['kernel']} {r['strategy']} "
            f"| {r['quantrt_ms']:.3f} | {r['dense_bf16_ms']:.3f} | {r['vs_dense_bf16']} "
            f"| {r['vs_dense_fp32']} | {packed} |"
        )
    load = "\n\n| scheme | K x N | kernel | stored MB | prepared MB | prepared / stored |\n| --- | --- | --- | --- | --- | --- |\n"
    load += "\n".join(
        f"| {r['scheme']} | {r['K']}x{r['N']} | {r['kernel']} | {r['stored_MB']} | {r['prepared_MB']} "
        f"| {r['prepared_vs_stored']} |"
        for r in doc["load"]
    )
    return head + "\n".join(lines) + load
