"""Benchmark QuantLinear (the dispatcher's choice) against cuBLAS bf16, torch's tinygemm and, for
W8A8 schemes, the bare ``_scaled_mm`` / ``_int_mm``, in one run: medians with the L2 flushed, eager
and CUDA-graph replay, host cost, load figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError

NAME = "bench"
HELP = "time quantrt's kernels beside cuBLAS bf16, torch's int4 op and the bare W8A8 ops (GPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda", help="cuda (the CPU benchmark arrives with the CPU backend)")
    p.add_argument("--quick", action="store_true", help="three shapes and five batch sizes: a few minutes")
    p.add_argument(
        "--schemes", default="w4a16-int-g128-asym,w8a16-int-ch-sym", help="comma-separated schemes"
    )
    p.add_argument("--out", help="write the results JSON to this file")
    p.add_argument("--markdown", help="write the results as a markdown table to this file")


def handle(args: argparse.Namespace) -> int:
    import torch

    from ..bench import MS, QUICK_MS, QUICK_SHAPES, SHAPES, markdown, run_gpu
    from . import emit

    if args.device != "cuda":
        raise ConfigError(f"quantrt bench --device {args.device}: only cuda is benchmarked so far")
    if not torch.cuda.is_available():
        raise ConfigError("quantrt bench: no CUDA device here")
    shapes, ms = (QUICK_SHAPES, QUICK_MS) if args.quick else (SHAPES, MS)
    doc = run_gpu(
        args.schemes.split(","), shapes, ms, progress=lambda s: print(s, file=sys.stderr, flush=True)
    )
    doc["command"] = "quantrt bench " + " ".join(a for a in sys.argv[2:])
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(doc) + "\n")
    if args.json:
        emit(doc)
    else:
        print(markdown(doc))
    return 0
