"""Reading back what a writer test compares (shared by the writer tests)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def stored_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, by name."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out
