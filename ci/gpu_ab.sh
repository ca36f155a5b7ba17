#!/usr/bin/env bash
# A/B benchmark of two trees on one GPU machine in one session (the lent H200 has no network):
# the old tree (a folder holding its runtime/, backends/, capability/ and pyproject.toml, e.g. from
# `git archive OLD runtime backends capability pyproject.toml README.md | tar -x -C .before`, carried)
# and this tree are installed side by side, and `quantrt bench --quick` runs alternately on each,
# ROUNDS times, into $OUT/{before,after}-<round>.json; bench/compare_ab.py then says, cell by cell,
# whether the new tree is slower than noise.
# Usage (device tool, carry [".whl", ".before"]): bash ci/gpu_ab.sh .before
# Environment: QUANTRT_BENCH_SCHEMES, QUANTRT_BENCH_SHAPES, QUANTRT_BENCH_MS, ROUNDS (default 1).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out}"
OLD="$(cd "${1:?usage: ci/gpu_ab.sh OLD_TREE}" && pwd)"
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 || { cat "$OUT/wheels.log"; exit 1; }
fi
for side in before after; do
  src="$ROOT"; [ "$side" = before ] && src="$OLD"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "/tmp/ab-$side" "$src" \
    > "$OUT/install-$side.log" 2>&1 || { cat "$OUT/install-$side.log"; exit 1; }
done
schemes="${QUANTRT_BENCH_SCHEMES:-w4a16-int-g128-asym,w8a16-int-ch-sym,w8a8-fp8-ch,w8a8-int-ch-sym,w4a16-nvfp4,w4a16-nf4-g64,gguf-q4_k,gguf-q6_k,gguf-q8_0}"
args=(--quick --schemes "$schemes")
[ -n "${QUANTRT_BENCH_SHAPES:-}" ] && args+=(--shapes "$QUANTRT_BENCH_SHAPES")
[ -n "${QUANTRT_BENCH_MS:-}" ] && args+=(--ms "$QUANTRT_BENCH_MS")
status=0
for round in $(seq 1 "${ROUNDS:-1}"); do
  for side in before after; do
    ( cd /tmp && PYTHONPATH="/tmp/ab-$side:/tmp/site" python3 -m quantrt bench "${args[@]}" \
        --out "$OUT/$side-$round.json" ) > /dev/null 2> "$OUT/bench-$side-$round.err" \
      || { tail -n 5 "$OUT/bench-$side-$round.err"; status=1; }
  done
done
python3 bench/compare_ab.py --before "$OUT"/before-*.json --after "$OUT"/after-*.json \
  --out "$OUT/ab.json" --markdown "$OUT/ab.md" | tail -n 1
echo "gpu_ab.sh status=$status"
exit $status
