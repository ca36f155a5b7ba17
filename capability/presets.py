"""Named capability sets of common machines, and loading QUANTRT_CAPABILITIES=<preset|file.json>.

A preset is a complete ``Capabilities`` JSON in ``presets/<name>.json``: the GPU (or CPU) with a
realistic host CPU, the libraries such a machine typically has, and the torch ops a torch >= 2.11
build registers for that device. They let ``explain``/``select`` plan for hardware not present.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .types import Capabilities, CapabilityError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def _preset_dir() -> Traversable:
    return resources.files(__package__).joinpath("presets")


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.name[: -len(".json")] for p in _preset_dir().iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> Capabilities:
    """The preset ``name`` (``h200``, ``mi300x``, ``spr-amx``...); CapabilityError lists the known ones."""
    names = preset_names()
    if name not in names:
        raise CapabilityError(f"unknown capability preset {name!r}; known presets: {', '.join(names)}")
    text = _preset_dir().joinpath(f"{name}.json").read_text(encoding="utf-8")
    return _parse(text, f"preset {name}")


def load_capabilities(spec: str) -> Capabilities:
    """Capabilities from a preset name or a JSON file path (as written by ``json.dumps(caps.to_json())``).

    Every problem is one CapabilityError naming the preset or file and what was wrong.
    """
    text = spec.strip()
    if not text:
        raise CapabilityError(
            f"empty capability spec; give a preset ({', '.join(preset_names())}) or a .json file"
        )
    names = preset_names()
    if text in names:
        return load_preset(text)
    if not (text.endswith(".json") or "/" in text or "\\" in text or Path(text).exists()):
        raise CapabilityError(
            f"{text!r} is neither a capability preset nor a .json file; known presets: {', '.join(names)}"
        )
    path = Path(text).expanduser()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise CapabilityError(f"capability file {path} {what}")
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CapabilityError(f"capability file {path} cannot be read: {e}") from e
    caps = _parse(content, f"capability file {path}")
    return dataclasses.replace(caps, origin=f"file:{path}")


def _parse(text: str, what: str) -> Capabilities:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CapabilityError(f"{what} is not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from e
    try:
        return Capabilities.from_json(data)
    except CapabilityError as e:
        raise CapabilityError(f"{what}: {e}") from e
