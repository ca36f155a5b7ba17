"""Write or check the README's support matrix: the kernel every catalog scheme gets on one preset
per vendor and architecture class, planned from the kernel registry (``quantrt matrix --markdown``),
so that the table cannot drift from the code. Runs offline: presets only, no hardware.

python ci/support_matrix.py          # rewrite the table between the markers in README.md
python ci/support_matrix.py --check  # exit 1 if README.md's table is stale (tests/core runs this)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from quantrt.cli.matrix import DEFAULT_PRESETS, build, render_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- support-matrix:begin -->"
END = "<!-- support-matrix:end -->"


def generate() -> tuple[str, dict[str, str]]:
    """The table as the README holds it (without the markers), and the backends that failed to
    load (a matrix without their kernels must not be written)."""
    matrix = build(DEFAULT_PRESETS)
    return render_markdown(matrix), matrix.load_errors


def splice(text: str, table: str) -> str:
    """``text`` with everything between the marker lines replaced by ``table``; a ValueError when
    the markers are missing, repeated or out of order, so that nothing else is overwritten."""
    lines = text.split("\n")
    begins = [i for i, ln in enumerate(lines) if ln.strip() == BEGIN]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        raise ValueError(f"expected one {BEGIN!r} line followed by one {END!r} line")
    return "\n".join([*lines[: begins[0] + 1], "", table, "", *lines[ends[0] :]])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's matrix is stale")
    ap.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    table, load_errors = generate()
    for name, err in load_errors.items():
        print(f"backend {name} failed to load: {err}", file=sys.stderr)
    if load_errors:
        print("refusing to use a matrix without those backends' kernels", file=sys.stderr)
        return 1
    old = args.readme.read_text(encoding="utf-8")
    try:
        new = splice(old, table)
    except ValueError as e:
        print(f"{args.readme}: {e}", file=sys.stderr)
        return 1
    if new == old:
        return 0
    if args.check:
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), "README.md", "README.md (generated)", lineterm="", n=0
        )
        print("\n".join(diff))
        print(
            f"{args.readme.name}: the support matrix is stale (the kernel registry changed); "
            "run python ci/support_matrix.py and commit the result",
            file=sys.stderr,
        )
        return 1
    args.readme.write_text(new, encoding="utf-8")
    print(f"wrote the support matrix into {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
