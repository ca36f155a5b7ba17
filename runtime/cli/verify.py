"""Check every kernel that can run here against the fp32 reference: every catalog scheme it implements,
each activation dtype, awkward shapes, strided inputs, out=, bias, NaN and Inf, determinism,
torch.compile and (on CUDA) graph capture. Exit 0 when every case passes, 1 when a check fails.
The run seed is printed: --seed replays a failure exactly (docs/conformance.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

NAME = "verify"
HELP = "run the conformance kit: every kernel here against the reference"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="check only this backend's kernels (e.g. cpu, cuda, reference, acme)")
    p.add_argument("--kernel", help="check only this kernel (e.g. cpu.native_wint)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="the quick case set: the first and last scheme of each scheme family per kernel",
    )
    p.add_argument("--seed", type=int, help="run seed (default: a fresh one, printed)")
    p.add_argument("--scheme", action="append", help="check only these schemes (repeat, or comma-separate)")


def handle(args: argparse.Namespace) -> int:
    from ..kernels import registry
    from ..schemes import parse_scheme
    from ..testing.conformance import FAILED, SKIPPED, load_errors, new_seed, plan, run
    from . import EXIT_OK, EXIT_REFUSED, emit

    schemes = [parse_scheme(s) for arg in args.scheme or () for s in arg.split(",") if s.strip()] or None
    seed = new_seed() if args.seed is None else args.seed
    cases = plan(args.backend, args.kernel, quick=args.quick, schemes=schemes)
    print(
        f"quantrt verify: {len(cases)} cases, seed {seed}{' (quick)' if args.quick else ''}", file=sys.stderr
    )
    bar = _progress(len(cases))
    failures: list[str] = []

    def progress(r: Any) -> None:
        if r.status == FAILED:
            failures.append(r.failure_text())
        if bar is not None:
            bar.set_postfix_str(r.case.kernel.name, refresh=False)
            bar.update(1)

    report = run(cases, seed, quick=args.quick, progress=progress)
    report.load_errors = load_errors(registry(), args.backend, args.kernel)
    if bar is not None:
        bar.close()
    if args.json:
        emit(report.to_json())
        return EXIT_OK if report.ok else EXIT_REFUSED
    rows = report.summary()
    width = max([len("kernel"), *(len(r["kernel"]) for r in rows)])
    dwidth = max([len("device"), *(len(r["device"]) for r in rows)])
    print(f"{'kernel':<{width}}  {'device':<{dwidth}}  passed  failed  skipped")
    for r in rows:
        print(
            f"{r['kernel']:<{width}}  {r['device']:<{dwidth}}  {r['passed']:>6}  {r[FAILED]:>6}  {r[SKIPPED]:>7}"
        )
    total = {k: sum(r[k] for r in rows) for k in ("passed", FAILED, SKIPPED)}
    print(
        f"{len(report.results)} cases: {total['passed']} passed, {total[FAILED]} failed, "
        f"{total[SKIPPED]} skipped (seed {seed})"
    )
    for name, err in report.load_errors.items():
        print(f"backend {name} failed to load: {err}", file=sys.stderr)
    for text in failures:
        print(text, file=sys.stderr)
    if not report.ok:
        print(f"quantrt verify: FAILED; replay with --seed {seed}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_REFUSED


def _progress(total: int) -> Any:
    """A tqdm bar on stderr (tqdm is optional: without it, no bar)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True, leave=False)
