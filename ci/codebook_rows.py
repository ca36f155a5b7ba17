"""Merge a ci/tune_wna16_mma.py sweep of one code (the bitsandbytes code book, a GGUF type, int4's
mid-size buckets) into the committed table as that code's own launch rows (``small_m_bnb4`` by
default, or the key given), bucket by bucket: each swept bucket takes the sweep's row (a ``dense``
row where dequant + cuBLAS won it: the fused rows end there), the key's other buckets stay. Nothing is copied from the
base: at lookup the base's rows serve the buckets the key lacks (``backends/cuda/mma_wna16.py``
``over_base``).

    python3 ci/codebook_rows.py SWEEP.json backends/cuda/tunings/wna16_mma_sm_90.json [KEY]
"""

from __future__ import annotations

import json
import sys


def main(sweep_path: str, table_path: str, key: str = "small_m_bnb4") -> None:
    sweep = json.load(open(sweep_path))
    table = json.load(open(table_path))
    swept = {r["max_m"] for r in sweep["small_m"]}
    rows = [r for r in table.get(key, []) if r["max_m"] not in swept]
    rows += sweep["small_m"]
    table[key] = sorted(rows, key=lambda r: r["max_m"])
    note = "_note_" + key.removeprefix("small_m_")
    table[note] = "; ".join(n for n in (table.get(note), f"{key}: {sweep.get('_note', sweep_path)}") if n)
    with open(table_path, "w") as f:
        f.write(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table[key]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
