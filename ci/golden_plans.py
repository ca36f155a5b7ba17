"""Write or check the golden plan files: the kernel every catalog scheme gets on every preset.

python ci/golden_plans.py            # print differences, exit 1 if any
python ci/golden_plans.py --write    # rewrite tests/golden/plans/*.json (review the diff!)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quantrt.capability import load_preset, preset_names
from quantrt.plans import plan_catalog

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "plans"


def current(preset: str) -> dict[str, object]:
    caps = load_preset(preset)
    dev = caps.default_device
    return {
        "preset": preset,
        "device": f"{dev.torch_device} {dev.name} ({dev.arch})",
        "shape": "4096x4096",
        "act_dtype": "bf16",
        "plans": plan_catalog(caps, dev.torch_device),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    diffs = 0
    for preset in preset_names():
        doc = current(preset)
        path = GOLDEN / f"{preset}.json"
        if args.write:
            path.write_text(json.dumps(doc, indent=2) + "\n")
            continue
        old = json.loads(path.read_text()) if path.exists() else {"plans": {}}
        for scheme, kernel in doc["plans"].items():  # type: ignore[union-attr]
            if old["plans"].get(scheme) != kernel:
                diffs += 1
                print(f"{preset}: {scheme}: golden {old['plans'].get(scheme)!r}, now {kernel!r}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
