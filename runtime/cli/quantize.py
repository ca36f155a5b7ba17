"""Quantize a dense checkpoint and write it in a format other tools read (compressed-tensors, GPTQ,
AWQ, fp8): ``quantrt quantize SRC DST --scheme w4a16-int-g128-asym``; or as a GGUF, from a
Llama/Qwen folder or another GGUF (``quantrt quantize model.gguf out.gguf --scheme gguf-q8_0``). Layers are chosen as
``quantrt run --quantize`` chooses them (the output head and MoE routers stay dense); one layer at a
time, so host memory stays one shard plus one layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "quantize"
HELP = "quantize a dense checkpoint and write it (compressed-tensors, GPTQ, AWQ, fp8, GGUF)"
#: what --format takes (quantrt.writers.WRITERS and the GGUF writer; a test keeps them equal)
FORMATS = ("compressed-tensors", "gptq", "awq", "fp8", "gguf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="a dense checkpoint folder (config.json + safetensors), or a .gguf file")
    p.add_argument("dst", help="the folder to write (new or empty), or the .gguf file to write")
    p.add_argument(
        "--scheme", required=True, help="a catalog scheme (quantrt explain --scheme all lists them)"
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        dest="fmt",
        help="default: gguf for a .gguf source, compressed-tensors otherwise",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="PATTERN=SCHEME",
        help="another scheme (or 'dense') for the layers or GGUF tensors matching an fnmatch pattern",
    )
    p.add_argument(
        "--search",
        choices=["mse"],
        help="integer schemes: pick each group's range by least squared error (slower, lower error)",
    )
    p.add_argument("--device", default="cpu", help="where the quantizer runs (default cpu; cuda: on the GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def handle(args: argparse.Namespace) -> int:
    from ..errors import CheckpointError
    from ..formats.online import OnlineQuantization
    from ..writers import write_quantized
    from ..writers.gguf import DEFAULT_SKIP as GGUF_SKIP
    from ..writers.gguf import write_gguf
    from ..writers.gguf_hf import write_gguf_from_hf
    from . import emit

    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="quantizing", unit="layer", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    src = Path(args.src)
    gguf_source = src.suffix.lower() == ".gguf"
    fmt = args.fmt or (
        "gguf" if gguf_source or Path(args.dst).suffix.lower() == ".gguf" else "compressed-tensors"
    )
    if gguf_source and fmt != "gguf":
        raise CheckpointError(f"{src}: a .gguf source is re-quantized into a GGUF (--format gguf), not {fmt}")
    overrides = {}
    for rule in args.override:
        pattern, sep, scheme = rule.partition("=")
        if not sep or not pattern or not scheme:
            raise CheckpointError(f"--override {rule!r}: expected PATTERN=SCHEME (or PATTERN=dense)")
        overrides[pattern] = None if scheme == "dense" else scheme
    try:
        if fmt == "gguf":
            if args.search:
                raise CheckpointError(
                    "--search mse covers integer schemes; GGUF types are rounded to nearest"
                )
            spec = OnlineQuantization(args.scheme, overrides=overrides, skip=GGUF_SKIP)
            write = write_gguf if gguf_source else write_gguf_from_hf
            out = write(src, Path(args.dst), spec, progress=progress)
        else:
            spec = OnlineQuantization(args.scheme, overrides=overrides, search=args.search)
            out = write_quantized(src, Path(args.dst), spec, fmt, device=args.device, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        emit(out)
    elif fmt == "gguf":
        tensors = ", ".join(f"{n} x {t}" for t, n in out["tensors"].items())
        print(f"wrote {out['destination']} (gguf): {tensors}; {out['bytes_written'] / 2**20:.1f} MiB")
        if "copied_as_stored" in out:
            print(
                f"copied as stored: {len(out['copied_as_stored'])} tensors (norms, skipped, not whole blocks)"
            )
    else:
        layers = ", ".join(f"{n} x {s}" for s, n in out["layers"].items())
        print(
            f"wrote {out['destination']} ({out['format']}): {layers}; {out['bytes_written'] / 2**20:.1f} MiB"
        )
        if out["dense_linear_layers"]:
            print(f"kept dense: {', '.join(out['dense_linear_layers'])}")
        errs = sorted(out["relative_error"].items(), key=lambda kv: kv[1])
        if errs:
            worst = ", ".join(f"{p} {e:.4f}" for p, e in errs[:-4:-1])
            print(
                f"relative error ||W - Q(W)|| / ||W||: median {errs[len(errs) // 2][1]:.4f}, worst {worst} "
                "(--json lists every layer)"
            )
    return 0
