"""Quantize a dense checkpoint and write it in a format other tools read (compressed-tensors, GPTQ, fp8):
``quantrt quantize SRC DST --scheme w4a16-int-g128-asym``. Layers are chosen as ``quantrt run
--quantize`` chooses them (the output head and MoE routers stay dense); one layer at a time, so
host memory stays one shard plus one layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "quantize"
HELP = "quantize a dense checkpoint and write it (compressed-tensors, GPTQ, fp8)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="a dense checkpoint folder (config.json + safetensors)")
    p.add_argument("dst", help="the folder to write (new or empty)")
    p.add_argument(
        "--scheme", required=True, help="a catalog scheme (quantrt explain --scheme all lists them)"
    )
    p.add_argument(
        "--format", default="compressed-tensors", choices=["compressed-tensors", "gptq"], dest="fmt"
    )
    p.add_argument("--device", default="cpu", help="where the quantizer runs (default cpu; cuda: on the GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def handle(args: argparse.Namespace) -> int:
    from ..writers import write_quantized
    from . import emit

    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="quantizing", unit="layer", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        out = write_quantized(
            Path(args.src), Path(args.dst), args.scheme, args.fmt, device=args.device, progress=progress
        )
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        emit(out)
    else:
        layers = ", ".join(f"{n} x {s}" for s, n in out["layers"].items())
        print(
            f"wrote {out['destination']} ({out['format']}): {layers}; {out['bytes_written'] / 2**20:.1f} MiB"
        )
        if out["dense_linear_layers"]:
            print(f"kept dense: {', '.join(out['dense_linear_layers'])}")
    return 0
