"""Benchmark QuantLinear (the dispatcher's choice) in one run beside what users run today. GPU:
cuBLAS bf16, torch's tinygemm and, for W8A8 schemes, the bare ``_scaled_mm`` / ``_int_mm``, medians
with the L2 flushed, eager and CUDA-graph replay, host cost, load figures. CPU (``--device cpu``):
dense fp32/bf16 ``F.linear`` and torch's packed int4/int8 ops on the threads asked for."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from . import positive_int, positive_ints

NAME = "bench"
HELP = "time quantrt's kernels beside cuBLAS bf16 and torch's ops (GPU) or dense and packed ops (CPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="which device to benchmark")
    p.add_argument(
        "--quick", action="store_true", help="GPU: three shapes and five batch sizes; CPU: one shape"
    )
    p.add_argument("--schemes", help="comma-separated schemes (default: per device, see quantrt.bench*)")
    p.add_argument("--shapes", help="comma-separated KxN shapes (default: per device and --quick)")
    p.add_argument(
        "--ms",
        type=positive_ints,
        metavar="M[,M...]",
        help="comma-separated batch sizes M, positive integers (default: per device and --quick)",
    )
    p.add_argument(
        "--threads", type=positive_int, help="CPU: torch threads (default: torch's current setting)"
    )
    p.add_argument(
        "--act-dtype", default="bf16", choices=("bf16", "fp16", "fp32"), help="CPU: activation dtype"
    )
    p.add_argument("--out", help="write the results JSON to this file")
    p.add_argument("--markdown", help="write the results as a markdown table to this file")


def handle(args: argparse.Namespace) -> int:
    import torch

    from ..bench import MS, QUICK_MS, QUICK_SHAPES, SHAPES, markdown, run_gpu
    from . import emit

    progress = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.device == "cpu":
        from .. import bench_cpu

        if args.threads:
            torch.set_num_threads(args.threads)
        act = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.act_dtype]
        schemes = args.schemes.split(",") if args.schemes else list(bench_cpu.SCHEMES)
        shapes = _shapes(args.shapes) or (bench_cpu.SHAPES[1:2] if args.quick else bench_cpu.SHAPES)
        ms = args.ms or bench_cpu.MS
        doc = bench_cpu.run_cpu(schemes, shapes, ms, act, progress=progress)
        table = bench_cpu.markdown_cpu(doc)
    else:
        if not torch.cuda.is_available():
            raise ConfigError("quantrt bench: no CUDA device here (--device cpu benchmarks the CPU)")
        shapes, ms = (QUICK_SHAPES, QUICK_MS) if args.quick else (SHAPES, MS)
        shapes, ms = _shapes(args.shapes) or shapes, args.ms or ms
        schemes = args.schemes.split(",") if args.schemes else ["w4a16-int-g128-asym", "w8a16-int-ch-sym"]

        def checkpoint(partial: dict) -> None:
            if args.out:
                Path(args.out).write_text(json.dumps({**partial, "command": _command()}, indent=1))

        doc = run_gpu(schemes, shapes, ms, progress=progress, checkpoint=checkpoint)
        table = markdown(doc)
    doc["command"] = _command()
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        emit(doc)
    else:
        print(table)
    return 0


def _command() -> str:
    return "quantrt bench " + " ".join(a for a in sys.argv[2:])


def _shapes(text: str | None) -> list[tuple[int, int]] | None:
    if not text:
        return None
    try:
        return [(int(k), int(n)) for k, n in (part.lower().split("x") for part in text.split(","))]
    except ValueError:
        raise ConfigError(
            f"quantrt bench --shapes {text!r}: expected KxN[,KxN...], e.g. 4096x14336"
        ) from None
