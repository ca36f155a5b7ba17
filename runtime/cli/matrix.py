"""The support matrix: the kernel every catalog scheme gets on each of several presets (one per
vendor and architecture class by default), planned from the kernel registry without any hardware,
with the reason the reference runs where no native kernel does. The README's table is this
command's ``--markdown`` output (``python ci/support_matrix.py`` writes it)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import torch

from ..capability import load_capabilities
from ..errors import ConfigError
from ..plans import NO_NATIVE, plan_catalog
from . import positive_int

NAME = "matrix"
HELP = "print the support matrix: the kernel each catalog scheme gets on each preset"

#: one preset per vendor and architecture class: Hopper, Blackwell, Ampere, CDNA3, CDNA4, Ponte
#: Vecchio, Arc, a Xeon with AMX, a Zen 4 with AVX-512, a Zen 3 with AVX2 only, a Graviton 3 (Arm)
DEFAULT_PRESETS = (
    "h100",
    "b200",
    "a100",
    "mi300x",
    "mi355x",
    "pvc",
    "arc",
    "spr-amx",
    "zen4",
    "zen3",
    "graviton3",
)

#: how a labelled plan (``kernel (label)`` in ``plan_catalog``) is marked in the tables
SHORT_LABELS = {"weight-only substitute": "substitute"}

#: the layer dimensions a verdict names when a kernel refuses a shape rather than a scheme
SHAPE_KEYS = frozenset({"K", "N", "K_part", "N_part"})


@dataclasses.dataclass(frozen=True)
class Why:
    """The most telling rejection behind a reference cell: which kernel said no, and why."""

    kernel: str
    reason: str


@dataclasses.dataclass(frozen=True)
class SupportMatrix:
    """``plan_catalog`` for each preset, and the reason behind each of its reference cells."""

    K: int
    N: int
    #: preset -> scheme -> ``plan_catalog``'s string, in catalog order
    plans: dict[str, dict[str, str]]
    #: preset -> the device planned for ("cuda:0 NVIDIA H100 80GB HBM3 (sm_90)")
    devices: dict[str, str]
    #: preset -> scheme -> why no native kernel runs it (reference cells only)
    why: dict[str, dict[str, Why]]
    #: backends that failed to load: their kernels are missing from every cell
    load_errors: dict[str, str]

    def counts(self) -> dict[str, dict[str, int]]:
        """Per preset: plans not on the reference (``native``, as the golden-plan floors count
        them: substitutes and emulated kernels included), of which labelled ones, and the rest."""
        out: dict[str, dict[str, int]] = {}
        for preset, table in self.plans.items():
            labels = [_split(v)[1] for v in table.values()]
            out[preset] = {
                "native": sum(v != NO_NATIVE for v in table.values()),
                "total": len(table),
                "substitute": labels.count("weight-only substitute"),
                "emulated": labels.count("emulated"),
                "reference": sum(v == NO_NATIVE for v in table.values()),
            }
        return out

    def to_json(self) -> dict[str, Any]:
        """The document ``quantrt matrix --json`` prints."""
        return {
            "K": self.K,
            "N": self.N,
            "act_dtype": "bf16",
            "devices": self.devices,
            "presets": self.plans,
            "counts": self.counts(),
            "reference_reasons": {
                p: {s: dataclasses.asdict(w) for s, w in rows.items()} for p, rows in self.why.items()
            },
            "load_errors": self.load_errors,
        }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--presets",
        default=",".join(DEFAULT_PRESETS),
        help=f"comma-separated presets or capability files, one column each (default: {','.join(DEFAULT_PRESETS)})",
    )
    p.add_argument("--markdown", action="store_true", help="print a GitHub Markdown table (the README's)")
    p.add_argument(
        "--k", type=positive_int, default=4096, help="in_features of the planned layer (default 4096)"
    )
    p.add_argument(
        "--n", type=positive_int, default=4096, help="out_features of the planned layer (default 4096)"
    )


def handle(args: argparse.Namespace) -> int:
    from . import emit

    if args.json and args.markdown:
        raise ConfigError("--json and --markdown: give one of them")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    if not presets:
        raise ConfigError(f"--presets {args.presets!r}: name at least one preset, e.g. h100,mi300x")
    matrix = build(presets, args.k, args.n)
    if args.json:
        emit(matrix.to_json())
    else:
        print(render_markdown(matrix) if args.markdown else render_text(matrix))
    for name, err in matrix.load_errors.items():
        print(
            f"quantrt matrix: backend {name} failed to load, its kernels are missing: {err}", file=sys.stderr
        )
    return 0


def build(presets: Sequence[str], K: int = 4096, N: int = 4096) -> SupportMatrix:
    """Plan the catalog on each preset's default device, as ``explain --scheme all --as P`` does,
    and find the reason behind every reference cell (a CapabilityError for an unknown preset)."""
    from ..kernels import registry

    plans: dict[str, dict[str, str]] = {}
    devices: dict[str, str] = {}
    why: dict[str, dict[str, Why]] = {}
    for preset in dict.fromkeys(presets):
        caps = load_capabilities(preset)
        dev = caps.default_device
        plans[preset] = plan_catalog(caps, dev.torch_device, K, N, torch.bfloat16)
        devices[preset] = f"{dev.torch_device} {dev.name} ({dev.arch})"
        why[preset] = {
            s: _why_reference(caps, dev.torch_device, s, K, N)
            for s, kernel in plans[preset].items()
            if kernel == NO_NATIVE
        }
    return SupportMatrix(K, N, plans, devices, why, dict(registry().load_errors))


def _why_reference(caps: Any, device: str, scheme: str, K: int, N: int) -> Why:
    """The most telling rejection among the native candidates dispatch tried, judged by what its
    verdict looked at, in this order: a kernel that refuses the scheme's quantized activations (it
    takes weight-only layers); one that refuses the layer's shape (it took the scheme); one that
    refuses the weights' width, symmetry or grouping; a hardware or library requirement; a kernel
    for another weight format. Among equals the most specific verdict (fewest values), then the
    first in dispatch order. Kernels for the other op (grouped vs linear) say nothing here."""
    from ..dispatch import REJECTED, select
    from ..env import Overrides
    from ..plans import layer_spec
    from ..schemes import Scheme

    fields = {f.name for f in dataclasses.fields(Scheme)}
    weight_detail = fields - {"weight", "gguf_type", "act", "act_granularity", "act_dynamic", "act_group"}
    ov = Overrides(capabilities=caps.origin, fallback="allow")
    sel = select(layer_spec(scheme, K, N, act_dtype=torch.bfloat16), device, caps, ov)

    def rank(values: Any) -> int:
        keys = set(values)
        if values.get("act") is not None:
            return 0
        if keys & SHAPE_KEYS and "weight" not in keys:
            return 1
        if keys & weight_detail:
            return 2
        return 3 if not keys & fields else 4

    rejected = [
        (rank(c.verdict.values), len(c.verdict.values), i, c)
        for i, c in enumerate(sel.candidates)
        if c.status == REJECTED and c.backend != "reference" and not c.verdict.predicate.startswith("op in")
    ]
    if not rejected:
        return Why("", f"no {sel.device.kind} kernel is registered")
    best = min(rejected, key=lambda r: r[:3])[3]
    return Why(best.name, best.verdict.reason)


def _split(plan: str) -> tuple[str, str]:
    """``plan_catalog``'s ``"kernel (label)"`` as (kernel, label); the reference as ("reference", "")."""
    if plan == NO_NATIVE:
        return "reference", ""
    kernel, _, label = plan.partition(" (")
    return kernel, label.removesuffix(")")


def _notes(matrix: SupportMatrix) -> dict[str, tuple[int, dict[str, list[str]]]]:
    """Reason -> (footnote number, kernel -> presets it was rejected on), numbered in table order."""
    notes: dict[str, tuple[int, dict[str, list[str]]]] = {}
    schemes = next(iter(matrix.plans.values()), {})
    for scheme in schemes:
        for preset, rows in matrix.why.items():
            w = rows.get(scheme)
            if w is None:
                continue
            kernels = notes.setdefault(w.reason, (len(notes) + 1, {}))[1]
            presets = kernels.setdefault(w.kernel, [])
            if preset not in presets:
                presets.append(preset)
    return notes


def _cells(matrix: SupportMatrix, code: str) -> tuple[list[str], list[list[str]], list[str]]:
    """The header, one row per scheme and the summary row, with kernel names quoted by ``code``."""
    notes = _notes(matrix)
    header = ["scheme", *matrix.plans]
    schemes = list(next(iter(matrix.plans.values()), {}))
    rows = []
    for scheme in schemes:
        row = [scheme]
        for preset, table in matrix.plans.items():
            kernel, label = _split(table[scheme])
            if table[scheme] == NO_NATIVE:
                row.append(f"reference [{notes[matrix.why[preset][scheme].reason][0]}]")
            else:
                mark = f" ({SHORT_LABELS.get(label, label)})" if label else ""
                row.append(f"{code}{kernel}{code}{mark}")
        rows.append(row)
    summary = ["native"]
    for c in matrix.counts().values():
        extra = [f"{c[k]} {k}" for k in ("substitute", "emulated") if c[k]]
        summary.append(f"{c['native']}/{c['total']}" + (f" ({', '.join(extra)})" if extra else ""))
    return header, rows, summary


def _footnotes(matrix: SupportMatrix, code: str) -> list[str]:
    lines = []
    for reason, (number, kernels) in _notes(matrix).items():
        who = "; ".join(
            f"{code}{k}{code} on {', '.join(p)}" if k else ", ".join(p) for k, p in kernels.items()
        )
        lines.append(f"[{number}] {who}: {reason}")
    return lines


def render_text(matrix: SupportMatrix) -> str:
    """An aligned table for a terminal, with the summary row and the footnotes under it."""
    header, rows, summary = _cells(matrix, "")
    table = [header, *rows, summary]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = [
        f"kernel per catalog scheme, {matrix.K}x{matrix.N} with bf16 activations "
        "(native = not the reference, substitutes included)"
    ]
    for r in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    lines.append("why the reference runs (the closest native kernel's verdict):")
    lines += [f"  {f}" for f in _footnotes(matrix, "")]
    return "\n".join(lines)


def render_markdown(matrix: SupportMatrix) -> str:
    """A GitHub table: a kernel per cell, the devices planned for, and the footnotes."""
    header, rows, summary = _cells(matrix, "`")
    esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    lines = [
        "| " + " | ".join(esc[0]) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(r) + " |" for r in esc[1:]),
        "| " + " | ".join(f"**{c}**" for c in summary) + " |",
        "",
        f"Planned for a {matrix.K}x{matrix.N} linear layer with bf16 activations on "
        + "; ".join(f"{p}: {d}" for p, d in matrix.devices.items())
        + ". **native** counts every scheme not left to the reference; (substitute): the scheme's "
        "weights run with 16-bit activations, labelled as such in plans.",
        "",
        "Why the reference runs (the closest native kernel's verdict):",
        "",
        *(f"- {f}" for f in _footnotes(matrix, "`")),
    ]
    return "\n".join(lines)
