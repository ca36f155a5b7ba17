"""Merge a ci/tune_wna16_mma.py sweep of one non-integer code (the bitsandbytes code book, GGUF
q4_k) into the committed table as that code's own launch rows (``small_m_bnb4`` by default, or
the key given): the swept buckets' rows, then the table's integer rows (``small_m``, or the base
key given: ``small_m_w8`` for 8-bit codes) for the larger buckets.

    python3 ci/codebook_rows.py SWEEP.json backends/cuda/tunings/wna16_mma_sm_90.json [KEY [BASE]]
"""

from __future__ import annotations

import json
import sys


def main(sweep_path: str, table_path: str, key: str = "small_m_bnb4", base: str = "small_m") -> None:
    sweep = json.load(open(sweep_path))
    table = json.load(open(table_path))
    rows = [r for r in sweep["small_m"] if not r.get("dense")]
    top = max(r["max_m"] for r in rows)
    rows += [r for r in table[base] if r["max_m"] > top]
    table[key] = rows
    table["_note_" + key.removeprefix("small_m_")] = f"{key}: {sweep.get('_note', sweep_path)}"
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main(*sys.argv[1:5])
