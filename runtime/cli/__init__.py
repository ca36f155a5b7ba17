"""The ``quantrt`` command: probe, inspect, explain, matrix, run, quantize. Every command takes ``--json``.

Exit codes, so that scripts can tell a refusal from a bug: 0 ok; 1 refused input (a quantrt
error: bad option value, unknown preset, checkpoint it cannot read, a check that failed); 2 usage
(argparse); 3 internal error (an unexpected exception: a bug to report); 130 interrupted (Ctrl-C);
141 (128 + SIGPIPE, what a shell reports for ``cat`` or ``yes`` in the same place) when the reader
of stdout went away, as in ``quantrt probe | head -1``, with nothing printed on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from .. import __version__

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; never lets a traceback out except under ``-vv`` for an internal error."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the exit flush does not fail again (Python's docs, 'Note on
    SIGPIPE')."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _verbose_parent() -> argparse.ArgumentParser:
    """``-v`` for each subcommand, counted apart so that ``quantrt -v explain X -v`` is ``-vv``."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-v",
        "--verbose",
        dest="verbose_after",
        action="count",
        default=0,
        help="log dispatch decisions (-vv: debug, and a traceback for an internal error)",
    )
    return p


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="quantrt",
        description="Quantized LLM kernels: probe, explain, run.",
        epilog="exit codes: 0 ok, 1 refused input, 2 usage, 3 internal error (please report it), "
        "130 interrupted, 141 stdout closed early",
    )
    parser.add_argument("--version", action="version", version=f"quantrt {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log dispatch decisions (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import bench, explain, inspect, matrix, probe, quantize, run, verify

    verbose = _verbose_parent()
    for mod in (probe, inspect, explain, matrix, run, quantize, bench, verify):
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.__doc__, parents=[verbose])
        p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
        mod.add_arguments(p)
        p.set_defaults(handler=mod.handle)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    verbosity = args.verbose + args.verbose_after
    level = logging.WARNING if verbosity == 0 else (logging.INFO if verbosity == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    from ..capability import CapabilityError
    from ..errors import QuantrtError

    try:
        return int(args.handler(args) or 0)
    except (QuantrtError, CapabilityError) as e:
        if args.json:
            emit({"error": type(e).__name__, "kind": "refused", "message": str(e)})
        print(f"quantrt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except BrokenPipeError:
        raise
    except Exception as e:
        message = " ".join(str(e).split())
        if args.json:
            emit({"error": type(e).__name__, "kind": "internal", "message": message})
        print(
            f"quantrt {args.command}: internal error ({type(e).__name__}: {message}), please report it",
            file=sys.stderr,
        )
        if verbosity >= 2:
            traceback.print_exc(file=sys.stderr)
        return EXIT_INTERNAL


def positive_ints(text: str) -> list[int]:
    """An argparse ``type`` for comma-separated batch sizes: 0 or a negative M is a usage error
    (exit 2) before any work starts, not a crash or an empty run later."""
    values: list[int] = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected comma-separated positive integers, e.g. 1,16"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, found {value}")
        values.append(value)
    return values


def positive_int(text: str) -> int:
    """An argparse ``type`` for a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive integer")
    return value


def emit(obj: Any) -> None:
    """Write one JSON document to stdout."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
