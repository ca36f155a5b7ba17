"""Run a model through quantrt's kernels and check every result against the reference.

With a PATH (a checkpoint folder or a .gguf file) it loads that model and generates from
``--prompt``: see :mod:`quantrt.cli.run_model`. With no PATH this runs the embedded default: a small model built on the fly from a fixed
seed (a 4096x4096 projection feeding a 4096x14336 one, llama-sized), quantized by
round-to-nearest into each catalog scheme that has a native kernel on this machine,
dispatched, run, and compared with the fp32 reference; it prints the scheme, the kernel, the
error against the reference and the time against dense ``F.linear``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from ..dispatch import device_of, select
from ..env import Overrides
from ..plans import layer_spec
from ..schemes import Scheme, catalog, parse_scheme
from . import positive_int, positive_ints

NAME = "run"
HELP = "run a checkpoint (generate from --prompt), or the embedded default model, through quantrt"

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: (name, K, N) of the embedded default model's layers, applied in order
DEFAULT_LAYERS = (("q_proj", 4096, 4096), ("up_proj", 4096, 14336))
SEED = 0
#: relative Frobenius error vs the reference that counts as a pass, per activation dtype
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1.5e-2, torch.float16: 5e-3}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a checkpoint folder or .gguf file (none: the embedded default)")
    p.add_argument(
        "--schemes", help="comma-separated schemes (default: every catalog scheme with a native kernel here)"
    )
    p.add_argument("--all", action="store_true", help="also run schemes only the reference can run here")
    p.add_argument(
        "--m",
        type=positive_ints,
        default=[1, 16],
        metavar="M[,M...]",
        help="batch sizes to run, comma-separated positive integers (default 1,16)",
    )
    p.add_argument("--device", help="device (default: cuda if available, else cpu)")
    p.add_argument(
        "--act-dtype", choices=sorted(DTYPES), default="bf16", help="activation dtype (default bf16)"
    )
    p.add_argument(
        "--repeat", type=positive_int, default=10, help="timed repetitions per measurement (median)"
    )
    from . import run_model

    run_model.add_arguments(p)


def default_model(seed: int = SEED) -> list[tuple[str, torch.Tensor]]:
    """The embedded model's dense fp32 weights: normal(0, 0.02) with three outlier input columns."""
    g = torch.Generator().manual_seed(seed)
    layers = []
    for name, K, N in DEFAULT_LAYERS:
        w = torch.randn(N, K, generator=g) * 0.02
        cols = torch.randint(0, K, (3,), generator=g)
        w[:, cols] *= 8.0
        layers.append((name, w))
    return layers


def _time(fn: Callable[[], Any], device: torch.device, repeat: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _schemes(args: argparse.Namespace, device: str, act: torch.dtype) -> list[tuple[Scheme, bool]]:
    chosen = [parse_scheme(s) for s in args.schemes.split(",")] if args.schemes else list(catalog())
    ov = Overrides.from_env()
    quiet = Overrides(ov.backend, ov.kernel, ov.kernel_by_scheme, ov.disabled, None, "allow")
    out = []
    for s in chosen:
        native = all(
            select(layer_spec(s, K, N, act_dtype=act), device, overrides=quiet).kernel.backend != "reference"
            for _, K, N in DEFAULT_LAYERS
        )
        if native or args.all or args.schemes:
            out.append((s, native))
    return out


def handle(args: argparse.Namespace) -> int:
    from ..layers import QuantLinear
    from ..reference import linear as ref_linear
    from ..reference import quantize
    from . import emit

    if args.path:
        from . import run_model

        return run_model.handle(args)
    act = DTYPES[args.act_dtype]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ms: list[int] = args.m
    dev = device_of(device)
    schemes = _schemes(args, dev, act)
    weights = default_model()
    g = torch.Generator().manual_seed(SEED + 1)
    calib = {name: torch.randn(64, w.shape[1], generator=g) for name, w in weights}
    xs = {m: torch.randn(m, DEFAULT_LAYERS[0][1], generator=g).to(device, act) for m in ms}
    dense = [w.to(device, act) for _, w in weights]

    rows: list[dict[str, Any]] = []
    failed = 0
    for i, (scheme, native) in enumerate(schemes, 1):
        print(
            f"[{i}/{len(schemes)}] {scheme}: quantizing {len(weights)} layers ...",
            file=sys.stderr,
            flush=True,
        )
        canon = [quantize(w, scheme, calib=calib[name]) for name, w in weights]
        layers = [
            QuantLinear.from_canonical(c, device=device, act_dtype=act, prefix=name)
            for (name, _), c in zip(weights, canon)
        ]
        kernel = layers[0].kernel_name
        label = layers[0].selection.label if layers[0].selection else "?"
        weight_only_ref = label == "weight-only substitute"
        for m in ms:
            x = xs[m]
            errs = []
            h = x
            for layer, c in zip(layers, canon):
                y = layer(h)
                ref = ref_linear(h, c, out_dtype=torch.float32, weight_only=weight_only_ref)
                errs.append(float((y.double() - ref.double()).norm() / ref.double().norm()))
                h = y
            t_q = _time(lambda x=x, layers=layers: _chain(x, layers), device, args.repeat)
            t_d = _time(lambda x=x: _dense(x, dense), device, args.repeat)
            ok = max(errs) <= TOLERANCE[act]
            failed += not ok
            rows.append(
                {
                    "scheme": scheme.name,
                    "kernel": kernel,
                    "label": label,
                    "native": native,
                    "M": m,
                    "errors": {name: e for (name, _), e in zip(weights, errs)},
                    "ms": round(t_q, 4),
                    "dense_ms": round(t_d, 4),
                    "speedup": round(t_d / t_q, 3),
                    "ok": ok,
                }
            )
    if args.json:
        emit(
            {
                "device": str(device),
                "act_dtype": args.act_dtype,
                "tolerance": TOLERANCE[act],
                "model": [{"name": n, "K": k, "N": nn} for n, k, nn in DEFAULT_LAYERS],
                "seed": SEED,
                "results": rows,
                "failed": failed,
            }
        )
    else:
        _print_table(rows, device, args.act_dtype)
    return 1 if failed else 0


def _chain(x: torch.Tensor, layers: list[Any]) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


def _dense(x: torch.Tensor, dense: list[torch.Tensor]) -> torch.Tensor:
    for w in dense:
        x = torch.nn.functional.linear(x, w)
    return x


def _print_table(rows: list[dict[str, Any]], device: torch.device, act: str) -> None:
    names = " + ".join(f"{n} {k}x{nn}" for n, k, nn in DEFAULT_LAYERS)
    print(f"embedded default model ({names}, seed {SEED}) on {device}, activations {act}")
    print(
        f"{'scheme':<28} {'kernel':<24} {'M':>4} {'max err':>9} {'ms':>9} {'dense ms':>9} {'speedup':>8}  check"
    )
    for r in rows:
        err = max(r["errors"].values())
        print(
            f"{r['scheme']:<28} {r['kernel']:<24} {r['M']:>4} {err:>9.2e} {r['ms']:>9.3f} "
            f"{r['dense_ms']:>9.3f} {r['speedup']:>7.2f}x  {'ok' if r['ok'] else 'FAIL'}"
        )
    if not rows:
        print("no scheme has a native kernel on this device; --all runs the reference for every scheme")
