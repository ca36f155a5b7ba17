"""Merge a ci/tune_wna16_mma.py sweep of one code (the bitsandbytes code book, a GGUF type, int4's
mid-size buckets) into the committed table as that code's own launch rows (``small_m_bnb4`` by
default, or the key given). Only the swept buckets are written: at lookup they rule M from the
smallest swept bucket to the largest, and the base key's rows the rest
(``backends/cuda/mma_wna16.py`` ``over_base``), so no row is copied from the base.

    python3 ci/codebook_rows.py SWEEP.json backends/cuda/tunings/wna16_mma_sm_90.json [KEY]
"""

from __future__ import annotations

import json
import sys


def main(sweep_path: str, table_path: str, key: str = "small_m_bnb4") -> None:
    sweep = json.load(open(sweep_path))
    table = json.load(open(table_path))
    rows = [r for r in sweep["small_m"] if not r.get("dense")]
    if not rows:
        sys.exit(f"{sweep_path}: no fused row beat dequant + cuBLAS in the swept buckets; nothing to merge")
    table[key] = sorted(rows, key=lambda r: r["max_m"])
    table["_note_" + key.removeprefix("small_m_")] = f"{key}: {sweep.get('_note', sweep_path)}"
    with open(table_path, "w") as f:
        f.write(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table[key]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
