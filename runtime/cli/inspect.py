"""Inspect a checkpoint: its format, each layer's scheme, sizes on disk against dense 16-bit,
and the layers stored unquantized. Reads only headers and configs."""

from __future__ import annotations

import argparse

NAME = "inspect"
HELP = "show a checkpoint's format, each layer's scheme and its size on disk vs dense"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a checkpoint directory or .safetensors file")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def handle(args: argparse.Namespace) -> int:
    from ..checkpoint import open_checkpoint
    from . import emit

    doc = open_checkpoint(args.path).summary()
    if args.json:
        emit(doc)
        return 0
    print(f"checkpoint  {doc['path']}")
    print(f"format      {doc['format']}  (config: {doc['quantization_config']})")
    print(f"files       {', '.join(doc['files'])}")
    rows = doc["layers"]
    width = max((len(r["layer"]) for r in rows), default=5)
    print(f"{'layer':<{width}}  {'scheme':<28} {'out x in':>13} {'on disk':>12} {'vs 16-bit':>9}")
    for r in rows:
        scheme = r["scheme"] or f"dense {r['dtype']}"
        if r["kind"] != "linear":
            scheme += f" ({r['kind']})"
        print(
            f"{r['layer']:<{width}}  {scheme:<28} {r['out_features']:>6}x{r['in_features']:<6} "
            f"{_mib(r['bytes']):>12} {r['ratio']:>8.3f}x"
        )
    for m in doc["moe_layers"]:
        schemes = ", ".join(f"{p} {s or 'dense'}" for p, s in m["schemes"].items())
        print(
            f"moe         {m['layer']}: {m['experts']} experts, hidden {m['hidden_size']}, "
            f"intermediate {m['intermediate_size']} ({schemes})"
        )
    for attn, kv in doc["kv_cache"].items():
        print(f"kv cache    {attn}: {kv['scheme']} k_scale {kv['k_scale']} v_scale {kv['v_scale']}")
    q, d = doc["quantized_bytes"], doc["quantized_dense_16bit_bytes"]
    print(
        f"{doc['quantized_layers']} quantized layers: {_mib(q)} on disk vs {_mib(d)} dense 16-bit"
        + (f" ({q / d:.3f}x)" if d else "")
        + f"; {doc['unquantized_layers']} unquantized"
    )
    return 0
