"""Merge a ci/tune_wna16_mma.py sweep of the bitsandbytes code-book kernel into the committed
table as its own launch rows (``small_m_bnb4``): the swept buckets' rows, then the table's
integer rows for the larger buckets.

    python3 ci/codebook_rows.py SWEEP.json backends/cuda/tunings/wna16_mma_sm_90.json
"""

from __future__ import annotations

import json
import sys


def main(sweep_path: str, table_path: str) -> None:
    sweep = json.load(open(sweep_path))
    table = json.load(open(table_path))
    rows = [r for r in sweep["small_m"] if not r.get("dense")]
    top = max(r["max_m"] for r in rows)
    rows += [r for r in table["small_m"] if r["max_m"] > top]
    table["small_m_bnb4"] = rows
    table["_note_bnb4"] = f"small_m_bnb4: {sweep.get('_note', sweep_path)}"
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main(*sys.argv[1:3])
