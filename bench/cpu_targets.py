"""Check a ``quantrt bench --device cpu`` result against the CPU issue's targets, cell by cell.

    python bench/cpu_targets.py bench/results/cpu-<date>.json [--json]

Targets (ratios are dense bf16 ``F.linear`` time over quantrt's, same run): int4 g128 >= 4.5x at
M=1 and >= 0.9x at M=64; int8 weight-only >= 2.5x and >= 0.9x; NF4, NVFP4, MXFP4 >= 3.0x at M=1;
fp8 weight-only >= 2.0x; the 4-bit code books and fp8 >= 0.8x at M=64; every prepared weight within
1.10x of its stored bytes. Exit status 1 when a cell misses.
"""

from __future__ import annotations

import argparse
import json
import sys

#: scheme -> (minimum at M=1, minimum at M=64)
TARGETS = {
    "w4a16-int-g128-sym": (4.5, 0.9),
    "w4a16-int-g128-asym": (4.5, 0.9),
    "w8a16-int-ch-sym": (2.5, 0.9),
    "w4a16-nf4-g64": (3.0, 0.8),
    "w4a16-nvfp4": (3.0, 0.8),
    "w4a16-mxfp4": (3.0, 0.8),
    "w8a16-fp8-ch": (2.0, 0.8),
}
MEMORY = 1.10


def check(doc: dict) -> list[dict]:
    """One entry per target cell: what was asked, what was measured, whether it holds."""
    out = []
    for r in doc["rows"]:
        want = TARGETS.get(r["scheme"])
        if want is None or r["M"] not in (1, 64):
            continue
        need = want[0] if r["M"] == 1 else want[1]
        out.append({"cell": f"{r['scheme']} {r['K']}x{r['N']} M={r['M']}", "need": need,
                    "got": r["vs_dense_bf16"], "ok": r["vs_dense_bf16"] >= need})  # fmt: skip
    for ld in doc["load"]:
        out.append({"cell": f"{ld['scheme']} {ld['K']}x{ld['N']} memory", "need": MEMORY,
                    "got": ld["prepared_vs_stored"], "ok": ld["prepared_vs_stored"] <= MEMORY})  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--json", action="store_true", help="print the cells as JSON")
    args = ap.parse_args()
    with open(args.result) as f:
        cells = check(json.load(f))
    missed = [c for c in cells if not c["ok"]]
    if args.json:
        print(json.dumps({"cells": cells, "missed": len(missed)}, indent=1))
    else:
        for c in cells:
            print(f"{'ok  ' if c['ok'] else 'MISS'} {c['cell']}: {c['got']} (target {c['need']})")
        print(f"{len(cells) - len(missed)} of {len(cells)} cells meet their target")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
