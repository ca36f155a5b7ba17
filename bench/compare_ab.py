"""Compare benchmark runs of two trees cell by cell: is any cell of the new tree slower than noise?

Takes ``quantrt bench`` JSON files (GPU or ``--device cpu``) of the old tree (``--before``) and of
the new tree (``--after``), ideally from rounds alternated in one session. Per cell (scheme, K, N,
M) and timed column it reports the medians, the ratio after/before, and the noise of that cell:
the spread of the same cell's baseline column (cuBLAS bf16 / dense bf16, code neither tree owns)
between the two sides, and of quantrt's own time across the rounds of one side. A cell is
``slower`` when its ratio exceeds 1 + max(--floor, 2 x noise).

    python bench/compare_ab.py --before b1.json b2.json --after a1.json a2.json --out ab.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

#: timed columns of quantrt per kind of run, and the baseline column that measures the noise
COLUMNS = {
    "gpu": (("quantrt_us", "quantrt_graph_us"), "cublas_bf16_us"),
    "cpu": (("quantrt_ms",), "dense_bf16_ms"),
}


def _load(paths: list[str]) -> tuple[str, list[dict[str, Any]]]:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    kind = "cpu" if any("quantrt_ms" in r for d in docs for r in d["rows"]) else "gpu"
    return kind, docs


def _cells(docs: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for d in docs:
        for r in d["rows"]:
            out.setdefault((r["scheme"], r["K"], r["N"], r["M"]), []).append(r)
    return out


def _spread(values: list[float]) -> float:
    """Relative spread of repeated timings (0 for one value)."""
    v = [x for x in values if x and math.isfinite(x)]
    return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else 0.0


def compare(before: list[str], after: list[str], floor: float) -> dict[str, Any]:
    kind, bdocs = _load(before)
    _, adocs = _load(after)
    cols, base = COLUMNS[kind]
    b, a = _cells(bdocs), _cells(adocs)
    rows = []
    for key in sorted(set(b) & set(a)):
        for col in cols:
            bv = [r[col] for r in b[key] if r.get(col)]
            av = [r[col] for r in a[key] if r.get(col)]
            if not bv or not av:
                continue
            bm, am = statistics.median(bv), statistics.median(av)
            bb = [r[base] for r in b[key] if r.get(base)]
            ab = [r[base] for r in a[key] if r.get(base)]
            base_noise = abs(statistics.median(ab) / statistics.median(bb) - 1) if bb and ab else 0.0
            noise = max(base_noise, _spread(bv), _spread(av))
            ratio = am / bm
            rows.append(
                {
                    "scheme": key[0],
                    "K": key[1],
                    "N": key[2],
                    "M": key[3],
                    "column": col,
                    "kernel": a[key][0].get("kernel"),
                    "before": round(bm, 4),
                    "after": round(am, 4),
                    "ratio": round(ratio, 4),
                    "noise": round(noise, 4),
                    "slower": ratio > 1 + max(floor, 2 * noise),
                }
            )
    ratios = [r["ratio"] for r in rows]
    return {
        "kind": kind,
        "before": before,
        "after": after,
        "floor": floor,
        "cells": len(rows),
        "slower": [r for r in rows if r["slower"]],
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "rows": rows,
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "| scheme | KxN | M | column | kernel | before | after | after/before | noise | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["rows"]:
        verdict = "**slower**" if r["slower"] else "same"
        lines.append(
            f"| {r['scheme']} | {r['K']}x{r['N']} | {r['M']} | {r['column']} | {r['kernel']} | {r['before']} | "
            f"{r['after']} | {r['ratio']:.3f} | {r['noise']:.3f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--floor", type=float, default=0.05, help="smallest slowdown ever called real (0.05)")
    ap.add_argument("--out", help="write the comparison JSON here")
    ap.add_argument("--markdown", help="write the table here")
    args = ap.parse_args()
    doc = compare(args.before, args.after, args.floor)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    table = markdown(doc)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(table)
    lo, hi = doc["ratio_range"] or (None, None)
    print(
        f"{doc['cells']} cells, after/before {lo}-{hi} (median {doc['ratio_median']}), slower: {len(doc['slower'])}"
    )


if __name__ == "__main__":
    main()
