#!/usr/bin/env bash
# On a GPU machine without network access (the lent H200): install quantrt from this tree,
# record the probe, run the GPU tests and the embedded default, and leave everything in $OUT.
# Usage (device tool): bash ci/gpu.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
status=0
( cd /tmp && quantrt probe --json ) > "$OUT/probe.json" 2> "$OUT/probe.err" || status=1
( cd /tmp && quantrt probe ) || status=1
python3 -m quantrt.capability.record "$OUT/record" > /dev/null 2>&1 || status=1
tar -C "$OUT" -czf "$OUT/record.tgz" record 2>/dev/null && rm -rf "$OUT/record"
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
( cd /tmp && quantrt run --device cuda --json ) > "$OUT/run-default.json" 2> "$OUT/run-default.err" || status=1
( cd /tmp && quantrt run --device cuda ) 2>/dev/null | tail -n 30
echo "gpu.sh status=$status"
exit $status
