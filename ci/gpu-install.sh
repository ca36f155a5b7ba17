# Sourced by the scripts that run on the lent GPU machine (ci/gpu.sh, ci/gpu_rows.sh, ci/gpu_tune.sh):
# the repository root as the working directory, $OUT created, unbuffered Python, the wheels the
# image lacks (from ci/gpu-wheels.sh, carried in .whl/) on PYTHONPATH, and quantrt installed from
# this tree. Returns non-zero (the log printed) where an install fails.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
cd "$ROOT" || return 1
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$OUT/wheels.log" 2>&1 || { cat "$OUT/wheels.log"; return 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; return 1; }
