#!/usr/bin/env bash
# On the GPU machine: sweep the W4A16 Triton tiles per M bucket and write $OUT/w4a16_<arch>.json
# (commit it to backends/cuda/tunings/). Nothing autotunes at run time; this is where tiles come from.
set -uo pipefail
# shellcheck source=ci/gpu-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-install.sh" || exit 1
arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
python3 ci/tune_w4a16.py "$OUT/w4a16_${arch}.json" --budget "${QUANTRT_TUNE_BUDGET:-24}" 2> "$OUT/tune.log"
tail -n 12 "$OUT/tune.log"
cat "$OUT/w4a16_${arch}.json"
