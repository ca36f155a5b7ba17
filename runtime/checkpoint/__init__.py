"""Checkpoints: validated safetensors files and ``open_checkpoint`` (imported lazily, because the
format readers use the file reader and the checkpoint uses the readers)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Checkpoint", "QuantizedWeight", "open_checkpoint"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("quantrt.checkpoint.checkpoint"), name)
    raise AttributeError(f"module 'quantrt.checkpoint' has no attribute {name!r}")
