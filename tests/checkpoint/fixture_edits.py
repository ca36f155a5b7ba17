"""Editing copies of the interop fixtures (files written by the real tools) to plant one defect:
shared by the bad-input, config-schema and hostile-value tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantrt.checkpoint import open_checkpoint

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
DOWN = "model.layers.0.mlp.down_proj"


def copy(tmp_path: Path, variant: str) -> Path:
    """A private copy of one fixture folder."""
    dst = tmp_path / variant
    shutil.copytree(ROOT / variant, dst)
    return dst


def edit_config(d: Path, fn: Callable[[dict], None], name: str = "config.json") -> None:
    """``fn`` edits the quantization config (config.json's section, or a side file whole)."""
    cfg = json.loads((d / name).read_text())
    fn(cfg.get("quantization_config", cfg) if name == "config.json" else cfg)
    (d / name).write_text(json.dumps(cfg))


def edit_tensors(
    d: Path,
    fn: Callable[[dict[str, torch.Tensor]], None],
    metadata: Callable[[dict[str, str]], dict[str, str]] | None = None,
) -> None:
    """``fn`` edits model.safetensors' tensors in place; the file is written back with its
    metadata (edited by ``metadata`` when given: torchao keeps its tensor layouts there)."""
    path = d / "model.safetensors"
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata=metadata(meta) if metadata else meta)


def load_everything(d: Path) -> None:
    """Open the checkpoint and dequantize every quantized layer (what loading reads)."""
    ck = open_checkpoint(d)
    for _, qw in ck.weights():
        qw.dequantize()
