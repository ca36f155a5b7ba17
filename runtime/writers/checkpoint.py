"""``quantrt quantize SRC DST``: a dense checkpoint quantized and written in a format other tools read.

The source is read the way ``from_pretrained(quantize=...)`` reads it (``formats/online.py``: the
same layer choice, overrides and skips), one layer at a time; each quantized layer's canonical
weight (``quantrt.reference.quantize``: round to nearest) goes through the format's writer, every
other tensor is copied as stored, and shards are written as they fill, so host memory stays one
shard plus one layer. ``config.json`` gets the format's ``quantization_config``; the folder's
other small files (tokenizer, generation config) are copied.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..formats.online import OnlineQuantization
from . import awq, compressed_tensors, fp8, gptq

#: format name -> writer module (``why_not``, ``layer_tensors``, ``quantization_config``)
WRITERS: dict[str, Any] = {"compressed-tensors": compressed_tensors, "gptq": gptq, "awq": awq, "fp8": fp8}
#: bytes per written shard
SHARD_BYTES = 2 << 30
#: side files copied beside the weights, at most this large each
SIDE_FILE_BYTES = 64 << 20


class _Shards:
    """Tensors gathered into safetensors shards of about SHARD_BYTES, written as they fill."""

    def __init__(self, dst: Path) -> None:
        self.dst, self.buf, self.size, self.files, self.weight_map = dst, {}, 0, 0, {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.buf[name] = t.detach().to("cpu").contiguous()
        self.size += t.numel() * t.element_size()
        if self.size >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.buf:
            return
        file = f"model-{self.files + 1:05d}.safetensors"
        save_file(self.buf, str(self.dst / file), metadata={"format": "pt"})
        self.weight_map.update(dict.fromkeys(self.buf, file))
        self.buf, self.size, self.files = {}, 0, self.files + 1

    def finish(self) -> None:
        self.flush()
        total = self.files
        renamed = {}
        for i in range(total):  # transformers' names: model-0000i-of-0000n.safetensors
            old = self.dst / f"model-{i + 1:05d}.safetensors"
            new = old.with_name(f"model-{i + 1:05d}-of-{total:05d}.safetensors")
            old.rename(new)
            renamed[old.name] = new.name
        index = {"metadata": {}, "weight_map": {k: renamed[v] for k, v in sorted(self.weight_map.items())}}
        (self.dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def relative_error(approx: torch.Tensor, w: torch.Tensor) -> float:
    """||approx - w||_F / ||w||_F in fp32 (0 for an all-zero w that is kept exactly)."""
    w = w.float()
    ref = float(w.norm())
    diff = float((approx.float() - w).norm())
    return diff / ref if ref else diff


def write_quantized(
    src: str | Path,
    dst: str | Path,
    quantize: str | OnlineQuantization,
    fmt: str = "compressed-tensors",
    *,
    device: str | torch.device = "cpu",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Quantize the dense checkpoint ``src`` and write it to the new folder ``dst`` in ``fmt``;
    returns a summary (layers quantized per scheme, layers kept dense, bytes written)."""
    from ..checkpoint import open_checkpoint
    from ..formats.online import online_quantization
    from ..reference import dequantize

    writer = WRITERS.get(fmt)
    if writer is None:
        raise CheckpointError(f"format {fmt!r}: quantrt writes {', '.join(WRITERS)}")
    spec = online_quantization(quantize)
    src, dst = Path(src), Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise CheckpointError(f"{dst}: the destination exists and is not empty")
    ckpt = open_checkpoint(src, quantization=spec)
    if ckpt.directory == src and not (src / "config.json").exists():
        raise CheckpointError(f"{src}: a config.json is needed beside the weights to write a checkpoint")
    layers = ckpt.layers
    quantized = {p: e for p, e in layers.items() if e.quantized}
    for p, e in quantized.items():
        why = writer.why_not(e.scheme)
        if why:
            raise CheckpointError(f"{p}: {fmt}: {why}")
    dense = sorted(p for p, e in layers.items() if not e.quantized and e.kind == "linear")
    config_doc = writer.quantization_config({p: e.scheme for p, e in quantized.items()}, dense)
    dst.mkdir(parents=True, exist_ok=True)
    shards = _Shards(dst)
    written: set[str] = set()
    names = ckpt.index.names()
    errors: dict[str, float] = {}
    for i, (p, e) in enumerate(quantized.items()):
        w = ckpt.read(e)["weight"].to(device)
        try:
            canonical = e.adapter.to_canonical({"weight": w}, e.scheme, e.N, e.K, (e.N,))
        except CheckpointError as err:
            raise CheckpointError(f"{ckpt.index.where(e.tensors['weight'])}: {err}") from None
        errors[p] = relative_error(dequantize(canonical), w)
        for name, t in writer.layer_tensors(p, canonical).items():
            shards.add(name, t)
        if e.bias is not None:
            shards.add(e.bias, ckpt.index.read(e.bias))
        written.update(e.stored_names())
        if progress is not None:
            progress(i + 1, len(quantized))
    for name in names:
        if name not in written:
            shards.add(name, ckpt.index.read(name))
    shards.finish()
    config = json.loads((ckpt.directory / "config.json").read_text())
    config["quantization_config"] = config_doc  # made before any write: a refusal leaves nothing
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in sorted(ckpt.directory.iterdir()):
        keep = f.is_file() and not f.is_symlink() and f.suffix != ".safetensors"
        if (
            keep
            and f.name not in ("config.json", "model.safetensors.index.json")
            and f.stat().st_size <= SIDE_FILE_BYTES
        ):
            shutil.copyfile(f, dst / f.name)
    schemes: dict[str, int] = {}
    for e in quantized.values():
        schemes[e.scheme.name] = schemes.get(e.scheme.name, 0) + 1
    return {
        "source": str(src),
        "destination": str(dst),
        "format": fmt,
        "layers": schemes,
        "dense_linear_layers": dense,
        "search": spec.search,
        # ||W - dequantize(quantize(W))||_F / ||W||_F per layer, in the order written
        "relative_error": {p: round(v, 6) for p, v in errors.items()},
        "bytes_written": sum(f.stat().st_size for f in dst.glob("*.safetensors")),
        "source_bytes": sum(f.path.stat().st_size for f in ckpt.files) if hasattr(ckpt, "files") else None,
    }
