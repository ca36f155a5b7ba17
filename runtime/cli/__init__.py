"""The ``quantrt`` command: probe, inspect, explain, run. Every command takes ``--json``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="quantrt", description="Quantized LLM kernels: probe, explain, run."
    )
    parser.add_argument("--version", action="version", version=f"quantrt {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log dispatch decisions (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import bench, explain, inspect, probe, run

    for mod in (probe, inspect, explain, run, bench):
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.__doc__)
        p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
        mod.add_arguments(p)
        p.set_defaults(handler=mod.handle)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    level = logging.WARNING if args.verbose == 0 else (logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    from ..capability import CapabilityError
    from ..errors import QuantrtError

    try:
        return int(args.handler(args) or 0)
    except (QuantrtError, CapabilityError) as e:
        if args.json:
            emit({"error": type(e).__name__, "message": str(e)})
        print(f"quantrt {args.command}: error: {e}", file=sys.stderr)
        return 1


def emit(obj: Any) -> None:
    """Write one JSON document to stdout."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
