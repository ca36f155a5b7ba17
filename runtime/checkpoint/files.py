"""Opening a checkpoint's files as untrusted input: regular files only, side files size-capped.

A path in a checkpoint (a shard named by the index, ``config.json``) may be a FIFO that blocks
forever, ``/dev/zero`` that never ends, a symlink out of the folder, or a huge file; every file
quantrt opens goes through here first, so each of those is one clear error before a byte is read.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

#: JSON side files (config.json, the safetensors index, quantize_config.json ...): the largest real
#: index (a weight_map of ~10^5 tensors) is a few MB; this cap leaves ample room
MAX_JSON_BYTES = 64 * 2**20


def regular_file(path: Path) -> int:
    """The size of ``path`` after checking it is a regular file (symlinks followed)."""
    try:
        st = path.stat()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise CheckpointError(f"{path}: expected a regular file, found {kind}")
    return st.st_size


def inside(directory: Path, name: str, what: str) -> Path:
    """``directory / name`` after checking it stays inside ``directory`` once every symlink is
    resolved (an index naming ``../../etc/passwd`` or a shard linked out of the folder is refused)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointError(f"{what}: expected a file name, found {name!r}")
    if os.path.isabs(name):
        raise CheckpointError(f"{what}: {name!r} is an absolute path; files must lie inside {directory}")
    path = directory / name
    root = directory.resolve()
    real = path.resolve()
    if real != root and root not in real.parents:
        raise CheckpointError(f"{what}: {name!r} resolves to {real}, outside the checkpoint folder {root}")
    return path


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse_json(raw: bytes, where: str) -> Any:
    """JSON from bytes, refusing duplicate keys (which json keeps silently, last one winning) and
    reporting every failure (bad UTF-8, bad syntax, nesting too deep, an integer too long) as one
    CheckpointError."""
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise CheckpointError(f"{where}: key {e.key!r} appears twice in one JSON object") from None
    except RecursionError:
        raise CheckpointError(f"{where}: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{where}: not valid JSON: {e}") from None


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON side file: a regular file of at most ``limit`` bytes, parsed by :func:`parse_json`."""
    size = regular_file(path)
    if size > limit:
        raise CheckpointError(f"{path}: {size} bytes; a JSON side file may hold at most {limit}")
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > limit:
        raise CheckpointError(f"{path}: grew past {limit} bytes while being read")
    return parse_json(raw, str(path))
