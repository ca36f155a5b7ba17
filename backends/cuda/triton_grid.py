"""NVIDIA's grid dependency control for Triton kernels launched back to back: the signal and the
wait of programmatic dependent launch (sm_90+), as ``decode_kv(grid_sync=GRID_SYNC)`` of
``backends/triton/kv.py`` takes them.

The decode grid signals at its start that the split combine may launch; the combine, launched with
``launch_pdl``, has its programs resident before the decode ends and waits in ``griddepcontrol.wait``
until the decode grid has finished and its stores are visible. What that saves is the gap between
the two launches (the second kernel's launch latency), which at batch 1 is a visible part of a
decode step (docs/performance.md).
"""

from __future__ import annotations

import triton
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def launch_dependents():
    """Let the next grid (launched with ``launch_pdl``) start launching."""
    gdc_launch_dependents()


@triton.jit
def wait_for_primary():
    """Wait until the grid before this one has ended and its memory is visible."""
    gdc_wait()


GRID_SYNC = (launch_dependents, wait_for_primary)
