"""The tokenizer of a checkpoint, through transformers: the folder's tokenizer files, or for a GGUF
file the vocabulary in its metadata (``tokenizer.ggml.*``), converted as transformers converts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.files import regular_file
from ..errors import CheckpointError

#: files transformers builds a tokenizer from (any one is enough)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json", "spiece.model")
#: the largest real tokenizer.json files (256k-token vocabularies with merges) are tens of MB
MAX_TOKENIZER_BYTES = 512 * 2**20


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer for a checkpoint folder or ``.gguf`` file; one clear error when it has none."""
    from transformers import AutoTokenizer

    p = Path(path)
    if p.suffix == ".gguf":
        from ..checkpoint.gguf_file import GGUFFile

        meta = GGUFFile(p).metadata
        model = meta.get("tokenizer.ggml.model")
        if not meta.get("tokenizer.ggml.tokens") or model in (None, "none"):
            raise CheckpointError(
                f"{p}: no tokenizer in the file (tokenizer.ggml.model is {model!r}, "
                f"{len(meta.get('tokenizer.ggml.tokens') or [])} tokens); pass token ids instead of text"
            )
        try:
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        except Exception as e:  # transformers raises many types for a vocabulary it cannot convert
            raise CheckpointError(
                f"{p}: transformers cannot build a tokenizer from its metadata: {e}"
            ) from None
    folder = p if p.is_dir() else p.parent
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise CheckpointError(
            f"{folder}: no tokenizer files (looked for {', '.join(TOKENIZER_FILES)}); pass token ids instead "
            "of text"
        )
    for name in TOKENIZER_FILES:  # transformers reads these whole: a FIFO or /dev/zero never ends
        f = folder / name
        if f.exists() and regular_file(f) > MAX_TOKENIZER_BYTES:
            raise CheckpointError(
                f"{f}: {f.stat().st_size} bytes; a tokenizer file may hold at most {MAX_TOKENIZER_BYTES}"
            )
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise CheckpointError(f"{folder}: transformers cannot load its tokenizer: {e}") from None
