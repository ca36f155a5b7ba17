"""The tuning table's per-code launch rows: a code's own key holds only the buckets swept for it,
and its base's rows serve the other buckets at lookup (``over_base``), so retuning the base reaches
every code that did not sweep that bucket and the committed table holds no copied rows."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from quantrt.backends.cuda.mma_codebook import CudaMmaBnb4, CudaMmaFp4
from quantrt.backends.cuda.mma_fp8 import fp8_rows
from quantrt.backends.cuda.mma_gguf import CudaMmaGGUF, CudaMmaGGUFBlocks, CudaMmaGGUFQ8
from quantrt.backends.cuda.mma_narrow import NARROW_BITS, CudaMmaNarrow
from quantrt.backends.cuda.mma_wna16 import int_rows, over_base

TUNINGS = Path(__file__).resolve().parents[2] / "backends" / "cuda" / "tunings"


def row(m: int, nt: int = 4, **kw: Any) -> dict[str, Any]:
    return {"max_m": m, "mt": 1, "nt": nt, "swap": m <= 8, **kw}


def test_own_rows_serve_their_buckets_and_the_base_the_rest() -> None:
    base = [row(1), row(8), row(16), row(32), row(64)]
    own = [row(1, 8, wn=2), row(16, 2, wn=4)]
    assert over_base({"k": own}, "k", base) == [own[0], base[1], own[1], base[3], base[4]]
    above = [row(128, 2, xr=64)]
    assert over_base({"k": above}, "k", base) == [*base, above[0]]
    assert over_base({"k": [*own, *above]}, "k", base) == [
        own[0],
        base[1],
        own[1],
        base[3],
        base[4],
        above[0],
    ]
    assert over_base({}, "k", base) == base
    assert over_base({"k": []}, "k", base) == base
    dense = {"max_m": 32, "dense": True}
    assert over_base({"k": [own[0], dense]}, "k", base) == [own[0], base[1], base[2]]
    assert over_base({}, "k", [*base, {"max_m": 128, "dense": True}]) == base


def test_a_sweep_merges_into_its_key_bucket_by_bucket(tmp_path: Path) -> None:
    """ci/codebook_rows.py: swept buckets replaced, the key's others kept, nothing of the base copied."""
    import subprocess
    import sys

    base = [row(1), row(8), row(16), row(32), row(64)]
    table = {"small_m": base, "small_m_q4k": [row(1, 2, wn=2), row(16, 2)]}
    sweep = {
        "small_m": [row(16, 8, stages=4), row(128, 2, xr=64), {"max_m": 256, "dense": True}],
        "_note": "n",
    }
    tp, sp = tmp_path / "t.json", tmp_path / "s.json"
    tp.write_text(json.dumps(table))
    sp.write_text(json.dumps(sweep))
    tool = Path(__file__).resolve().parents[2] / "ci" / "codebook_rows.py"
    subprocess.run(
        [sys.executable, str(tool), str(sp), str(tp), "small_m_q4k"], check=True, capture_output=True
    )
    merged = json.loads(tp.read_text())
    assert merged["small_m"] == base
    assert merged["small_m_q4k"] == [table["small_m_q4k"][0], *sweep["small_m"]]
    assert [r["max_m"] for r in over_base(merged, "small_m_q4k", base)] == [1, 8, 16, 32, 64, 128]


def test_a_base_retune_reaches_every_code_that_did_not_sweep_the_bucket() -> None:
    table = json.loads((TUNINGS / "wna16_mma_sm_90.json").read_text())
    new32 = row(32, 8, wn=1, stages=4, fold=False, warps_per_sm=24)
    retuned = copy.deepcopy(table)
    retuned["small_m"] = [new32 if r["max_m"] == 32 else r for r in retuned["small_m"]]
    for rows in ROWS.values():
        before, after = rows(table), rows(retuned)
        m32 = [r for r in after if r["max_m"] == 32]
        assert len(m32) == 1 and m32[0]["stages"] == 4 and m32[0]["warps_per_sm"] == 24
        assert [r for r in before if r["max_m"] != 32] == [r for r in after if r["max_m"] != 32]


ROWS = {
    "int4": lambda t: int_rows(t, 4),
    "int8": lambda t: int_rows(t, 8),
    **{f"int{b}": CudaMmaNarrow.rows_for(b) for b in NARROW_BITS},
    "fp8": fp8_rows,
    "fp4": CudaMmaFp4.tile_rows,
    "bnb4": CudaMmaBnb4.tile_rows,
    "q4_k": CudaMmaGGUF.tile_rows,
    "q8_0": CudaMmaGGUFQ8.tile_rows,
    **{t: CudaMmaGGUFBlocks.rows_for(t) for t in CudaMmaGGUFBlocks.CODES},
}


@pytest.mark.parametrize("name", sorted(p.name for p in TUNINGS.glob("wna16_mma_*.json")))
def test_committed_keys_hold_no_copies_and_resolve_one_row_per_bucket(name: str) -> None:
    table = json.loads((TUNINGS / name).read_text())
    bases = {"small_m_q80": "small_m_w8", "small_m_bnb4": "small_m_codebook"}
    for key, rows in table.items():
        if not key.startswith("small_m_"):
            continue
        ms = [r["max_m"] for r in rows]
        assert ms == sorted(set(ms)), f"{name} {key}: buckets {ms}"
        base = table.get(bases.get(key, "small_m"), table["small_m"])
        # int8's sweep found int4's shape best at M=16: a swept row, kept should small_m's change
        copied = [r for r in rows if r in base and (key, r["max_m"]) != ("small_m_w8", 16)]
        assert not copied, f"{name} {key}: rows copied from its base: {copied}"
    for code, rows_of in ROWS.items():
        ms = [r["max_m"] for r in rows_of(table)]
        assert ms and ms == sorted(set(ms)), f"{name} {code}: buckets {ms}"
