"""``quantrt inspect`` and ``quantrt explain`` on every checkpoint fixture (every format)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrt.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PATHS = sorted(str(p) for p in (FIX / "interop").iterdir() if (p / "meta.json").exists())
PATHS += sorted(str(p) for p in (FIX / "gguf").glob("*.gguf"))
REFUSED = {"torchao-int4-tilepacked-g128": "float zero-points"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("path", PATHS, ids=lambda p: Path(p).name)
def test_inspect_and_explain(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = Path(path).name
    code, out = run(capsys, "inspect", path, "--json")
    doc = json.loads(out)
    if name in REFUSED:
        assert code == 1 and REFUSED[name] in doc["message"]
        return
    assert code == 0 and doc["quantized_layers"] > 0 and doc["format"] != "dense"
    assert all(r["bytes"] > 0 for r in doc["layers"])
    code, out = run(capsys, "explain", path, "--as", "h100", "--json")
    plan = json.loads(out)
    # an MoE layer is planned as one row per projection (gate_up or gate and up, down), not per expert
    experts = sum(m["experts"] * (2 if m["stored"] == "gate_up" else 3) for m in doc["moe_layers"])
    planned = sum(1 for r in plan["layers"] if r.get("kind") == "experts")
    want = (
        len(doc["layers"])
        - experts
        + sum(2 if m["schemes"]["gate"] == m["schemes"]["up"] else 3 for m in doc["moe_layers"])
    )
    assert code == 0 and len(plan["layers"]) == want and planned == want - len(doc["layers"]) + experts
    for row in plan["layers"]:
        assert row["kernel"]
        if row.get("candidates"):
            assert row["candidates"][-1]["kernel"] == "reference"
