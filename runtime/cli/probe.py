"""Report what this machine can do: CPU ISA features, GPUs and their matrix units, the
libraries and torch quantized ops kernels rely on."""

from __future__ import annotations

import argparse
import os
import time

from ..capability import Capabilities, DeviceCaps, load_capabilities, probe

NAME = "probe"
HELP = "report this machine's CPU, GPUs, matrix units, libraries and torch quantized ops"

CPU_KEY_FEATURES = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "neon",
    "sve",
    "sve2",
    "i8mm",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--as",
        dest="preset",
        metavar="PRESET",
        help="show a preset or capabilities file instead of probing this machine",
    )


def handle(args: argparse.Namespace) -> int:
    from . import emit

    override = os.environ.get("QUANTRT_CAPABILITIES", "").strip()
    if override and not args.preset:
        from ..dispatch import planning_capabilities
        from ..env import Overrides

        planning_capabilities(Overrides(capabilities=override))  # refused here as in explain
    t0 = time.perf_counter()
    caps = load_capabilities(args.preset) if args.preset else probe()
    elapsed = time.perf_counter() - t0
    if args.json:
        doc = caps.to_json()
        doc["probe_seconds"] = round(elapsed, 3)  # one of PROBE_REPORT_KEYS: loading it back drops it
        emit(doc)
        return 0
    print(render(caps))
    if override and not args.preset:
        print(f"note     QUANTRT_CAPABILITIES={override} is set: plans use it, execution uses this machine")
    return 0


def _yes(dev: DeviceCaps, *names: str) -> str:
    return " ".join(f"{n}:{'yes' if n in dev.features or n in dev.matrix_types else 'no'}" for n in names)


def render(caps: Capabilities) -> str:
    """Human-readable capabilities."""
    cpu = caps.cpu
    lines = [f"capabilities  {caps.origin}  (torch {caps.torch_version})"]
    lines.append(
        f"cpu      {cpu.name} [{cpu.vendor}, {cpu.arch}, {cpu.microarch}], {cpu.cores or '?'} logical cores"
    )
    feats = [f for f in CPU_KEY_FEATURES if f in cpu.features]
    lines.append(f"         key ISA features: {' '.join(feats) or 'none found'}")
    lines.append(
        f"         {_yes(cpu, 'avx512f', 'avx512bw', 'avx512_vnni', 'avx512_bf16', 'amx_bf16', 'amx_int8')}"
    )
    lines.append(f"         matrix types: {' '.join(sorted(cpu.matrix_types)) or 'none'}")
    lines.append(f"         torch ops: {' '.join(sorted(cpu.torch_ops)) or 'none'}")
    if not caps.accelerators:
        lines.append("gpu      none found")
    for d in caps.accelerators:
        mem = f"{d.memory_bytes / 2**30:.0f} GiB" if d.memory_bytes else "? GiB"
        lines.append(
            f"{d.torch_device:<8} {d.name} [{d.vendor}, {d.arch}], {mem}"
            + (f", {d.cores} compute units" if d.cores else "")
            + ("" if d.runnable else "  (torch here cannot run on it)")
        )
        fp8 = any(t.startswith("fp8") for t in d.matrix_types)
        fp4 = any(t in ("fp4_e2m1", "mxfp4") for t in d.matrix_types)
        lines.append(
            f"         fp8: {'yes' if fp8 else 'no'}  fp4: {'yes' if fp4 else 'no'}  "
            f"matrix types: {' '.join(sorted(d.matrix_types))}"
        )
        if d.features:
            lines.append(f"         features: {' '.join(sorted(d.features))}")
        lines.append(f"         torch ops: {' '.join(sorted(d.torch_ops)) or 'none'}")
    libs = ", ".join(f"{k} {v}".strip() for k, v in sorted(caps.libraries.items()))
    lines.append(f"libs     {libs or 'none of the optional kernel libraries'}")
    lines.extend(f"note     {n}" for n in caps.notes)
    return "\n".join(lines)
