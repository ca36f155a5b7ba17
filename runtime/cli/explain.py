"""Explain the dispatch plan: for a checkpoint, or a scheme and shape, on this machine or a preset,
which kernel runs each layer, the order the candidates were tried in and what every one said."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from ..capability import load_capabilities
from ..env import Overrides
from ..errors import ConfigError
from ..plans import explain, plan_catalog
from ..schemes import parse_scheme
from . import positive_int

NAME = "explain"
HELP = "show which kernel a layer gets, and why every other candidate was rejected"

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a checkpoint: plan every layer of it")
    p.add_argument(
        "--scheme", help="a scheme string (e.g. w4a16-int-g128-asym), or 'all' for the whole catalog"
    )
    p.add_argument("--shape", default="4096x4096", help="KxN: in_features x out_features (default 4096x4096)")
    p.add_argument(
        "--as",
        dest="preset",
        metavar="PRESET",
        help="plan for a preset or capabilities file instead of this machine (same as QUANTRT_CAPABILITIES)",
    )
    p.add_argument("--device", help="device to plan for (default: the first accelerator, else cpu)")
    p.add_argument(
        "--act-dtype",
        choices=sorted(DTYPES),
        help="activation dtype (default bf16; for a checkpoint, its torch_dtype)",
    )
    p.add_argument(
        "--order",
        action="store_true",
        help="print every device kind's kernel lists in dispatch order (the policy), and nothing else",
    )
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size (plan one rank)")
    p.add_argument("--parallel", choices=("column", "row"), help="how the layer is split under --tp")
    p.add_argument(
        "--experts",
        type=positive_int,
        default=1,
        help="plan a grouped MoE projection of this many experts (each KxN) instead of a linear layer",
    )


def parse_shape(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--shape {text!r}: expected KxN, e.g. 4096x14336") from None
    if k <= 0 or n <= 0:
        raise ConfigError(f"--shape {text!r}: K and N must be positive")
    return k, n


def handle(args: argparse.Namespace) -> int:
    from . import emit

    if args.order:
        return _explain_order(args)
    K, N = parse_shape(args.shape)
    ov = Overrides.from_env()
    if args.preset:
        ov = Overrides(ov.backend, ov.kernel, ov.kernel_by_scheme, ov.disabled, args.preset, ov.fallback)
    from ..dispatch import planning_capabilities

    caps = load_capabilities(args.preset) if args.preset else planning_capabilities(ov)
    if args.tp > 1 and args.parallel is None:
        raise ConfigError("--tp > 1 needs --parallel column or row")
    act = DTYPES[args.act_dtype or "bf16"]
    if args.path:
        return _explain_checkpoint(args, caps, ov)
    if not args.scheme:
        raise ConfigError("give a checkpoint PATH or --scheme S")
    if args.scheme == "all":
        dev = args.device or caps.default_device.torch_device
        table = plan_catalog(caps, dev, K, N, act)
        if args.json:
            emit({"capabilities": caps.origin, "device": dev, "K": K, "N": N, "plans": table})
        else:
            print(f"plans for {K}x{N} on {dev} [{caps.origin}]")
            width = max(len(s) for s in table)
            for s, k in table.items():
                print(f"  {s:<{width}}  {k}")
        return 0
    scheme = parse_scheme(args.scheme)
    ov_quiet = Overrides(ov.backend, ov.kernel, ov.kernel_by_scheme, ov.disabled, ov.capabilities, "allow")
    sel = explain(
        scheme,
        K,
        N,
        device=args.device,
        caps=caps,
        act_dtype=act,
        overrides=ov_quiet,
        tp_size=args.tp,
        parallel=args.parallel,
        num_experts=args.experts,
    )
    if args.json:
        emit(sel.to_json())
    else:
        print(sel.explain())
        if ov.fallback == "strict" and sel.fallback:
            print("QUANTRT_FALLBACK=strict: loading this layer would fail", file=sys.stderr)
    return 0


def _explain_order(args: argparse.Namespace) -> int:
    """Each device kind's registered lists, top to bottom: the order dispatch tries kernels in."""
    from ..capability import kinds
    from ..kernels import registry
    from . import emit

    reg = registry()
    doc = {
        kind: [
            *({"kernel": k.name, "backend": lst.backend} for lst in reg.order(kind) for k in lst.kernels),
            {"kernel": reg.fallback.name, "backend": "reference"},
        ]
        for kind in dict.fromkeys([*kinds(), *reg.kinds()])
    }
    if args.json:
        emit({"order": doc, "load_errors": reg.load_errors})
        return 0
    for kind, rows in doc.items():
        print(f"{kind}: tried top to bottom, the first that supports a layer runs it")
        for i, row in enumerate(rows, 1):
            print(f"  {i:>2}. {row['kernel']:<28} ({row['backend']})")
    for name, err in reg.load_errors.items():
        print(f"backend {name} failed to load: {err}", file=sys.stderr)
    return 0


def _explain_checkpoint(args: argparse.Namespace, caps: Any, ov: Overrides) -> int:
    from ..checkpoint import open_checkpoint
    from ..dispatch import REJECTED, select
    from ..plans import experts_specs, layer_spec
    from . import emit

    ckpt = open_checkpoint(args.path)
    act = DTYPES[args.act_dtype] if args.act_dtype else ckpt.default_act_dtype
    dev = args.device or caps.default_device.torch_device
    quiet = Overrides(ov.backend, ov.kernel, ov.kernel_by_scheme, ov.disabled, ov.capabilities, "allow")
    rows, cases = [], {}
    grouped = ckpt.expert_prefixes()
    for prefix, x in ckpt.experts.items():
        if not x.quantized:
            rows.append(
                {"layer": f"{prefix} ({x.num_experts} experts)", "scheme": None, "kind": "experts",
                 "kernel": "transformers' experts (unquantized)", "label": "dense"}
            )  # fmt: skip
            continue
        for proj, spec in experts_specs(x, act_dtype=act, tp_size=args.tp).items():
            sel = select(spec, dev, caps, quiet)
            cases.setdefault((str(spec.scheme), spec.K, spec.N, spec.num_experts), sel)
            rows.append(
                {
                    "layer": f"{prefix} {proj} ({x.num_experts} experts)",
                    "kind": "experts",
                    "scheme": str(spec.scheme),
                    "K": spec.K,
                    "N": spec.N,
                    "experts": spec.num_experts,
                    "kernel": sel.kernel.name,
                    "label": sel.label,
                    "fallback": sel.fallback,
                    "candidates": [c.to_json() for c in sel.candidates],
                }
            )
    for prefix, e in ckpt.layers.items():
        if prefix in grouped:
            continue
        if not e.quantized:
            rows.append(
                {"layer": prefix, "scheme": None, "kernel": "torch F.linear (unquantized)", "label": "dense"}
            )
            continue
        sel = select(
            layer_spec(e.scheme, e.K, e.N, act_dtype=act, tp_size=args.tp, parallel=args.parallel),
            dev,
            caps,
            quiet,
        )
        cases.setdefault((str(e.scheme), e.K, e.N, 1), sel)
        rows.append(
            {
                "layer": prefix,
                "scheme": str(e.scheme),
                "K": e.K,
                "N": e.N,
                "kernel": sel.kernel.name,
                "label": sel.label,
                "fallback": sel.fallback,
                "candidates": [c.to_json() for c in sel.candidates],
            }
        )
    if args.json:
        emit(
            {
                "path": str(ckpt.path),
                "format": ckpt.format,
                "capabilities": caps.origin,
                "device": dev,
                "act_dtype": str(act).replace("torch.", ""),
                "layers": rows,
            }
        )
        return 0
    d = caps.device(dev)
    print(
        f"{ckpt.path} [{ckpt.format}] on {dev} {d.name} ({d.arch}) [{caps.origin}], activations "
        f"{str(act).replace('torch.', '')}"
    )
    width = max((len(r["layer"]) for r in rows), default=5)
    for r in rows:
        print(f"  {r['layer']:<{width}}  {r['scheme'] or 'dense':<26} -> {r['kernel']} ({r['label']})")
    for (scheme, k, n, experts), sel in cases.items():
        # kernels for the other op (linear vs grouped) say so in --json; the text keeps real reasons
        rejected = [
            c for c in sel.candidates if c.status == REJECTED and not c.verdict.predicate.startswith("op in")
        ]
        if rejected:
            print(f"why not, for {scheme} K={k} N={n}" + (f" x {experts} experts:" if experts > 1 else ":"))
            for c in rejected:
                print(f"  {c.name}: {c.verdict.reason}")
    return 0
