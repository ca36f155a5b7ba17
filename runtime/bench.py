"""The benchmark harness: ``QuantLinear.__call__`` with the dispatcher's choice, beside the
baselines a user has today, in one process and one run.

GPU: cuBLAS bf16 (``F.linear``), torch's tinygemm (``_weight_int4pack_mm``) for int4, and for W8A8
the bare torch ops on activations quantized beforehand (``_scaled_mm`` row-wise and per tensor,
``_int_mm``), so quantrt's time, activation quantization included, is set against the op's
alone; medians with the
L2 flushed (``triton.testing.do_bench``), eager and CUDA-graph replay; the copy bandwidth of this
GPU as the ceiling for weight streaming; host cost per call; load figures (prepare time, peak
memory). Every row records kernel, strategy, git SHA, device and versions.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

SHAPES = ((4096, 4096), (4096, 28672), (14336, 4096), (8192, 57344), (28672, 8192))
MS = (1, 16, 64, 256, 4096)
QUICK_SHAPES = ((4096, 4096), (8192, 57344), (28672, 8192))
QUICK_MS = (1, 16, 64, 256, 4096)
HOST_SHAPE = (1024, 1024)  # K x N of the host-cost layer: every scheme's blocks divide it
OP_NAMES = ("scaled_mm_rowwise", "scaled_mm_tensor", "int_mm")  # bare torch ops timed for W8A8 schemes


def random_weight(scheme: str, N: int, K: int, device: str = "cuda") -> Any:
    """A quantized random layer for benchmarks and sweeps: GGUF as random llama.cpp blocks (every
    code and scale byte random, weight-sized f16 fields; its quantizers are slow at these sizes),
    every other scheme the reference quantizer on N(0, 0.02) weights."""
    from .canonical import CanonicalWeight
    from .reference import quantize
    from .reference.gguf import random_blocks
    from .schemes import parse_scheme

    s = parse_scheme(scheme)
    if s.family == "gguf":
        q = random_blocks(s.gguf_type, N, K, seed=N * K).to(device)
        return CanonicalWeight(s, N, K, {"qweight": q})
    return quantize(torch.randn(N, K, device=device) * 0.02, scheme)


def run_header(what: str, script: str, args: Any) -> dict[str, Any]:
    """The fields every GPU benchmark file starts with: what it times, when, where, on which tree
    and versions, the exact command (``args``: the script's parsed arguments)."""
    return {
        "what": what,
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "git": git_sha(),
        "versions": versions(),
        "command": f"python3 {script} " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
    }


def git_sha() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "missing"
    return out


def median_us(fn: Callable[[], Any], graph: bool = False) -> float:
    """Median time of ``fn`` in microseconds, L2 flushed between runs (triton's do_bench)."""
    import triton.testing as tt

    if graph:
        return float(tt.do_bench_cudagraph(fn, rep=60, return_mode="median")) * 1e3
    return float(tt.do_bench(fn, warmup=15, rep=60, return_mode="median")) * 1e3


#: how the L2 is flushed between timed runs (:func:`l2_flush`)
FLUSH_MODES = ("write", "read")


@contextlib.contextmanager
def l2_flush(mode: str = "write") -> Iterator[None]:
    """Triton's ``do_bench`` flush as ``mode`` inside the block. ``write``: its own, zeroing a
    256 MB buffer, which leaves the L2 full of dirty lines that the timed kernel's first reads
    evict and write back (about the L2's size in DRAM writes, charged to a short kernel).
    ``read``: the same buffer read (a sum), which evicts as much and leaves the L2 clean, as a
    decode step finds it after the weight-streaming GEMM before it."""
    if mode not in FLUSH_MODES:
        raise ValueError(f"l2_flush: mode must be one of {FLUSH_MODES}, found {mode!r}")
    if mode == "write":
        yield
        return
    import triton

    drv = triton.runtime.driver.active
    drv.clear_cache = lambda cache: cache.sum()
    try:
        yield
    finally:
        del drv.clear_cache


def graph_replay_us(fn: Callable[[], Any], warmup_ms: int = 10, rep_ms: int = 50) -> tuple[float | None, str]:
    """Median of ``fn`` captured in a CUDA graph and replayed (L2 flushed between replays, after a
    warm-up call and a side-stream run as capture requires); None and the error when ``fn`` cannot
    be captured (a path that synchronises), so a benchmark records why and times the rest."""
    import triton.testing as tt

    try:
        fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return float(tt.do_bench(g.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3, ""
    except Exception as e:
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def copy_bandwidth_tbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second: the streaming ceiling."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = median_us(lambda: dst.copy_(src)) * 1e-6
    return 2 * nbytes / t / 1e12


def host_us(fn: Callable[[], Any], calls: int = 2000, repeats: int = 5) -> float:
    """Host time per call: back-to-back calls on a tiny problem, one synchronisation at the end of
    each of ``repeats`` rounds of ``calls // repeats``; the median round (one round caught by a
    stray pause elsewhere on the machine otherwise reads as a slow kernel)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    per = max(1, calls // repeats)
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / per * 1e6)
    return statistics.median(rounds)


def profile_text(fn: Callable[[], Any], calls: int = 500, top: int = 18) -> str:
    """The top ``top`` functions by own time of ``calls`` back-to-back calls of ``fn`` (cProfile),
    where a call's host time goes."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def tinygemm_baseline(canon: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """torch's own int4 op on the same weights, through the registered kernel that wraps it."""
    from .kernels import registry
    from .specs import LayerSpec

    kernel = registry().get("cuda.torch_tinygemm")
    if kernel is None:
        return None
    spec = LayerSpec(canon.scheme, canon.K, canon.N, act_dtype=torch.bfloat16)
    k = kernel()
    state = k.prepare(canon, spec)
    return lambda x: k.apply(state, x)


def op_baselines(canon: Any) -> dict[str, Callable[[torch.Tensor], Callable[[], Any]]]:
    """For W8A8 schemes, torch's bare ops on the same weights; each entry takes x and returns the
    call to time, with x already quantized (scales of one: the op's time does not depend on them)."""
    s = canon.scheme
    w = canon["qweight"]
    N = canon.N
    if s.act == "fp8_e4m3" and canon.K % 16 == 0 and N % 16 == 0:
        wt = w.t()
        one = torch.ones((), device=w.device)
        ones_n = torch.ones(1, N, device=w.device)

        def rowwise(x: torch.Tensor) -> Callable[[], Any]:
            xq, sa = x.to(torch.float8_e4m3fn), torch.ones(x.shape[0], 1, device=x.device)
            return lambda: torch._scaled_mm(xq, wt, sa, ones_n, out_dtype=torch.bfloat16)

        def tensorwise(x: torch.Tensor) -> Callable[[], Any]:
            xq = x.to(torch.float8_e4m3fn)
            return lambda: torch._scaled_mm(xq, wt, one, one, out_dtype=torch.bfloat16)

        return {"scaled_mm_rowwise": rowwise, "scaled_mm_tensor": tensorwise}
    if s.act == "int8" and canon.K % 8 == 0 and N % 8 == 0:
        wt = (w.to(torch.int16) - 128).to(torch.int8).t()

        def int_mm(x: torch.Tensor) -> Callable[[], Any]:
            xq = torch.randint(
                -128, 128, (max(x.shape[0], 17), x.shape[1]), device=x.device, dtype=torch.int8
            )
            return lambda: torch._int_mm(xq, wt)

        return {"int_mm": int_mm}
    return {}


def measure(
    layer: Any, dense: torch.Tensor, tiny: Any, x: torch.Tensor, ops: dict[str, Any] | None = None
) -> dict[str, float]:
    """quantrt, cuBLAS bf16, tinygemm and the scheme's bare torch ops on one input, eager and
    (except the bare ops) under CUDA-graph replay."""
    import torch.nn.functional as F

    out = {
        "quantrt_us": median_us(lambda: layer(x)),
        "quantrt_graph_us": median_us(lambda: layer(x), graph=True),
        "cublas_bf16_us": median_us(lambda: F.linear(x, dense)),
        "cublas_bf16_graph_us": median_us(lambda: F.linear(x, dense), graph=True),
    }
    if tiny is not None:
        out["tinygemm_us"] = median_us(lambda: tiny(x))
        out["tinygemm_graph_us"] = median_us(lambda: tiny(x), graph=True)
    for name, make in (ops or {}).items():
        out[f"{name}_us"] = median_us(make(x))
    return out


def run_gpu(
    schemes: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    ms: Sequence[int],
    progress: Callable[[str], None] = print,
    seed: int = 0,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Benchmark every scheme x shape x M on the current CUDA device. ``checkpoint`` gets the
    document so far after every scheme and shape (a run stopped by a time limit keeps its rows)."""
    import torch.nn.functional as F

    from .layers import QuantLinear
    from .reference import quantize

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": props.name,
        "capability": "sm_{}{}".format(*torch.cuda.get_device_capability(dev)),
        "git_sha": git_sha(),
        "versions": versions(),
        "copy_TBps": round(copy_bandwidth_tbps(), 3),
        "rows": [],
        "load": [],
        "host": {},
    }
    g = torch.Generator(device=dev).manual_seed(seed)
    for scheme in schemes:
        for K, N in shapes:
            progress(f"{scheme} {K}x{N}: quantizing")
            w = torch.randn(N, K, generator=g, device=dev) * 0.02
            canon = quantize(w, scheme)
            dense = w.to(torch.bfloat16)
            del w
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            layer = QuantLinear.from_canonical(canon, device=dev, act_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            prep = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated() - base
            stored = canon.nbytes
            doc["load"].append(
                {
                    "scheme": scheme,
                    "K": K,
                    "N": N,
                    "kernel": layer.kernel_name,
                    "prepare_s": round(prep, 4),
                    "peak_MB": round(peak / 2**20, 1),
                    "stored_MB": round(stored / 2**20, 1),
                }
            )
            tiny = (
                tinygemm_baseline(canon) if canon.scheme.bits == 4 and canon.scheme.weight == "int" else None
            )
            ops = op_baselines(canon)
            for m in ms:
                x = torch.randn(m, K, generator=g, device=dev).to(torch.bfloat16)
                row: dict[str, Any] = {
                    "scheme": scheme,
                    "K": K,
                    "N": N,
                    "M": m,
                    "kernel": layer.kernel_name,
                    "strategy": layer._kernel.strategy(layer._state, m),
                }
                row.update(measure(layer, dense, tiny, x, ops))
                row["vs_cublas"] = round(row["cublas_bf16_us"] / row["quantrt_us"], 3)
                row["vs_cublas_graph"] = round(row["cublas_bf16_graph_us"] / row["quantrt_graph_us"], 3)
                if tiny is not None:
                    row["vs_tinygemm"] = round(row["tinygemm_us"] / row["quantrt_us"], 3)
                for name in ops:
                    row[f"vs_{name}"] = round(row[f"{name}_us"] / row["quantrt_us"], 3)
                row["weight_TBps"] = round(stored / (row["quantrt_us"] * 1e-6) / 1e12, 3)
                doc["rows"].append(row)
                progress(
                    f"  M={m}: {row['quantrt_us']:.1f} us, {row['vs_cublas']}x cuBLAS ({row['strategy']})"
                )
            del layer, dense, canon, tiny, ops
            torch.cuda.empty_cache()
            if checkpoint is not None:
                checkpoint({**doc, "partial": True})
    # host cost of one call at M=1 against F.linear, on a layer small enough that the GPU keeps up
    # with back-to-back calls (on the large shapes the GPU time would be measured instead)
    K, N = HOST_SHAPE
    canon = quantize(torch.randn(N, K, device=dev) * 0.02, schemes[0])
    layer = QuantLinear.from_canonical(canon, device=dev, act_dtype=torch.bfloat16)
    dense = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    doc["host"] = {
        "scheme": schemes[0],
        "K": K,
        "N": N,
        "quantrt_us": round(host_us(lambda: layer(x)), 2),
        "F_linear_us": round(host_us(lambda: F.linear(x, dense)), 2),
    }
    doc["host"]["ratio"] = round(doc["host"]["quantrt_us"] / doc["host"]["F_linear_us"], 3)
    return doc


def markdown(doc: dict[str, Any]) -> str:
    """The table docs/performance.md keeps for one benchmark file."""
    lines = [
        f"{doc['date']}, {doc['device']} ({doc['capability']}), git {doc['git_sha']}, torch "
        f"{doc['versions']['torch']}, triton {doc['versions'].get('triton')}; copy ceiling "
        f"{doc['copy_TBps']} TB/s; host cost per call at M=1 ({doc['host'].get('scheme')} "
        f"{doc['host'].get('K')}x{doc['host'].get('N')}): quantrt {doc['host'].get('quantrt_us')} us vs "
        f"F.linear {doc['host'].get('F_linear_us')} us",
        "",
        "| scheme | K x N | M | kernel / strategy | quantrt us | vs cuBLAS bf16 | graph: vs cuBLAS | vs tinygemm "
        "| vs bare torch op | weights TB/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["rows"]:
        ops = ", ".join(f"{k[3:]} {v}" for k, v in r.items() if k.startswith("vs_") and k[3:] in OP_NAMES)
        lines.append(
            f"| {r['scheme']} | {r['K']}x{r['N']} | {r['M']} | {r['kernel']} {r['strategy']} | "
            f"{r['quantrt_us']:.1f} | {r['vs_cublas']} | {r['vs_cublas_graph']} | "
            f"{r.get('vs_tinygemm', '-')} | {ops or '-'} | {r['weight_TBps']} |"
        )
    return "\n".join(lines)
